"""Tensor and sequence parallelism of the GPT: the single-process oracle's loss and gradients, PyTorch's own
parallelize_module on the same ranks, and the bytes each collective sends against the formulas.

All runs share one group of N_tp = 2 spawned processes (one module-scoped fixture): our TP and TP+SP on chapter
05's ring, TP on the library's allreduce, and PyTorch's ColwiseParallel / RowwiseParallel / SequenceParallel plan.
"""

from __future__ import annotations

import datetime
import multiprocessing
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dsgd_teach.runtime.ranks.comm import Comm
from dsgd_teach.runtime.ranks.group import host_store, join_store
from dsgd_teach.transformer.corpus import batch_at, make_corpus
from dsgd_teach.transformer.model import GPTShape, build_gpt, lm_loss
from dsgd_teach.transformer.sequence_parallel import sequence_chunk
from dsgd_teach.transformer.tensor_group import TensorGroup, ring_bytes
from dsgd_teach.transformer.tensor_parallel import TPConfig, shard_block_for_tp, shard_gpt, shard_of

WORLD = 2
SHAPE = GPTShape(vocab=32, seq_len=16, width=32, heads=4, layers=2)
STEPS = 3
RUNS = {"tp": (False, "ring"), "sp": (True, "ring"), "tp_library": (False, "library"),
        "torch_tp": (False, "torch"), "torch_sp": (True, "torch")}


def _numpy(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return o.numpy()
    if isinstance(o, dict):
        return {k: _numpy(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_numpy(v) for v in o]
    return o


def _rank(rank: int, port: int, out: Any) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    from dsgd_teach.transformer.tensor_parallel import tp_rank
    from dsgd_teach.transformer.torch_tp import torch_tp_rank

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=join_store("127.0.0.1", port, WORLD), rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    try:
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        results = {}
        for name, (sp, how) in RUNS.items():
            config = TPConfig(shape=SHAPE, tp=WORLD, sequence_parallel=sp, steps=STEPS)
            if how == "torch":
                results[name] = torch_tp_rank(config, mesh)
            else:
                results[name] = tp_rank(TensorGroup(Comm(rank, WORLD, torch.device("cpu"), 60.0), how), config)
        out.put((rank, _numpy(results)))
    except Exception as exc:  # the test reports it instead of waiting for a result that never comes
        out.put((rank, repr(exc)))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    store = host_store(WORLD)  # listening before the ranks start, on a port the OS gave it
    procs = [ctx.Process(target=_rank, args=(r, store.port, out), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=300) for _ in range(WORLD))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
    for rank, res in got.items():
        assert isinstance(res, dict), f"rank {rank} failed: {res}"
    return got


@pytest.fixture(scope="module")
def oracle() -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """The single-process GPT on the same batches and SGD steps: each step's loss and gradients."""
    model = build_gpt(SHAPE, 0)
    corpus = make_corpus(0, TPConfig().corpus_tokens, SHAPE.vocab)
    losses, grads = [], []
    for step in range(STEPS):
        inputs, targets = batch_at(corpus, step, None, TPConfig().batch, SHAPE.seq_len, 0)
        model.zero_grad()
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-TPConfig().lr)
    return losses, grads


def _loss(ranks: dict[int, dict[str, Any]], run: str, step: int) -> float:
    """The step's loss: rank 0's under TP (every rank has it), the sum of the ranks' shares under SP."""
    shares = [ranks[r][run]["loss"][step] for r in range(WORLD)]
    return sum(shares) if RUNS[run][0] else shares[0]


@pytest.mark.parametrize("run", list(RUNS))
def test_loss_and_gradients_equal_the_single_process_oracle(ranks, oracle, run: str) -> None:
    losses, grads = oracle
    for step in range(STEPS):
        assert _loss(ranks, run, step) == pytest.approx(losses[step], abs=1e-5)
        for r in range(WORLD):
            got = ranks[r][run]["grads"][step]
            assert set(got) == set(grads[step])
            for name, want in grads[step].items():
                np.testing.assert_allclose(got[name], shard_of(name, want, r, WORLD).numpy(), atol=2e-6,
                                           err_msg=f"{run} rank {r} step {step} {name}")


@pytest.mark.parametrize(("ours", "theirs"), [("tp", "torch_tp"), ("sp", "torch_sp")])
def test_ours_equal_pytorchs_parallelize_module_on_every_rank(ranks, ours: str, theirs: str) -> None:
    for r in range(WORLD):
        for step in range(STEPS):
            assert ranks[r][ours]["loss"][step] == pytest.approx(ranks[r][theirs]["loss"][step], abs=1e-6)
            for name, g in ranks[r][theirs]["grads"][step].items():
                np.testing.assert_allclose(ranks[r][ours]["grads"][step][name], g, atol=2e-6, err_msg=name)
        for name, p in ranks[r][theirs]["params"].items():
            np.testing.assert_allclose(ranks[r][ours]["params"][name], p, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("run", ["tp", "sp", "tp_library"])
def test_each_layer_sends_what_the_formulas_say(ranks, run: str) -> None:
    """Shoeybi et al. figures 3 and 4: per layer 2 allreduces forward (g) and 2 backward (f) of B·s·h elements; with SP
    (Korthikanti et al. 4.2.2) each becomes an all-gather and a reduce-scatter of the same K, plus one allreduce of
    the replicated parameters' gradients per step."""
    k = TPConfig().batch * SHAPE.seq_len * SHAPE.width
    sp = RUNS[run][0]
    for r in range(WORLD):
        records = ranks[r][run]["records"][0]
        ops = sorted(rec["op"] for rec in records if rec["op"] != "replicated grads")
        want_ops = ["g backward", "g forward", "g-bar backward", "g-bar forward"] if sp else ["f backward", "g forward"]
        assert ops == sorted(want_ops * (2 * SHAPE.layers))  # two of each per layer: attention and MLP
        for rec in records:
            if rec["op"] == "replicated grads":
                continue
            assert rec["elements"] == k
            assert rec["bytes_sent"] == ring_bytes(rec["collective"], k, WORLD)
        per_layer = sum(rec["bytes_sent"] for rec in records if rec["op"] != "replicated grads") / SHAPE.layers
        assert per_layer == 4 * ring_bytes("allreduce", k, WORLD)
        assert any(rec["op"] == "replicated grads" for rec in records) == sp


def test_bad_splits_raise_valueerror_naming_the_field() -> None:
    with pytest.raises(ValueError, match="heads"):
        TPConfig(shape=GPTShape(width=48, heads=3), tp=2)
    with pytest.raises(ValueError, match="seq_len"):
        TPConfig(shape=GPTShape(seq_len=15), tp=2, sequence_parallel=True)
    TPConfig(shape=GPTShape(seq_len=15), tp=2)  # plain TP does not split the sequence
    with pytest.raises(ValueError, match="seq_len"):
        sequence_chunk(0, 2, 15)
    with pytest.raises(ValueError, match="how"):
        TPConfig(how="tree")
    with pytest.raises(ValueError, match="tp"):
        TPConfig(tp=0)
    group = TensorGroup(Comm(0, 2, torch.device("cpu"), 1.0))  # nothing is sent: the checks come first
    with pytest.raises(ValueError, match="heads"):
        shard_gpt(build_gpt(GPTShape(width=48, heads=3), 0), group)
    with pytest.raises(ValueError, match="heads"):
        shard_block_for_tp(build_gpt(GPTShape(width=48, heads=3), 0).blocks[0], group)
    with pytest.raises(ValueError, match="how"):
        TensorGroup(Comm(0, 2, torch.device("cpu"), 1.0), "tree")


def test_run_tp_on_the_cluster_gives_the_oracles_losses_and_traces_each_steps_bytes(client) -> None:
    from dsgd_teach.transformer.tp_run import run_tp

    config = TPConfig(shape=SHAPE, tp=WORLD, sequence_parallel=True, steps=2, timeout_s=60.0)
    result = run_tp(config, client)
    assert len(result.extras.losses) == 2
    np.testing.assert_allclose(result.extras.losses, result.extras.oracle_losses, atol=1e-5)
    ups = result.trace[result.trace.event == "update"]
    k = config.batch * SHAPE.seq_len * SHAPE.width
    activations = ups.bytes_sent - ups.bytes_replicated_grads
    assert (activations == 4 * SHAPE.layers * ring_bytes("allreduce", k, WORLD)).all()


@pytest.mark.parametrize("sp", [False, True])
def test_four_ranks_on_threads_equal_the_oracle_and_send_what_the_formulas_say(oracle, sp: bool) -> None:
    """N_tp = 4 with chapter 05's ring between threads of this process (runtime/ranks/thread_group.py): no spawn."""

    world = 4
    config = TPConfig(shape=SHAPE, tp=world, sequence_parallel=sp, steps=STEPS)
    run = threads_against_oracle(oracle, world, sp, STEPS)
    k = config.batch * SHAPE.seq_len * SHAPE.width
    for step in range(STEPS):
        for r in range(world):
            records = [rec for rec in run.results[r]["records"][step] if rec["op"] != "replicated grads"]
            assert sum(rec["bytes_sent"] for rec in records) == 4 * SHAPE.layers * ring_bytes("allreduce", k, world)


def threads_against_oracle(oracle, world: int, sp: bool, steps: int):
    """Train `steps` steps of TP (or TP+SP) on `world` threads; AssertionError unless every step's loss and every
    rank's gradients equal the oracle's shards. Returns the run."""
    from dsgd_teach.runtime.ranks.thread_group import run_threads
    from dsgd_teach.transformer.tensor_parallel import tp_rank

    config = TPConfig(shape=SHAPE, tp=world, sequence_parallel=sp, steps=steps)
    run = run_threads(lambda comm, _: tp_rank(TensorGroup(comm, "ring"), config), [None] * world, timeout_s=60.0)
    losses, grads = oracle
    for step in range(steps):
        shares = [run.results[r]["loss"][step] for r in range(world)]
        assert (sum(shares) if sp else shares[0]) == pytest.approx(losses[step], abs=1e-5), f"loss of step {step}"
        for r in range(world):
            for name, want in grads[step].items():
                torch.testing.assert_close(run.results[r]["grads"][step][name], shard_of(name, want, r, world),
                                           atol=2e-6, rtol=0, msg=f"rank {r} step {step} {name}")
    return run


# --- negative controls: break one thing and the oracle comparison must fail -------------------------------------


def test_the_oracle_catches_a_missing_g_allreduce(oracle, monkeypatch) -> None:
    """Without g's allreduce each rank keeps its partial sum of the row-split layers: the loss is wrong."""
    from dsgd_teach.transformer import tensor_parallel

    monkeypatch.setattr(tensor_parallel.SumOverTensorRanks, "forward", staticmethod(lambda ctx, x, group: x.clone()))
    with pytest.raises(AssertionError, match="loss of step 0"):
        threads_against_oracle(oracle, 2, False, 1)


def test_the_oracle_catches_a_missing_f_allreduce(oracle, monkeypatch) -> None:
    """Without f's backward allreduce the forward (and so the loss) is right, but the gradients below each
    column-split layer hold one rank's part only: the gradient comparison fails."""
    from dsgd_teach.transformer import tensor_parallel

    monkeypatch.setattr(tensor_parallel.CopyToTensorRanks, "backward", staticmethod(lambda ctx, grad: (grad, None)))
    with pytest.raises(AssertionError, match="rank 0 step 0"):
        threads_against_oracle(oracle, 2, False, 1)
