"""Process-group lifecycle: one torch.distributed rank per dask worker, formed for a run and always torn down.

The driver picks the workers, has the rank-0 worker open the group's rendezvous store on a port the OS gives it
(port 0, listening from that moment, so no other group can take the port in between), and runs a task per rank
through `dsgd_teach.runtime.ranks.live.run_live`; rank 0 takes the open store, the others connect to its port, each joins
the group (gloo on CPU, NCCL on GPU) with a timeout, does its work and calls destroy_process_group in a `finally`, so
a failed or stopped run leaves no group, port or thread behind.

With pin_cores, each CPU rank runs on a core of its own, as each would have a device of its own: the rank's thread,
and the threads its group starts (gloo's), may use only that core while the group lasts. Unpinned, the OS moves the
busy ranks and gloo's threads between cores and they wait on each other: a 2-stage 1F1B pipeline on 2 cores took
about 15 % longer per step (51 ms against 44 ms, hidden 512, 8 microbatches).
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from distributed import Client

from ...machine import host_of, machine_id
from ...trace import TraceRecorder
from ..clusters.cluster import visible_gpus
from ..clusters.worker_settings import release_free_memory
from ..clusters.workers import get_workers, interleave_hosts, rendezvous_host
from .comm import Comm
from .live import WorkerContext, run_live

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class GroupSpec:
    """Everything a rank needs to join: rendezvous host and port, world size, backend, device, timeout."""

    host: str
    port: int
    world: int
    backend: str  # "gloo" or "nccl"
    devices: tuple[str, ...]  # torch device of each rank, e.g. ("cpu", "cpu") or ("cuda:0", "cuda:1")
    timeout_s: float
    workers: tuple[str, ...] = ()  # the worker address of each rank (ranks alternate hosts)
    cores: tuple[int, ...] = ()  # the core each rank is pinned to while in the group; () for none
    store: str = ""  # the name of the rendezvous store rank 0's worker holds open on `port` ("" for none)


def group_hosts(spec: GroupSpec) -> str:
    """The hosts the group's ranks run on, comma-separated (one host, or several for a group across machines)."""
    return ",".join(sorted({host_of(a) for a in spec.workers})) or spec.host


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on host that nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


#: How long a store opened by plan_group waits for its rank 0 before the next plan on that worker closes it.
STORE_KEEP_S = 3600.0
_open_stores: dict[str, tuple[Any, float]] = {}  # store name -> (the TCPStore, when it may be closed)
_stores_lock = threading.Lock()


def open_store(name: str, world: int, timeout_s: float) -> int:
    """Open a group's rendezvous store (a TCPStore server) on a port the OS picks, kept for rank 0; its port.

    The store listens from the moment the OS gives the port, so no other group can be handed that port and
    meet this one's ranks (a port found free, closed and bound later by rank 0 could be taken in between).
    """
    now = time.monotonic()
    with _stores_lock:
        for old in [k for k, (_, until) in _open_stores.items() if until < now]:
            del _open_stores[old]
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        _open_stores[name] = (store, now + STORE_KEEP_S)
        return int(store.port)


def _store_missing(name: str) -> RuntimeError:
    """The error for a spec whose store is gone: used, or lost with its worker."""
    return RuntimeError(f"the group's rendezvous store {name!r} is not open in this worker: a GroupSpec serves one "
                        "group, and its store is lost if rank 0's worker restarted; call plan_group again")


def store_is_open(name: str) -> bool:
    """True while the store plan_group opened under `name` in this worker waits for its rank 0."""
    with _stores_lock:
        return name in _open_stores


def take_store(name: str) -> Any:
    """Rank 0's store, opened for it by plan_group in this worker process; a clear error when it is not here."""
    with _stores_lock:
        entry = _open_stores.pop(name, None)
    if entry is None:
        raise _store_missing(name)
    return entry[0]


def host_store(world: int, timeout_s: float = 300.0) -> Any:
    """A rendezvous store for processes this one starts: it listens on a port the OS gives (store.port) at once."""
    return dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def join_store(host: str, port: int, world: int, timeout_s: float = 300.0) -> Any:
    """A client of the rendezvous store listening on host:port (fails after timeout_s if nobody listens)."""
    return dist.TCPStore(host, port, world, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def port_is_free(host: str, port: int) -> bool:
    """True when a server could listen on host:port now (SO_REUSEADDR, so closed connections don't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError:
            return False
    return True


def core_placement() -> tuple[str, tuple[int, ...]]:
    """(this machine's identity, the cores this process may run on): asked of each rank's worker."""
    return machine_id(), tuple(sorted(os.sched_getaffinity(0)))


def assign_cores(placements: Sequence[tuple[str, Sequence[int]]]) -> tuple[int, ...]:
    """One core per rank: the i-th rank on a machine gets the i-th core its worker may use (round again when the
    machine has more ranks than cores)."""
    ranks_seen: dict[str, int] = {}
    cores = []
    for machine, allowed in placements:
        i = ranks_seen.get(machine, 0)
        ranks_seen[machine] = i + 1
        cores.append(int(allowed[i % len(allowed)]))
    return tuple(cores)


def plan_group(client: Client, world: int, device: str = "auto", timeout_s: float = 30.0,
               workers: Sequence[str] | None = None, pin_cores: bool = False) -> GroupSpec:
    """Choose workers (or take `workers`, one per rank), backend and devices for a world of `world` ranks, open the
    group's rendezvous store on rank 0's worker, and with pin_cores (CPU ranks, where the OS allows it) a core for
    each rank. The spec serves one group (rank 0 takes the store)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if workers is not None and len(workers) != world:
        raise ValueError(f"need one worker address per rank ({world}), got {len(workers)}")
    addresses = list(workers) if workers is not None else interleave_hosts(get_workers(client, world, policy="all").addresses)[:world]
    setup_s = max(60.0, timeout_s)  # first tasks import torch on the workers: slow on a busy laptop
    probes = [client.submit(visible_gpus, workers=[a], pure=False) for a in addresses]
    gpus = [f.result(timeout=setup_s) for f in probes]
    info = getattr(client, "info", None)
    one_gpu_per_worker = getattr(info, "kind", "") == "cuda"
    enough = all(g > 0 for g in gpus) and (one_gpu_per_worker or world <= min(gpus))
    if device == "cuda" and not enough:
        seen = ", ".join(map(str, gpus))
        raise ValueError(
            f"device='cuda' needs a GPU of its own for each of the {world} ranks (NCCL does not share one GPU "
            f"between ranks); the workers see {seen} GPU(s) each; use device='cpu' or fewer workers"
        )
    use_cuda = device == "cuda" or (device == "auto" and enough)
    if use_cuda:
        devices = tuple("cuda:0" if one_gpu_per_worker else f"cuda:{r}" for r in range(world))
    else:
        devices = ("cpu",) * world
    cores: tuple[int, ...] = ()
    if pin_cores and not use_cuda and hasattr(os, "sched_setaffinity"):
        asked = [client.submit(core_placement, workers=[a], pure=False) for a in addresses]
        cores = assign_cores([f.result(timeout=setup_s) for f in asked])
    host = rendezvous_host(addresses)
    name = f"dsgd-group-{uuid.uuid4().hex}"
    port = client.submit(open_store, name, world, timeout_s, workers=[addresses[0]], pure=False).result(timeout=setup_s)
    return GroupSpec(host, port, world, "nccl" if use_cuda else "gloo", devices, timeout_s, tuple(addresses), cores,
                     name)


def interface_of(ip: str) -> str | None:
    """Name of this machine's network interface that holds ip (None if none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    return None


@contextmanager
def gloo_interface(own_host: str) -> Iterator[None]:
    """While forming a group, make gloo listen on the interface of this worker's own address.

    Left alone, gloo resolves the machine's hostname, which on a multi-homed host (or a network namespace) can
    name an address other ranks cannot reach, or none, and then falls back to loopback.
    """
    name = interface_of(own_host)
    old = os.environ.get("GLOO_SOCKET_IFNAME")
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    try:
        yield
    finally:
        if name is not None:
            if old is None:
                os.environ.pop("GLOO_SOCKET_IFNAME", None)
            else:
                os.environ["GLOO_SOCKET_IFNAME"] = old


@contextmanager
def _counter_restored_on_failure() -> Iterator[None]:
    """Undo a failed join's step of torch's process-group counter, which names every group's keys in its store.

    The counter goes back to 0 only when a default group is destroyed; a join that failed has none to destroy, so
    without this its worker's next group would wait for keys under another name than its peers' (every later group
    on that worker timed out: "DistStoreError: wait timeout ... keys: /1//cpu//0/1", one test after another).
    """
    from torch.distributed import distributed_c10d

    before = distributed_c10d._world.group_count
    try:
        yield
    except BaseException:
        distributed_c10d._world.group_count = before
        raise


def _thread_ids() -> set[int]:
    """The ids of this process's threads."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def pin_new_threads(before: set[int], core: int) -> None:
    """Pin the calling thread, and the threads started since `before` (gloo's), to `core`.

    Joining with the thread already pinned, so that gloo's threads would inherit the core, failed the rendezvous
    about one time in four on a loaded 2-core machine (gloo's connectFullMesh: "Connection closed by peer"): the
    threads are pinned once the group has formed instead.
    """
    os.sched_setaffinity(0, {core})
    for tid in _thread_ids() - before:
        try:
            os.sched_setaffinity(tid, {core})
        except OSError:  # the thread has ended meanwhile
            pass


@contextmanager
def process_group(spec: GroupSpec, rank: int) -> Iterator[Comm]:
    """Join the group as `rank` (bounded by spec.timeout_s) and yield a byte-counting Comm; always destroys it."""
    device = torch.device(spec.devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    extra = {"device_id": device} if device.type == "cuda" else {}
    own_host = host_of(spec.workers[rank]) if spec.workers else spec.host
    allowed = os.sched_getaffinity(0) if spec.cores else None
    try:
        if not spec.store:  # a spec made by hand: rank 0 listens on spec.port (the caller keeps it free)
            store = dist.TCPStore(spec.host, spec.port, spec.world, is_master=rank == 0, timeout=timeout)
        elif rank == 0:
            store = take_store(spec.store)
        else:
            store = join_store(spec.host, spec.port, spec.world, spec.timeout_s)
        threads_before = _thread_ids()
        with gloo_interface(own_host), _counter_restored_on_failure():
            dist.init_process_group(spec.backend, store=store, rank=rank, world_size=spec.world, timeout=timeout,
                                    **extra)
        del store  # the group keeps its own reference while it lasts
        if spec.cores:  # after joining (see pin_new_threads): this thread, and the threads the group started
            pin_new_threads(threads_before, spec.cores[rank])
        try:
            yield Comm(rank, spec.world, device, spec.timeout_s)
        finally:
            dist.destroy_process_group()
    finally:
        if allowed is not None:  # the worker's thread runs other tasks afterwards
            os.sched_setaffinity(0, allowed)


def _group_task(ctx: WorkerContext, spec: GroupSpec, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Worker side of run_in_group: join, run fn(ctx, comm, *args), leave and give back what the rank freed."""
    try:
        with process_group(spec, ctx.rank) as comm:
            return fn(ctx, comm, *args)
    finally:
        release_free_memory()


def run_in_group(
    client: Client,
    spec: GroupSpec,
    fn: Callable[..., Any],
    args_per_rank: Sequence[tuple[Any, ...]],
    recorder: TraceRecorder,
    run_timeout_s: float,
    on_worker_lost: str = "raise",
) -> tuple[list[Any], bool]:
    """Run fn(ctx, comm, *args) on every rank concurrently inside one process group; (results, stopped).

    Each rank's collectives fail after spec.timeout_s, and the driver gives up after run_timeout_s, so a bug
    (a message nobody receives) ends in an error, never a hang. on_worker_lost is run_live's.
    """
    if len(args_per_rank) != spec.world:
        raise ValueError(f"need one argument tuple per rank ({spec.world}), got {len(args_per_rank)}")
    if spec.store and spec.workers:  # a used spec fails here: its other ranks would wait timeout_s on a closed port
        probe = client.submit(store_is_open, spec.store, workers=[spec.workers[0]], pure=False)
        if not probe.result(timeout=max(60.0, spec.timeout_s)):
            raise _store_missing(spec.store)
    return run_live(
        client, _group_task, [(spec, fn, args) for args in args_per_rank], recorder, timeout_s=run_timeout_s,
        addresses=list(spec.workers) or None, on_worker_lost=on_worker_lost,
    )


def worker_thread_counts(client: Client) -> dict[str, tuple[int, int]]:
    """(Python threads, OS threads) of every worker process: tests use it to check nothing is left running."""

    def counts() -> tuple[int, int]:
        import threading

        import psutil

        return threading.active_count(), psutil.Process(os.getpid()).num_threads()

    return client.run(counts)
