"""Pinned ranks: each CPU rank of a group (and gloo's threads) on a core of its own while the group lasts."""

from __future__ import annotations

import os
import threading

import pytest
from distributed import Client

from dsgd_teach.machine import worker_addresses
from dsgd_teach.runtime.ranks.group import assign_cores, plan_group, run_in_group
from dsgd_teach.trace import TraceRecorder

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")


def test_each_rank_on_a_machine_gets_the_next_core_its_worker_may_use() -> None:
    one_machine = [("m1", (0, 1)), ("m1", (0, 1))]
    assert assign_cores(one_machine) == (0, 1)
    assert assign_cores([("m1", (0, 1))] * 3) == (0, 1, 0)  # more ranks than cores: round again
    two_machines = [("m1", (0, 1, 2, 3)), ("m2", (0, 1, 2, 3)), ("m1", (0, 1, 2, 3)), ("m2", (0, 1, 2, 3))]
    assert assign_cores(two_machines) == (0, 0, 1, 1)  # ranks alternate machines; each counts its own
    assert assign_cores([("m1", (4, 6)), ("m1", (4, 6))]) == (4, 6)  # only cores the worker may use


def _gloo_threads() -> dict[str, list[int]]:
    """This process's gloo threads (name + thread id) and the cores each may run on."""
    gloo = {}
    for name in os.listdir("/proc/self/task"):
        try:
            comm_name = open(f"/proc/self/task/{name}/comm").read().strip()
            if comm_name.startswith("gloo"):
                gloo[comm_name + name] = sorted(os.sched_getaffinity(int(name)))
        except OSError:  # the thread has ended meanwhile
            continue
    return gloo


def _affinities(ctx, comm) -> dict:  # noqa: ANN001 - run_in_group's rank signature
    """This rank's thread's cores and those of gloo's threads, while in the group."""
    return {"rank": ctx.rank, "own": sorted(os.sched_getaffinity(0)), "gloo": _gloo_threads()}


def _thread_cores() -> list[int]:
    return sorted(os.sched_getaffinity(threading.get_native_id()))


@pytest.mark.timeout(120)
def test_pinned_ranks_run_on_their_own_cores_and_get_all_back_after(client: Client) -> None:
    before = {a: client.submit(_thread_cores, workers=[a], pure=False).result(60) for a in worker_addresses(client)}
    # gloo threads a worker already had (an earlier group's, still winding down) are not this group's
    earlier = set().union(*client.run(_gloo_threads).values())
    spec = plan_group(client, 2, "cpu", 30.0, pin_cores=True)
    assert len(spec.cores) == 2
    outs, _ = run_in_group(client, spec, _affinities, [(), ()], TraceRecorder(), 60.0)
    for out in outs:
        core = spec.cores[out["rank"]]
        assert out["own"] == [core], out
        own_gloo = {name: cores for name, cores in out["gloo"].items() if name not in earlier}
        assert own_gloo and all(cores == [core] for cores in own_gloo.values()), out
    if len(os.sched_getaffinity(0)) > 1:
        assert spec.cores[0] != spec.cores[1]  # one machine: the two ranks do not share a core
    after = {a: client.submit(_thread_cores, workers=[a], pure=False).result(60) for a in before}
    assert after == before  # the worker's task thread runs other tasks afterwards, on every core it had


@pytest.mark.timeout(120)
def test_unpinned_groups_leave_the_cores_alone(client: Client) -> None:
    spec = plan_group(client, 2, "cpu", 30.0)
    assert spec.cores == ()
    outs, _ = run_in_group(client, spec, _affinities, [(), ()], TraceRecorder(), 60.0)
    assert all(len(out["own"]) == len(os.sched_getaffinity(0)) for out in outs)
