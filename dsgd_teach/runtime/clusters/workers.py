"""Getting the workers a run needs from whatever cluster the course was given, and placing ranks by host.

`get_workers(client, n, policy=...)` is the one way a run gets its workers; the policy says what to do when the
cluster has fewer than n:
- "fit" (the default, for runs that can show something with fewer): grow the cluster when the course started it
  or the user handed in a cluster object (LocalCluster, dask-jobqueue, dask-gateway, dask-kubernetes: anything
  with `scale`); otherwise run with what there is and say, in one line, what more workers would show;
- "all" (n ranks that must all run at once, one long task per worker): grow as "fit" does, else refuse with a
  message saying how to get them;
- "present" (the same, on the workers already there): refuse without growing;
- "this_host" (ranks sharing memory with this process): n workers on this machine, else refuse.
It never shrinks or kills workers of a deployment the course did not start.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from distributed import Client

from ...machine import MAX_WORKERS, check_n_workers, host_of, worker_addresses
from ...memory import check_workers_memory

POLICIES = ("fit", "all", "present", "this_host")


@dataclass(frozen=True)
class Workers:
    """What a run may use: n of the wanted workers (n <= wanted), the addresses it may use, and a one-line note."""

    n: int
    wanted: int
    addresses: tuple[str, ...]
    note: str

    @property
    def enough(self) -> bool:
        """True when the run gets every worker it asked for."""
        return self.n >= self.wanted

    def __str__(self) -> str:
        return self.note


def scalable_cluster(client: Client) -> Any | None:
    """The cluster object this client may scale (one the course started or the user handed in), else None."""
    owned = getattr(client, "_owned_cluster", None)
    if owned is not None:
        return owned
    return getattr(client, "_handed_cluster", None)


def capacity(client: Client, cap: int = MAX_WORKERS) -> int:
    """The most workers this client can have at once, at most cap: cap when it can scale, else what is there."""
    if scalable_cluster(client) is not None:
        return cap
    return max(1, min(cap, len(worker_addresses(client))))


def scale_to(client: Client, cluster: Any, n: int, timeout: float) -> None:
    """Scale a cluster object up to n workers and wait until they have joined (raises TimeoutError)."""
    if hasattr(client, "resize") and getattr(client, "_owned_cluster", None) is cluster:
        client.resize(n, timeout=timeout)  # also resets torch threads per worker
        return
    cluster.scale(n)
    deadline = time.monotonic() + timeout
    while len(worker_addresses(client)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster did not reach {n} workers within {timeout:.0f} s (is the queue busy?)")
        time.sleep(0.1)


def get_workers(client: Client, n: int, why: str = "", *, policy: str = "fit", what: str = "this run",
                instead: str = "", timeout: float = 120.0) -> Workers:
    """Workers for a run that wants n at once, by policy (see the module docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    check_n_workers("n", n)
    check_workers_memory(client, what="this run cannot get its workers")
    if policy == "this_host":
        return _this_host(client, n)
    have = worker_addresses(client)
    if len(have) >= n:
        return Workers(n, n, tuple(have), f"using {n} of the cluster's {len(have)} worker(s)")
    if policy == "present":
        raise ValueError(
            f"{what} needs {n} worker processes running at once (a dask worker runs one long rank task at a "
            f"time) but the cluster has {len(have)}; call client.resize({n}) first" + (f", or {instead}" if instead else "")
        )
    cluster = scalable_cluster(client)
    if cluster is not None:
        scale_to(client, cluster, n, timeout)
        now = worker_addresses(client)
        return Workers(n, n, tuple(now), f"scaled the cluster from {len(have)} to {len(now)} worker(s)")
    k = len(have)
    if k == 0:
        raise RuntimeError("the cluster has no workers; start some (dask worker SCHEDULER_ADDRESS) and retry")
    if policy == "all":
        raise ValueError(
            f"{what} needs {n} ranks running at the same time, one per worker, but the cluster has {k} "
            f"worker(s) and cannot be scaled from here; start it with at least {n} workers"
            + (f", or {instead}" if instead else "")
        )
    shows = f" would show {why}" if why else " would run the full version of this cell"
    note = (f"this deployment has {k} worker(s) and is not the course's to scale: running with {k}; "
            f"{n}{shows}")
    return Workers(k, n, tuple(have), note)


def by_host(addresses: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """Worker addresses grouped by host, each group sorted; hosts ordered by their first address."""
    groups: dict[str, list[str]] = defaultdict(list)
    for a in sorted(addresses):
        groups[host_of(a)].append(a)
    return dict(groups)


def interleave_hosts(addresses: list[str] | tuple[str, ...]) -> list[str]:
    """Addresses reordered so consecutive entries alternate hosts (one host: plain sorted order)."""
    groups = list(by_host(addresses).values())
    out: list[str] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def local_ips() -> set[str]:
    """IPv4/IPv6 addresses of this machine (of this process's network namespace)."""
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().items() for a in addrs[1]}


def alternate_from_end(addresses: list[str] | tuple[str, ...]) -> list[str]:
    """Addresses reordered so that, read from the last one backwards, they alternate hosts (one host: sorted)."""
    groups = [list(reversed(g)) for g in by_host(addresses).values()]
    out: list[str] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return list(reversed(out))


def _this_host(client: Client, n: int) -> Workers:
    """n workers on this process's host, for memory it shares with them; a clear error when it has fewer.

    The shared block is created here, in this machine's /dev/shm, so only workers on this machine can map it.
    """
    groups = by_host(worker_addresses(client))
    if not groups:
        raise RuntimeError("the cluster has no workers")
    mine = local_ips()
    here = [a for h, g in groups.items() if h in mine for a in g]
    if len(here) < n:
        counts = ", ".join(f"{h}: {len(g)}" for h, g in groups.items())
        where = (f"start {n} workers on the machine running this notebook" if getattr(getattr(client, "info", None),
                 "kind", "") != "gateway" else "a dask-gateway places workers where its backend decides (on "
                 "Kubernetes, in pods of their own) and cannot promise them on this machine: run this chapter with "
                 "DSGD_GATEWAY=off (a LocalCluster in your own server)")
        raise ValueError(
            f"{n} ranks sharing memory need {n} workers on this machine (where the shared block lives), but "
            f"it has {len(here)} (workers by host: {counts}); {where}, or use backend='threads'"
        )
    return Workers(n, n, tuple(here[:n]), f"using {n} worker(s) on this machine")


def rendezvous_host(addresses: list[str]) -> str:
    """The host every rank can reach for a process group: rank 0's address, refused if it is loopback
    while other ranks live on other hosts."""
    hosts = [host_of(a) for a in addresses]
    if hosts[0].startswith("127.") or hosts[0] in ("localhost", "::1"):
        others = {h for h in hosts if h != hosts[0]}
        if others:
            raise ValueError(
                f"rank 0's worker listens on {hosts[0]}, which ranks on {sorted(others)} cannot reach; "
                "start that worker with --host set to an address the other machines can reach"
            )
    return hosts[0]
