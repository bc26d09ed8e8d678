"""The course on a dask-gateway: each student asks the department's gateway for a cluster of their own.

Where a gateway is configured (dask's `gateway.address`, e.g. the DASK_GATEWAY__ADDRESS that a JupyterHub with
dask-gateway exports in every student's server), start_client asks it for a new cluster instead of starting one:
one core per worker (the course's workers run one task at a time, as its LocalCluster's do) and the memory a worker
needs (memory.py's floor: a worker's imports plus working room, below dask's pause) where the gateway offers the
`worker_cores` and `worker_memory` options (memory in GiB, as in dask-gateway's documentation and the daskhub
chart). The cluster belongs to the client: chapters grow it with `scale`, and closing the client shuts it down.

A gateway may refuse what a chapter asks: a worker larger than its `worker_memory` option allows (WorkerMemoryError
before anything starts), more workers than its `cluster_max_workers` (GatewayLimitError instead of waiting for
workers that will never come), or more clusters than a student may hold (the gateway's own message, re-raised as
GatewayLimitError). DSGD_GATEWAY=off ignores a configured gateway (a LocalCluster in the student's own server).
"""

from __future__ import annotations

import asyncio
import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import dask

from ...memory import MiB, WorkerMemoryError, min_worker_limit, worker_baseline

GiB = 1024**3
#: The gateway options the course sets when the gateway offers them (dask-gateway's documented names).
CORES_OPTION, MEMORY_OPTION = "worker_cores", "worker_memory"
#: Seconds a new gateway cluster may take to have its workers join (each imports torch in a fresh process).
WORKERS_TIMEOUT_S = 180.0


class GatewayLimitError(ValueError):
    """The gateway refused a cluster or a size past a limit its administrator set."""


def gateway_settings() -> dict[str, Any]:
    """dask's `gateway` configuration, with DASK_GATEWAY__* variables set since dask was imported applied on top."""
    current = dict(dask.config.get("gateway", {}) or {})
    from_env = dask.config.collect_env().get("gateway", {})
    return dask.config.merge(current, from_env)


def gateway_address() -> str | None:
    """The configured gateway's address, or None (none configured, or DSGD_GATEWAY=off)."""
    if os.environ.get("DSGD_GATEWAY", "").lower() in ("off", "0", "no", "false"):
        return None
    address = gateway_settings().get("address") or None
    if address:
        guard_gateway_finalizers()
    return address


def _own_loop(obj: Any) -> Any:
    """The asyncio loop a dask-gateway Gateway or GatewayCluster waits on when it closes (None if it has none)."""
    gateway = getattr(obj, "gateway", obj)
    loop = getattr(gateway, "loop", None)
    return getattr(loop, "asyncio_loop", None)


def _closing_later(obj: Any) -> Any:
    """The coroutine that closes obj without waiting: a cluster's stop (its gateway's session too), a gateway's."""
    if hasattr(obj, "_stop_internal"):
        return obj._stop_internal() if getattr(obj, "status", "closed") != "closed" else None
    return obj._cleanup() if getattr(obj, "_session", None) is not None else None


def _not_on_its_own_loop(finalizer: Callable[[Any], None]) -> Callable[[Any], None]:
    """A __del__ that, run on the thread of the very loop the object's close waits on, schedules the close on that
    loop instead of waiting for it.

    dask-gateway's Gateway and GatewayCluster close themselves in __del__ by waiting on their event loop. The
    collector runs __del__ on whichever thread allocates at that moment; on the gateway's own loop thread (an
    aiohttp request of another call) that wait can never end: the loop waits on itself, and every later gateway
    call waits forever. Seen when a half-made cluster (a refused `connect`) was collected during another student's
    `stop_cluster`. Elsewhere (a notebook's thread, whose own loop is another) the close runs as before.
    """

    def __del__(self: Any) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is None or running is not _own_loop(self):
            finalizer(self)
            return
        closing = _closing_later(self)
        if closing is not None:
            running.create_task(closing)

    __del__.dsgd_guarded = True  # type: ignore[attr-defined]
    return __del__


def guard_gateway_finalizers() -> None:
    """Make dask-gateway's client objects safe to collect on an event-loop thread (see _not_on_its_own_loop)."""
    from dask_gateway import client

    for cls in (client.Gateway, client.GatewayCluster):
        if not getattr(cls.__del__, "dsgd_guarded", False):
            cls.__del__ = _not_on_its_own_loop(cls.__del__)


def _field(options: Any, name: str) -> Any | None:
    """The option's field (type, bounds) when the gateway offers it, else None."""
    fields = getattr(options, "_fields", {})
    return fields.get(name)


def memory_option(field: Any, wanted: int, explicit: bool) -> float | int:
    """The `worker_memory` value (GiB) for a worker that needs `wanted` bytes, within the option's bounds.

    Raises WorkerMemoryError when the gateway's maximum is below what a worker needs.
    """
    from dask_gateway.options import Integer

    integer = isinstance(field, Integer)
    gib = math.ceil(wanted / GiB) if integer else math.ceil(wanted / GiB * 100) / 100
    top = getattr(field, "max", None)
    if top is not None and gib > top:
        need = (f"memory_limit asks {wanted / MiB:.0f} MiB per worker" if explicit else
                f"a worker needs at least {wanted / MiB:.0f} MiB: torch and the course take "
                f"{worker_baseline() / MiB:.0f} MiB, plus room to work below dask's pause")
        raise WorkerMemoryError(
            f"this dask-gateway offers at most {top} GiB per worker ({MEMORY_OPTION} option), but {need}. What to "
            "do: ask the hub's administrator to raise the option's maximum (c.Backend.cluster_options in the "
            "gateway's configuration)" + (", or ask for less memory" if explicit else "") + "."
        )
    bottom = getattr(field, "min", None)
    return max(gib, bottom) if bottom is not None else gib


def cluster_options(gateway: Any, memory_limit: int | None) -> tuple[Any, str]:
    """The gateway's options with one core and the worker memory the course needs set where offered; a note."""
    options = gateway.cluster_options()
    said = []
    cores = _field(options, CORES_OPTION)
    if cores is not None:
        options[CORES_OPTION] = max(1, getattr(cores, "min", None) or 1)
        said.append(f"{options[CORES_OPTION]} core(s)")
    from dask_gateway.options import Number

    memory = _field(options, MEMORY_OPTION)
    if isinstance(memory, Number):
        wanted = memory_limit or min_worker_limit()
        options[MEMORY_OPTION] = memory_option(memory, wanted, explicit=memory_limit is not None)
        said.append(f"{options[MEMORY_OPTION]} GiB")
    elif memory_limit is not None:
        raise ValueError(
            f"memory_limit was given but this dask-gateway offers no numeric {MEMORY_OPTION} option "
            f"(it offers {sorted(options)}); leave memory_limit unset, the gateway sets worker memory"
        )
    return options, (" and ".join(said) + " per worker") if said else "worker size set by the gateway"


def _refusal(address: str, exc: Exception) -> GatewayLimitError:
    return GatewayLimitError(
        f"the dask-gateway at {address} refused a new cluster: {exc}. What to do: close a cluster you no longer "
        "need (a notebook's client.close(), or dask_gateway.Gateway().list_clusters() and stop_cluster(name)), or "
        "ask the hub's administrator about the per-student limits."
    )


def close_once(gateway: Any) -> None:
    """Close a dask_gateway.Gateway so that its __del__ does not close it again (a second close raises in a
    garbage collection, with distributed 2026, since the first stopped its loop)."""
    guard_gateway_finalizers()
    try:
        gateway.close()
    finally:
        gateway.close = lambda: None


def new_gateway_cluster(memory_limit: int | None) -> tuple[Any, str, int]:
    """A new, running gateway cluster with no workers yet, shut down when closed; a note saying what it is; and the
    cores each worker gets (the torch threads it should use)."""
    from dask_gateway import Gateway, GatewayCluster
    from dask_gateway.client import GatewayWarning

    guard_gateway_finalizers()

    class CourseGatewayCluster(GatewayCluster):
        """A GatewayCluster whose scale() raises GatewayLimitError where the gateway caps the request."""

        def scale(self, n: int, **kwargs: Any) -> None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", GatewayWarning)
                super().scale(n, **kwargs)
            capped = [str(w.message) for w in caught if issubclass(w.category, GatewayWarning)]
            if capped:
                raise GatewayLimitError(
                    f"the dask-gateway caps this cluster below the {n} workers asked: {capped[0]} What to do: run "
                    "with fewer workers, or ask the hub's administrator (c.ClusterConfig.cluster_max_workers, "
                    "cluster_max_cores, cluster_max_memory in the gateway's configuration)."
                )

        def close(self, shutdown: bool | None = None) -> None:
            gateway = self.gateway
            try:
                super().close(shutdown=shutdown)
            finally:
                gateway.close = lambda: None  # closed by super().close(); see close_once

    settings = gateway_settings()
    with dask.config.set({"gateway": settings}):
        gateway = Gateway()  # its event loop thread is shared with the cluster's own Gateway
        try:
            options, size = cluster_options(gateway, memory_limit)
            try:
                cluster = CourseGatewayCluster(cluster_options=options, shutdown_on_close=True, loop=gateway.loop)
            except ValueError as exc:  # the gateway's 422: a limit or an option its handler refused
                raise _refusal(settings["address"], exc) from exc
        finally:
            close_once(gateway)
    note = f"dask-gateway cluster {cluster.name} at {settings['address']} ({size})"
    cores = int(options[CORES_OPTION]) if _field(options, CORES_OPTION) is not None else 1
    return cluster, note, cores


