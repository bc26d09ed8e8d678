"""A group's rendezvous port is held from the moment it is chosen, so no other group (another run, another test
process on the same machine) can be handed it and meet this group's ranks."""

from __future__ import annotations

import errno
import socket

import pytest
import torch
import torch.distributed as dist
from distributed import Client

from dsgd_teach.machine import worker_addresses
from dsgd_teach.runtime.ranks.group import GroupSpec, host_store, plan_group, process_group, run_in_group
from dsgd_teach.trace import TraceRecorder

pytestmark = pytest.mark.timeout(180)


def _rank_sum(ctx, comm) -> float:  # noqa: ANN001 - run_in_group's rank signature
    """The sum of every rank's (rank + 1): proves the ranks met each other and nobody else."""
    x = torch.tensor([float(comm.rank + 1)])
    dist.all_reduce(x)
    return float(x.item())


def test_the_port_is_listening_from_the_plan_until_the_group_forms(client: Client) -> None:
    spec = plan_group(client, 2, "cpu", 30.0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:  # another group's rank 0 trying to take it
        with pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", spec.port))
            other.listen(1)
        assert taken.value.errno == errno.EADDRINUSE
    outs, _ = run_in_group(client, spec, _rank_sum, [(), ()], TraceRecorder(), 60.0)
    assert outs == [3.0, 3.0]


def test_groups_planned_together_form_in_any_order_and_a_spec_serves_one_group(client: Client) -> None:
    first, second = plan_group(client, 2, "cpu", 30.0), plan_group(client, 2, "cpu", 30.0)
    assert first.port != second.port
    assert run_in_group(client, second, _rank_sum, [(), ()], TraceRecorder(), 60.0)[0] == [3.0, 3.0]
    assert run_in_group(client, first, _rank_sum, [(), ()], TraceRecorder(), 60.0)[0] == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="serves one group"):
        run_in_group(client, first, _rank_sum, [(), ()], TraceRecorder(), 60.0)
    assert _tasks_running(client) == 0  # no rank left waiting on the used spec's closed port, holding its worker


def _tasks_running(client: Client) -> int:
    """How many tasks the workers are executing now."""
    def executing(dask_worker) -> int:  # noqa: ANN001 - client.run passes the worker
        return len(dask_worker.state.executing)

    return sum(client.run(executing).values())


def _join_alone(spec: GroupSpec) -> str:
    """Join as rank 1 of a group whose rank 0 never comes: the join fails inside init_process_group."""
    try:
        with process_group(spec, 1):
            return "joined"
    except Exception as exc:  # noqa: BLE001 - the failure is the point
        return type(exc).__name__


def test_a_failed_join_leaves_its_worker_able_to_join_the_next_group(client: Client) -> None:
    store = host_store(2)  # listening, but no rank 0 will ever write its address there
    workers = tuple(worker_addresses(client))[:2]
    lonely = GroupSpec("127.0.0.1", store.port, 2, "gloo", ("cpu", "cpu"), 2.0, workers, (), "never-rank-0")
    assert client.submit(_join_alone, lonely, workers=[workers[1]], pure=False).result(60) != "joined"
    spec = plan_group(client, 2, "cpu", 20.0, workers=list(workers))
    outs, _ = run_in_group(client, spec, _rank_sum, [(), ()], TraceRecorder(), 60.0)
    assert outs == [3.0, 3.0]
