"""Starting clusters: a connected dask client for whatever the course is given, and the workers a run needs.

Its public face: the names below, each imported from its module on first use, so that importing one module of this
package (a grading kernel imports `ranks.thread_group` alone) does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy_face

if TYPE_CHECKING:
    from .cluster import start_client, worker_addresses
    from .workers import (
        capacity,
        get_workers,
        interleave_hosts,
        scalable_cluster,
    )

_FROM = {
    "start_client": "cluster",
    "worker_addresses": "cluster",
    "capacity": "workers",
    "get_workers": "workers",
    "interleave_hosts": "workers",
    "scalable_cluster": "workers",
}
__all__ = ["capacity", "get_workers", "interleave_hosts", "scalable_cluster", "start_client", "worker_addresses"]

__getattr__ = lazy_face(__name__, _FROM)
