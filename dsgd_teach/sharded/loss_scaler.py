"""fp16's dynamic loss scaling (Micikevicius et al. 2018, section 3.2), as ZeroAdam applies it."""

from __future__ import annotations


class LossScaler:
    """fp16's dynamic loss scaling (Micikevicius et al. 2018, section 3.2): halve and skip on overflow, else grow."""

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 100) -> None:
        self.scale, self.growth_interval, self.good_steps, self.skipped = scale, growth_interval, 0, 0

    def update(self, overflow: bool) -> None:
        """Halve the scale after an overflow; double it after growth_interval clean steps."""
        if overflow:
            self.scale, self.good_steps, self.skipped = self.scale / 2, 0, self.skipped + 1
        else:
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= 2
