"""Running ranks: one long task per rank on the workers, events streamed to the driver, stoppable, and a
torch.distributed group (or threads of one process) formed around the ranks and always torn down.

Its public face: the names below, each imported from its module on first use, so that importing one module of this
package (a grading kernel imports `ranks.thread_group` alone) does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy_face

if TYPE_CHECKING:
    from .comm import Comm
    from .group import GroupSpec, group_hosts, plan_group, process_group, run_in_group
    from .group_run import GroupRun, run_group
    from .live import RankInterrupted, WorkerContext, WorkerLost, run_live
    from .rounds import collect
    from .thread_group import run_threads

_FROM = {
    "Comm": "comm",
    "GroupSpec": "group",
    "group_hosts": "group",
    "plan_group": "group",
    "process_group": "group",
    "run_in_group": "group",
    "GroupRun": "group_run",
    "run_group": "group_run",
    "RankInterrupted": "live",
    "WorkerContext": "live",
    "WorkerLost": "live",
    "run_live": "live",
    "collect": "rounds",
    "run_threads": "thread_group",
}
__all__ = ["Comm", "GroupRun", "GroupSpec", "RankInterrupted", "WorkerContext", "WorkerLost", "collect", "group_hosts", "plan_group", "process_group", "run_group", "run_in_group", "run_live", "run_threads"]

__getattr__ = lazy_face(__name__, _FROM)
