"""What one sandbox's cgroup saw (limits hit, peaks), in words for its submission's row; made by cgroups.Scope."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Usage:
    """What one sandbox's cgroup saw: limits it hit and its peak memory; `unenforced` says why there were none."""

    enforced: bool
    unenforced: str = ""
    memory_limit: int = 0
    memory_peak: int = 0
    oom_kills: int = 0
    memory_max_hits: int = 0
    pids_limit: int = 0
    pids_max_hits: int = 0
    socket_limit: int = 0
    socket_peak: int = 0
    notes: list[str] = field(default_factory=list)

    def hit(self) -> list[str]:
        """One short sentence per limit the sandbox ran into (empty when it stayed within them)."""
        out = []
        if self.oom_kills:
            out.append(f"the sandbox hit its memory limit of {self.memory_limit >> 20} MB (memory, memfd and /tmp "
                       f"files together) and the kernel's OOM killer ended {self.oom_kills} of its processes")
        elif self.memory_max_hits:
            out.append(f"the sandbox reached its memory limit of {self.memory_limit >> 20} MB")
        if self.pids_max_hits:
            out.append(f"the sandbox hit its limit of {self.pids_limit} processes and threads "
                       f"({self.pids_max_hits} refused)")
        if self.socket_limit and self.socket_peak >= self.socket_limit:
            out.append(f"the sandbox's sockets reached their buffer limit of {self.socket_limit >> 20} MB")
        return out
