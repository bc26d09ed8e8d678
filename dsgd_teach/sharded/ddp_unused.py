"""Which parameters took part in a DDP step: the ones that got a gradient, and the ones a forward did not use.

A parameter that gets no gradient would leave its bucket waiting forever. As in PyTorch's DDP, that is an error
naming it unless find_unused_parameters=True: then each forward walks the autograd graph from its output, the
parameters it cannot reach count as ready with a zero gradient, and a parameter no rank used keeps the gradient
it had before the step.
"""

from __future__ import annotations

from typing import Any

import torch

from .zero_units import output_tensors


def reached_parameters(output: Any) -> set[int]:
    """ids of the leaf tensors (parameters) the autograd graph of output reaches."""
    roots = [t.grad_fn for t in output_tensors(output) if t.grad_fn is not None]
    seen, reached = set(), set()
    while roots:
        node = roots.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: the leaf it accumulates into
        if variable is not None:
            reached.add(id(variable))
        roots.extend(n for n, _ in node.next_functions)
    return reached


class ParameterUse:
    """Per step: which parameters got a gradient, and which were skipped (unused), with the gradient each had."""

    def __init__(self, names: list[str], params: list[torch.Tensor]) -> None:
        self.names, self.params = names, params
        self.reset()

    def reset(self) -> None:
        """Forget the step: nothing used, nothing skipped."""
        self.used = [False] * len(self.params)
        self.skipped: dict[int, torch.Tensor | None] = {}

    def got_gradient(self, i: int) -> None:
        if i not in self.skipped:
            self.used[i] = True

    def not_reached(self, output: Any) -> list[int]:
        """Parameters output's graph does not reach that have not yet been used or skipped this step."""
        reached = reached_parameters(output)
        return [i for i, p in enumerate(self.params)
                if id(p) not in reached and not self.used[i] and i not in self.skipped]

    def skip(self, i: int) -> None:
        """Count parameter i as unused this step, keeping the gradient it had."""
        grad = self.params[i].grad
        self.skipped[i] = None if grad is None else grad.detach().clone()

    def missing(self) -> list[int]:
        """Parameters that got no gradient and were not skipped."""
        return [i for i in range(len(self.params)) if not self.used[i] and i not in self.skipped]

    def contributes(self, i: int) -> bool:
        """Whether this rank adds parameter i's gradient to the sum (otherwise it adds zeros)."""
        return i not in self.skipped and (self.params[i].grad is not None or self.used[i])

    def refuse_skipped_gradient(self, i: int) -> None:
        """A parameter the forward found unused must not then get a gradient (its bucket may have left)."""
        if i in self.skipped:
            raise RuntimeError(f"OverlappedDDP: {self.names[i]} was found unused after forward but then got a gradient; "
                               "with find_unused_parameters=True run one forward per backward, and compute the loss "
                               "from the forward's output")

    def refuse_missing(self, rank: int) -> None:
        """A ValueError naming the parameters that got no gradient on this rank."""
        missing = [self.names[i] for i in self.missing()]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ValueError(
                f"OverlappedDDP: parameter(s) {shown} got no gradient on rank {rank} (not used to compute "
                "the loss), so their buckets would never be averaged; pass find_unused_parameters=True, or freeze "
                "them with requires_grad_(False)")

    def counts(self, device: torch.device) -> torch.Tensor:
        """1.0 for each parameter used on this rank, else 0.0 (summed over ranks: how many used it)."""
        return torch.tensor([float(u) for u in self.used], device=device)

    def restore_unused_everywhere(self, ranks_using: torch.Tensor, views: dict[int, torch.Tensor]) -> None:
        """A parameter no rank used keeps the gradient it had before the step, as in PyTorch's DDP."""
        for i, before in self.skipped.items():
            if ranks_using[i] == 0:
                if before is None:
                    self.params[i].grad = None
                else:
                    views[i].copy_(before)
