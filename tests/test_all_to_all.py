"""The course's all-to-all (pairwise exchange over Comm) equals torch.distributed.all_to_all_single, uneven splits too.

Threads check the layout against a reference written out by hand, and its gradient; a gloo world of processes checks
it against PyTorch's own all_to_all_single, on the whole world and on a sub-group, where it also runs the
expert-parallel layer handed a process group (one world of processes serves both: starting one is the slow part).
"""

from __future__ import annotations

import datetime
import multiprocessing
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dsgd_teach.collectives.all_to_all import (
    all_to_all,
    all_to_all_bytes,
    differentiable_all_to_all,
    exchange_counts,
)
from dsgd_teach.runtime.ranks.group import host_store
from dsgd_teach.runtime.ranks.thread_group import RankFailed, run_threads

WORLD = 3
#: SPLITS[i][j]: rows rank i sends to rank j (zeros, a rank keeping everything, a rank sending nothing to itself).
SPLITS = [[2, 0, 3], [1, 4, 0], [0, 0, 5]]


def rows_of(rank: int, width: int = 4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank's input: sum(SPLITS[rank]) rows whose values say which rank and row they are."""
    n = sum(SPLITS[rank])
    return (100 * rank + torch.arange(n * width).view(n, width)).to(dtype)


def by_hand(rank: int, width: int = 4) -> torch.Tensor:
    """What rank should receive: from each rank i in order, i's block addressed to `rank`."""
    blocks = []
    for i in range(WORLD):
        start = sum(SPLITS[i][:rank])
        blocks.append(rows_of(i, width)[start : start + SPLITS[i][rank]])
    return torch.cat(blocks)


def recv_splits(rank: int) -> list[int]:
    return [SPLITS[i][rank] for i in range(WORLD)]


def test_all_to_all_delivers_each_block_to_its_rank_in_source_order() -> None:
    run = run_threads(lambda comm, r: all_to_all(comm, rows_of(r), SPLITS[r], recv_splits(r)), range(WORLD))
    for rank, got in enumerate(run.results):
        assert torch.equal(got, by_hand(rank))
    for rank, log in enumerate(run.logs):  # every block but its own, and the bytes equal the formula
        sent = sum(m["bytes"] for m in log if m["direction"] == "send")
        assert sent == all_to_all_bytes(SPLITS[rank], rank, row_bytes=4 * 4)
        wanted = {j for j in range(WORLD) if j != rank and SPLITS[rank][j]}  # an empty block is not sent
        assert {m["dst"] for m in log if m["direction"] == "send"} == wanted
    # the pairwise schedule: whatever a rank receives in a step, its sender sends in that same step (so no rank
    # ever waits on one that is still busy with a third: no deadlock even where a send waits for its receive)
    sends = {(m["src"], m["dst"], m["step"]) for log in run.logs for m in log if m["direction"] == "send"}
    recvs = {(m["src"], m["dst"], m["step"]) for log in run.logs for m in log if m["direction"] == "recv"}
    assert sends == recvs


def test_counts_travel_by_all_to_all_and_gradients_take_the_reverse_exchange() -> None:
    def rank(comm, r):
        counts = exchange_counts(comm, torch.tensor(SPLITS[r]).view(WORLD, 1))
        x = rows_of(r).requires_grad_()
        out = differentiable_all_to_all(comm, x, SPLITS[r], counts.view(-1).tolist())
        (out * out).sum().backward()  # d/dx of sum(out²) is 2·x wherever each row went
        return counts.view(-1).tolist(), x.grad

    for r, (counts, grad) in enumerate(run_threads(rank, range(WORLD)).results):
        assert counts == recv_splits(r)
        assert torch.equal(grad, 2 * rows_of(r))


def test_bad_splits_raise_value_errors_before_any_message() -> None:
    def call(comm, args):
        return all_to_all(comm, *args)

    cases = [
        (([1, 2], [1, 2]), "one per rank"),  # two splits for three ranks
        (([1, -1, 1], [0, 0, 0]), "non-negative"),
        (([1, 1, 1], [1, 1, 1]), "sum to the input's 4 rows"),
        (([1.5, 1.5, 1], [1, 1, 1]), "non-negative ints"),
    ]
    for (send, recv), said in cases:
        with pytest.raises(RankFailed) as failed:
            run_threads(call, [(torch.zeros(4, 2), send, recv)] * WORLD)
        assert isinstance(failed.value.error, ValueError) and said in str(failed.value.error), failed.value.error


def expert_parallel_matches(group: Any, me: int) -> bool:
    """The expert-parallel layer, handed a process group, gives the single-process layer's output and input grad."""
    from types import SimpleNamespace

    from dsgd_teach.transformer.expert_parallel import ExpertParallelMoE
    from dsgd_teach.transformer.experts import MoE

    torch.manual_seed(0)  # the same weights and tokens in every process
    moe = MoE(SimpleNamespace(width=6, hidden=12, experts=4, top_k=2, capacity_factor=1.0), groups=2)
    x = torch.randn(16, 6)
    full_x = x.clone().requires_grad_()
    moe(full_x).square().sum().backward()
    mine = x[me * 8 : (me + 1) * 8].clone().requires_grad_()
    y = ExpertParallelMoE(moe, group=group, timeout_s=30.0)(mine)
    y.square().sum().backward()
    return bool(torch.allclose(y, moe(x)[me * 8 : (me + 1) * 8], atol=1e-6)
                and torch.allclose(mine.grad, full_x.grad[me * 8 : (me + 1) * 8], atol=1e-6))


def _rank(rank: int, port: int, report: Any) -> None:
    """One gloo rank: our all-to-all against all_to_all_single, on the world and on the sub-group {0, 2}."""
    import torch.distributed as dist

    from dsgd_teach.collectives.all_to_all import library_all_to_all
    from dsgd_teach.runtime.ranks.comm import Comm
    from dsgd_teach.runtime.ranks.group import join_store
    from dsgd_teach.transformer.mesh import GroupTransport

    dist.init_process_group("gloo", store=join_store("127.0.0.1", port, WORLD), rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        comm = Comm(rank, WORLD, torch.device("cpu"), 30.0)
        out: dict[str, Any] = {}
        for dtype in (torch.float32, torch.int64, torch.float64):
            x = rows_of(rank, width=3, dtype=dtype)
            ours = all_to_all(comm, x, SPLITS[rank], recv_splits(rank))
            theirs = library_all_to_all(comm, x, SPLITS[rank], recv_splits(rank))
            out[str(dtype)] = bool(torch.equal(ours, theirs)) and ours.dtype == dtype
        sub = dist.new_group([0, 2])
        if rank != 1:
            me = (0, 2).index(rank)
            sub_comm = Comm(me, 2, torch.device("cpu"), 30.0, transport=GroupTransport((0, 2), sub))
            send = [3, 1] if me == 0 else [0, 2]
            recv = [[3, 0], [1, 2]][me]
            x = torch.randn(sum(send), 5, generator=torch.Generator().manual_seed(rank))
            ours = all_to_all(sub_comm, x, send, recv)
            out["subgroup"] = bool(torch.equal(ours, library_all_to_all(sub_comm, x, send, recv, group=sub)))
            out["expert layer on the subgroup"] = expert_parallel_matches(sub, me)
        dist.barrier()
        report.put((rank, out))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report.put((rank, {"error": repr(exc)}))
    finally:
        dist.destroy_process_group()


def test_all_to_all_equals_torch_all_to_all_single_on_gloo_and_on_a_subgroup() -> None:
    ctx = multiprocessing.get_context("spawn")
    report = ctx.Queue()
    store = host_store(WORLD)  # listening before the ranks start
    ranks = [ctx.Process(target=_rank, args=(r, store.port, report), daemon=True) for r in range(WORLD)]
    for p in ranks:
        p.start()
    try:
        said = dict(report.get(timeout=180) for _ in range(WORLD))
    finally:
        for p in ranks:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
    for rank in range(WORLD):
        expected = {str(d): True for d in (torch.float32, torch.int64, torch.float64)}
        if rank != 1:
            expected |= {"subgroup": True, "expert layer on the subgroup": True}
        assert said[rank] == expected, f"rank {rank}: {said[rank]}"


def test_the_gloo_transport_posts_every_send_before_any_receive_for_the_all_to_all(monkeypatch) -> None:
    """all_to_all asks for sends first (faster on gloo, see its docstring); a single exchange keeps its receive
    first. The torch.distributed calls are recorded instead of made, on a world of 3 ranks seen from rank 0."""
    import dsgd_teach.runtime.ranks.comm as comm_module
    from dsgd_teach.runtime.ranks.comm import Comm

    posted: list[tuple[str, int]] = []

    class Done:
        def wait(self, timeout: Any = None) -> bool:
            return True

    def post(kind: str) -> Any:
        def op(tensor: torch.Tensor, peer: int, group: Any = None) -> Done:
            posted.append((kind, peer))
            return Done()
        return op

    isend, irecv = post("send"), post("recv")
    fake = SimpleNamespace(isend=isend, irecv=irecv, P2POp=lambda op, tensor, peer, group: SimpleNamespace(
        op=op, tensor=tensor, peer=peer, group=group))
    monkeypatch.setattr(comm_module, "dist", fake)
    comm = Comm(0, WORLD, torch.device("cpu"), 5.0)
    all_to_all(comm, rows_of(0), SPLITS[0], recv_splits(0))
    sends = [kind for kind, _ in posted].index("recv")
    assert [kind for kind, _ in posted] == ["send"] * sends + ["recv"] * (len(posted) - sends)
    assert [peer for kind, peer in posted if kind == "send"] == [2]  # rank 0 has no rows for rank 1
    assert [peer for kind, peer in posted if kind == "recv"] == [1]  # and rank 2 none for rank 0
    posted.clear()
    comm.exchange(torch.ones(2), 1, torch.zeros(2), 2, step=0, phase="ring")
    assert posted == [("recv", 2), ("send", 1)]


def test_the_local_copy_runs_while_the_messages_travel(monkeypatch) -> None:
    """exchange_all runs `meanwhile` once every send and receive is posted and before any wait (gloo's transport),
    and once before the exchanges on a transport that runs them in turn; all_to_all copies its own block so."""
    import dsgd_teach.runtime.ranks.comm as comm_module
    from dsgd_teach.runtime.ranks.comm import Comm
    from dsgd_teach.runtime.ranks.thread_group import ThreadTransport

    events: list[str] = []

    class Done:
        def wait(self, timeout: Any = None) -> bool:
            events.append("wait")
            return True

    def post(kind: str) -> Any:
        def op(tensor: torch.Tensor, peer: int, group: Any = None) -> Done:
            events.append(kind)
            return Done()
        return op

    fake = SimpleNamespace(isend=post("send"), irecv=post("recv"), P2POp=lambda op, tensor, peer, group:
                           SimpleNamespace(op=op, tensor=tensor, peer=peer, group=group))
    monkeypatch.setattr(comm_module, "dist", fake)
    comm = Comm(1, WORLD, torch.device("cpu"), 5.0)
    pairs = [(torch.ones(2), 2, torch.zeros(2), 0), (torch.ones(2), 0, torch.zeros(2), 2)]
    comm.exchange_all(pairs, phase="t", sends_first=True, meanwhile=lambda: events.append("meanwhile"))
    assert events == ["send", "send", "recv", "recv", "meanwhile", "wait", "wait", "wait", "wait"]
    handed: list[Any] = []
    original = Comm.exchange_all
    monkeypatch.setattr(Comm, "exchange_all", lambda self, pairs, **kw: (handed.append(kw.get("meanwhile")),
                                                                          original(self, pairs, **kw)))
    events.clear()
    out = all_to_all(Comm(0, WORLD, torch.device("cpu"), 5.0), rows_of(0), SPLITS[0], recv_splits(0))
    assert handed == [handed[0]] and handed[0] is not None
    own = slice(0, SPLITS[0][0])
    assert torch.equal(out[own], rows_of(0)[own])  # the copy the exchange ran meanwhile

    calls: list[str] = []
    monkeypatch.setattr(ThreadTransport, "exchange", lambda self, *args: calls.append("exchange"))
    threads = Comm(1, WORLD, torch.device("cpu"), 5.0, transport=ThreadTransport.__new__(ThreadTransport))
    threads.exchange_all(pairs, phase="t", meanwhile=lambda: calls.append("meanwhile"))
    assert calls == ["meanwhile", "exchange", "exchange"]
