"""A group's rendezvous port is held from the moment it is chosen, so no other group (another run, another test
process on the same machine) can be handed it and meet this group's ranks."""

from __future__ import annotations

import errno
import socket

import pytest
import torch
import torch.distributed as dist
from distributed import Client

from dsgd_teach.runtime.group import plan_group, run_in_group
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
