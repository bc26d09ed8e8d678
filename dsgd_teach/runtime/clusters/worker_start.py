"""How the worker processes of a cluster the course starts come to life: forked from a server that imported torch.

dask starts each worker process afresh by default ("spawn"): every new process imports dask, numpy, pandas and
torch again, about 1.5 s of CPU per worker on 2 cores, on every cluster start, resize and chapter. With
multiprocessing's "forkserver", one server process imports them once (the first start of this kernel) and every
later worker is a fork of it: on 2 cores a later two-worker cluster starts and closes in 0.13 s instead of 1.6 s,
and the workers share the imported modules' memory pages with the server until they write to them (a full-mode
chapter's peak PSS fell by 56-233 MiB).

The server is multiprocessing's own helper: a child of this process that ends when this process does. It listens on
a socket in a pymp-* folder of the temporary directory, which multiprocessing removes when this process exits
normally; a Jupyter kernel that is shut down after starting processes is killed instead, leaving the folder behind.
So each start first removes such folders of earlier processes: ours, holding only a listener socket that no process
has bound (Linux lists the bound ones of each network namespace in /proc/PID/net/unix).

Set DSGD_WORKER_START=spawn to have dask start every worker afresh instead. Either way each worker loads
worker_close.py as a dask preload, so that it closes without a failed heartbeat.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import tempfile
from pathlib import Path

import dask

#: dask's setting for how a nanny starts its worker process.
METHOD_KEY = "distributed.worker.multiprocessing-method"
#: Modules the server imports once for every worker it forks: a dask worker's own, torch, and the course's
#: runtime that every experiment's tasks run in (one that cannot be imported is skipped by multiprocessing).
PRELOAD = ("distributed", "numpy", "pandas", "torch", "dsgd_teach.runtime.ranks.live")
#: dask's setting for modules each worker loads as it starts (their dask_setup and dask_teardown hooks run in it).
WORKER_PRELOAD_KEY = "distributed.worker.preload"
#: What each worker the course starts loads: a close that lets its last heartbeat finish first (worker_close.py).
WORKER_PRELOAD = "dsgd_teach.runtime.clusters.worker_close"


def start_method() -> str:
    """'forkserver' where this platform has it, unless DSGD_WORKER_START=spawn asks for fresh processes."""
    wanted = os.environ.get("DSGD_WORKER_START", "forkserver")
    if wanted not in ("forkserver", "spawn"):
        raise ValueError(f"DSGD_WORKER_START must be 'forkserver' or 'spawn', got {wanted!r}")
    return wanted if wanted in multiprocessing.get_all_start_methods() else "spawn"


def worker_start_settings() -> dict[str, object]:
    """The dask settings a nanny reads to start a worker: forkserver with torch preloaded, and the course's preload."""
    method = start_method()
    if method == "forkserver":
        remove_stale_server_folders()
        from distributed.utils import get_mp_context

        with dask.config.set({METHOD_KEY: method}):
            context = get_mp_context()  # dask sets its preload list on its first call: ours replaces it
        context.set_forkserver_preload(list(PRELOAD))
    preloads = dask.config.get(WORKER_PRELOAD_KEY, None) or []
    preloads = [preloads] if isinstance(preloads, str) else list(preloads)
    if WORKER_PRELOAD not in preloads:  # beside any preload the user configured
        preloads.append(WORKER_PRELOAD)
    return {METHOD_KEY: method, WORKER_PRELOAD_KEY: preloads}


def bound_socket_paths() -> set[str] | None:
    """The filesystem paths of the Unix sockets bound now in every network namespace this user's processes are in.

    /proc/net/unix lists only the reader's namespace; a process in another one (`ip netns exec`) may share this
    /tmp, so one process of each namespace is asked through its own /proc/PID/net/unix. None where /proc is absent.
    """
    try:
        tables = {os.readlink("/proc/self/ns/net"): "/proc/self/net/unix"}
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            tables.setdefault(os.readlink(f"/proc/{pid}/ns/net"), f"/proc/{pid}/net/unix")
        except OSError:  # gone, or another user's: its sockets are not in folders of ours
            continue
    paths: set[str] = set()
    for table in tables.values():
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        paths |= {fields[7] for fields in (line.split(maxsplit=7) for line in lines) if len(fields) == 8}
    return paths


def remove_stale_server_folders(temp_root: str | None = None) -> list[Path]:
    """Remove the pymp-* folders of ours that hold only a listener socket no process has bound; return them."""
    bound = bound_socket_paths()
    if bound is None:
        return []
    removed = []
    for folder in Path(temp_root or tempfile.gettempdir()).glob("pymp-*"):
        try:
            info = folder.lstat()
            entries = list(folder.iterdir()) if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() else []
            if len(entries) != 1 or not entries[0].name.startswith("listener-"):
                continue
            listener = entries[0].lstat()
            if not stat.S_ISSOCK(listener.st_mode) or listener.st_uid != os.getuid() or str(entries[0]) in bound:
                continue
            entries[0].unlink()
            folder.rmdir()
            removed.append(folder)
        except OSError:  # another process removed or filled it meanwhile: leave it
            continue
    return removed
