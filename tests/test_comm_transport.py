"""Comm's thread transport against its gloo transport: the same ring logs the same messages and sums the same bits.

ps11 grades students' rings on Comm with ranks as threads of the grading kernel; what it reads must be what a real
process group would log. Here one gloo group per world size (2, 3, 4 ranks, formed on a dask cluster as chapter 05
forms them) and one thread group run the package's ring_allreduce (and the other hand-written allreduces) and ps11's
reference solution on the same inputs, and every result and every log record must agree. The thread transport's own guarantees (each message
delivered once, in the order sent; bounded waits; one rank's failure stops the others) are checked without a
cluster.
"""

from __future__ import annotations

import re
from typing import Any

import nbformat
import pytest
import torch
from distributed import Client

from dsgd_teach.collectives.algorithms import ALGORITHMS, HAND_WRITTEN, recv_first_exchange, ring_allreduce
from dsgd_teach.grading.notebook import nbgrader_meta
from dsgd_teach.grading.paths import default_source_dir
from dsgd_teach.runtime.ranks.comm import Comm, TorchDistributed
from dsgd_teach.runtime.ranks.group import plan_group, run_in_group
from dsgd_teach.runtime.ranks.thread_group import PeerFailed, RankFailed, ThreadTransport, run_threads
from dsgd_teach.trace import TraceRecorder

SIZES = (0, 1, 3, 5, 10, 37)  # empty, fewer values than ranks, uneven chunks
SEED = 11


def ps11_solution() -> str:
    """The source of ps11's reference ring_allreduce_rank (its solution cell, markers removed)."""
    path = default_source_dir() / "ps11_ring_comm" / "ps11_ring_comm.ipynb"
    for cell in nbformat.read(str(path), as_version=4).cells:
        if nbgrader_meta(cell).get("grade_id") == "ps11_ring_comm_q1_solution":
            return re.sub(r"[ \t]*### (BEGIN|END) SOLUTION\n?", "", cell.source)
    raise LookupError("ps11 has no q1 solution cell")


def ring_cases(comm: Comm, job: tuple[int, str]) -> list[tuple[str, torch.Tensor, list[dict[str, Any]]]]:
    """(case, result, this rank's log) for the package's ring on several shapes and dtypes, and for ps11's
    reference (job's source) and the other hand-written allreduces on the float64 vectors."""
    seed, solution = job
    ns: dict[str, Any] = {"torch": torch}
    exec(solution, ns)  # noqa: S102 - the course's own reference solution
    gen = torch.Generator().manual_seed(seed * 100 + comm.rank)
    inputs = {f"float64 x {k}": torch.randn(k, generator=gen, dtype=torch.float64) for k in SIZES}
    inputs["float32 4x3"] = torch.randn(4, 3, generator=gen)
    inputs["int64 x 7"] = torch.randint(-50, 50, (7,), generator=gen)
    out = []
    for name, x in inputs.items():
        programs = {"package": ring_allreduce}
        if name.startswith("float64"):
            programs["ps11"] = ns["ring_allreduce_rank"]
            programs.update({a: ALGORITHMS[a] for a in HAND_WRITTEN if a != "ring"})  # the others agree too
        for who, program in programs.items():
            comm.take_log()
            result = program(comm, x)
            out.append((f"{who}: {name}", result, comm.take_log()))
    return out


def _on_gloo(ctx: Any, comm: Comm, job: tuple[int, str]) -> list[tuple[str, torch.Tensor, list[dict[str, Any]]]]:
    """Worker side: the same cases on this rank of a gloo group."""
    return ring_cases(comm, job)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_threads_and_gloo_log_the_same_ring_and_sum_the_same_bits(cluster4: Client, world: int) -> None:
    job = (SEED, ps11_solution())
    spec = plan_group(cluster4, world, "cpu", timeout_s=20)
    assert spec.backend == "gloo"
    on_gloo, _ = run_in_group(cluster4, spec, _on_gloo, [(job,)] * world, TraceRecorder(), 120)
    on_threads, _ = run_threads(ring_cases, [job] * world, timeout_s=20)
    assert len(on_gloo) == len(on_threads) == world
    for rank in range(world):
        assert [c for c, _, _ in on_threads[rank]] == [c for c, _, _ in on_gloo[rank]]
        for (case, got, log), (_, want, want_log) in zip(on_threads[rank], on_gloo[rank], strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape, (rank, case)
            assert torch.equal(got, want), (rank, case, got, want)  # same additions in the same order: same bits
            assert log == want_log, (rank, case)
    sends = [m for rank_cases in on_threads for c, _, log in rank_cases if c == "ps11: float64 x 37" for m in log
             if m["direction"] == "send"]
    assert len(sends) == 2 * (world - 1) * world  # every rank sends one chunk per step


class DropsOne(ThreadTransport):
    """A broken transport: the second message on every wire is lost."""

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self.sent: dict[tuple[int, int], int] = {}

    def post(self, src: int, dst: int, tensor: torch.Tensor) -> None:
        self.sent[(src, dst)] = self.sent.get((src, dst), 0) + 1
        if self.sent[(src, dst)] != 2:
            super().post(src, dst, tensor)


class SwapsTwo(ThreadTransport):
    """A broken transport: the first two messages on every wire arrive the other way round."""

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self.held: dict[tuple[int, int], torch.Tensor | None] = {}

    def post(self, src: int, dst: int, tensor: torch.Tensor) -> None:
        if (src, dst) not in self.held:
            self.held[(src, dst)] = tensor  # kept back until the second message has gone
            return
        super().post(src, dst, tensor)
        first = self.held[(src, dst)]
        if first is not None:
            super().post(src, dst, first)
            self.held[(src, dst)] = None


def _stream(comm: Comm, n: int) -> list[float]:
    """Rank 0 sends n numbered messages to every other rank, one exchange each; the others receive them."""
    if comm.rank == 0:
        for i in range(n):
            for peer in range(1, comm.world):
                comm.exchange(torch.tensor([float(i)]), peer, step=i, phase="stream")
        return []
    got = []
    for i in range(n):
        buf = torch.empty(1)
        comm.exchange(recv=buf, src=0, step=i, phase="stream")
        got.append(float(buf))
    return got


def delivery_problem(transport: type[ThreadTransport], n: int = 5, world: int = 3) -> str:
    """'' when every message arrives once and in order on `transport`, else what went wrong."""
    try:
        results, _ = run_threads(_stream, [n] * world, timeout_s=0.5, transport=transport)
    except (RankFailed, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    want = [float(i) for i in range(n)]
    bad = {r: got for r, got in enumerate(results[1:], 1) if got != want}
    return f"out of order or lost: {bad}" if bad else ""


def test_messages_arrive_once_each_in_the_order_sent() -> None:
    assert delivery_problem(ThreadTransport) == ""


@pytest.mark.parametrize("broken", [DropsOne, SwapsTwo])
def test_a_transport_that_drops_or_reorders_is_caught(broken: type[ThreadTransport]) -> None:
    """The check above can fail: a transport that loses or swaps a message does not pass it."""
    assert delivery_problem(broken) != ""


@pytest.mark.parametrize("broken", [DropsOne, SwapsTwo])
def test_a_ring_on_a_broken_transport_differs_from_the_ring_on_threads(broken: type[ThreadTransport]) -> None:
    xs = [torch.arange(10, dtype=torch.float64) * 10.0 ** r for r in range(3)]
    good, good_logs = run_threads(ring_allreduce, xs, timeout_s=0.5)
    try:
        bad, bad_logs = run_threads(ring_allreduce, xs, timeout_s=0.5, transport=broken)
    except (RankFailed, RuntimeError):
        return  # lost: a rank waited in vain
    assert any(not torch.equal(a, b) for a, b in zip(good, bad, strict=True))


@pytest.mark.timeout(30)
def test_a_receive_nobody_sends_times_out_naming_both_ranks() -> None:
    with pytest.raises(RankFailed) as info:
        run_threads(recv_first_exchange, [torch.ones(4)] * 3, timeout_s=0.3)
    cause = info.value.__cause__
    assert isinstance(cause, TimeoutError)
    assert re.search(r"rank (\d): no message from rank (\d) within 0.3 s", str(cause))


@pytest.mark.timeout(30)
def test_one_rank_failing_stops_the_others_at_once() -> None:
    """With a 60 s receive timeout, the run still ends quickly: the failure wakes the ranks waiting on it."""
    stopped: list[BaseException] = []

    def program(comm: Comm, x: torch.Tensor) -> torch.Tensor:
        if comm.rank == 1:
            raise IndexError("rank 1's own bug")
        try:
            return ring_allreduce(comm, x)
        except PeerFailed as exc:
            stopped.append(exc)
            raise

    with pytest.raises(RankFailed, match="rank 1 failed: IndexError: rank 1's own bug") as info:
        run_threads(program, [torch.ones(6)] * 3, timeout_s=60)
    assert info.value.rank == 1 and isinstance(info.value.__cause__, IndexError)
    assert len(stopped) == 2 and all("because rank 1 failed" in str(e) for e in stopped)


def test_a_message_nobody_receives_is_an_error() -> None:
    def program(comm: Comm, x: torch.Tensor) -> None:
        if comm.rank == 0:
            comm.exchange(x, 1, step=0, phase="lonely")

    with pytest.raises(RuntimeError, match="never received: 1 from rank 0 to rank 1"):
        run_threads(program, [torch.ones(2)] * 2)


def test_a_receive_buffer_of_the_wrong_size_or_dtype_is_refused() -> None:
    def program(comm: Comm, dtype: torch.dtype) -> None:
        peer = 1 - comm.rank
        comm.exchange(torch.ones(3, dtype=torch.float64), peer, torch.empty(3, dtype=dtype), peer, step=0, phase="x")

    run_threads(program, [torch.float64] * 2)
    with pytest.raises(RankFailed, match="sent 3 elements of torch.float64, but the receive buffer holds 3 of"):
        run_threads(program, [torch.float32] * 2, timeout_s=1)


def test_comm_refuses_non_tensors_and_peers_outside_the_group() -> None:
    comm = Comm(0, 2, torch.device("cpu"), 1.0, transport=ThreadTransport(2))
    with pytest.raises(TypeError, match="exchange moves torch tensors; send is a list"):
        comm.exchange([1.0], 1, step=0, phase="x")
    with pytest.raises(ValueError, match="dst must be a rank in 0..1, got 5"):
        comm.exchange(torch.ones(1), 5, step=0, phase="x")


def test_chapter_05s_comm_still_goes_through_torch_distributed() -> None:
    comm = Comm(0, 1, torch.device("cpu"), 1.0)
    assert isinstance(comm.transport, TorchDistributed)
    comm.exchange(torch.ones(0), 0, torch.ones(0), 0, step=0, phase="empty")  # nothing to move: no group needed
    assert comm.log == []
