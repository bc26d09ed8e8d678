"""Ring attention (context parallelism) equals full causal attention, forward and backward, balanced or not.

Ranks are threads of one process talking through the course's Comm (runtime/ranks/thread_group.py), so every message the
ring sends goes through Comm.exchange and is logged; the oracle is the model's own causal_attention.
"""

from __future__ import annotations

import pytest
import torch

from dsgd_teach.runtime.ranks.thread_group import RankFailed, run_threads
from dsgd_teach.transformer.model import GPTShape, build_gpt, causal_attention, lm_loss
from dsgd_teach.transformer.ring_attention import (
    attend_by_ring,
    block_attention,
    chunk_ids,
    imbalance,
    merge,
    positions,
    ring_attention,
    ring_attention_bytes,
    shard_sequence,
    unshard_sequence,
    work_per_rank,
)

B, A, S, D = 2, 3, 16, 8  # batch, heads, sequence, head width


def qkv_grad(seed: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    """q, k, v and an upstream gradient dO, [B, a, s, h/a] each."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, A, S, D, generator=g, dtype=dtype) for _ in range(4))


def run_ring(world: int, balanced: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             grad: torch.Tensor) -> tuple[list[torch.Tensor], list[dict[str, int]], list[list[dict]]]:
    """Every rank's ring attention on its shard; (output, dq, dk, dv) unsharded, work per rank, logs per rank."""

    def rank(comm, r):
        mine = [shard_sequence(t, r, world, balanced).clone().requires_grad_() for t in (q, k, v)]
        work: dict[str, int] = {}
        out = ring_attention(comm, *mine, balanced=balanced, work=work)
        out.backward(shard_sequence(grad, r, world, balanced))
        return [out.detach()] + [t.grad for t in mine], work

    done = run_threads(rank, list(range(world)), timeout_s=30.0)
    full = [unshard_sequence([res[0][i] for res in done.results], balanced) for i in range(4)]
    return full, [res[1] for res in done.results], done.logs


def full_attention(q, k, v, grad) -> list[torch.Tensor]:
    """The oracle: causal_attention on the whole sequence, output and gradients."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = causal_attention(*leaves)
    out.backward(grad)
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("balanced", [False, True])
def test_ring_attention_equals_full_causal_attention_forward_and_backward(world: int, balanced: bool) -> None:
    ring_against_oracle(world, balanced, seed=world + 10 * balanced)


def ring_against_oracle(world: int, balanced: bool, seed: int, names: tuple[str, ...] = ("output", "dq", "dk", "dv"),
                        ) -> None:
    """AssertionError naming the first of `names` (output, dq, dk, dv) where the ring differs from full attention."""
    q, k, v, grad = qkv_grad(seed=seed)
    got, _, _ = run_ring(world, balanced, q, k, v, grad)
    for name, ours, ref in zip(("output", "dq", "dk", "dv"), got, full_attention(q, k, v, grad), strict=True):
        if name in names:
            torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10, msg=f"{name} differs (N_cp={world})")


# --- negative controls: break one thing and the oracle comparison must fail -------------------------------------


def test_the_oracle_catches_a_merge_without_the_rescale(monkeypatch) -> None:
    """Adding the blocks' partial outputs without the factors exp(l_i - l) gives a wrong output."""
    from dsgd_teach.transformer import ring_attention as module

    monkeypatch.setattr(module, "merge", lambda o1, l1, o2, l2: (o1 + o2, torch.logaddexp(l1, l2)))
    with pytest.raises(AssertionError, match="output differs"):
        ring_against_oracle(2, True, seed=5)


def test_the_oracle_catches_gradients_that_never_go_home(monkeypatch) -> None:
    """Skip backward's last hop: the forward and dq are still right, dk and dv land on the wrong rank."""
    from dsgd_teach.transformer import ring_attention as module

    real = module.pass_round
    monkeypatch.setattr(module, "pass_round", lambda comm, block, step, phase: block.clone()
                        if phase == "ring-attention grad home" else real(comm, block, step, phase))
    ring_against_oracle(2, True, seed=5, names=("output", "dq"))
    with pytest.raises(AssertionError, match="dk differs"):
        ring_against_oracle(2, True, seed=5)


def test_ring_attention_in_fp32_is_within_fp32_tolerance() -> None:
    q, k, v, grad = qkv_grad(seed=3, dtype=torch.float32)
    got, _, _ = run_ring(4, True, q, k, v, grad)
    for ours, ref in zip(got, full_attention(q, k, v, grad), strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_work_per_rank_is_what_the_ring_computes_and_balancing_evens_it(world: int) -> None:
    q, k, v, grad = qkv_grad(seed=5)
    for balanced in (False, True):
        _, work, _ = run_ring(world, balanced, q, k, v, grad)
        assert [w["scores"] for w in work] == work_per_rank(world, S, balanced)
    # one chunk per rank: rank r computes r + 1 blocks, so the last does N_cp of them while the mean is (N_cp + 1)/2
    assert imbalance(work_per_rank(world, S, False)) == pytest.approx(2 * world / (world + 1))
    assert imbalance(work_per_rank(world, S, True)) == 1.0
    assert work_per_rank(world, S, True) == [(2 * world + 1) * (S // (2 * world)) ** 2] * world


@pytest.mark.parametrize("world", [2, 4])
def test_bytes_each_rank_sends_equal_the_formula(world: int) -> None:
    q, k, v, grad = qkv_grad(seed=7, dtype=torch.float32)
    _, _, logs = run_ring(world, True, q, k, v, grad)
    local = B * A * (S // world) * D
    for log in logs:
        forward = sum(m["bytes"] for m in log if m["direction"] == "send" and m["phase"] == "ring-attention kv")
        assert forward == ring_attention_bytes(world, local, 4, backward=False)
        assert sum(m["bytes"] for m in log if m["direction"] == "send") == ring_attention_bytes(world, local, 4)


def test_the_online_softmax_merge_of_two_key_blocks_is_attention_over_both() -> None:
    q, k, v, _ = qkv_grad(seed=11)
    half = S // 2
    o1, l1 = block_attention(q, k[..., :half, :], v[..., :half, :], diagonal=False)
    o2, l2 = block_attention(q, k[..., half:, :], v[..., half:, :], diagonal=False)
    merged, lse = merge(o1, l1, o2, l2)
    scores = q @ k.transpose(-2, -1) / D**0.5
    torch.testing.assert_close(merged, torch.softmax(scores, dim=-1) @ v)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))


def test_shards_hold_mirrored_chunks_and_their_positions() -> None:
    assert [chunk_ids(r, 4, True) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert positions(1, 2, 8, balanced=True).tolist() == [2, 3, 4, 5]
    assert positions(0, 2, 8, balanced=True).tolist() == [0, 1, 6, 7]
    x = torch.arange(16.0).view(1, 1, 16, 1)
    assert torch.equal(unshard_sequence([shard_sequence(x, r, 4, True) for r in range(4)], True), x)


@pytest.mark.parametrize("balanced", [False, True])
def test_a_gpt_split_by_context_parallelism_gives_the_single_process_loss_and_gradients(balanced: bool) -> None:
    shape, world = GPTShape(vocab=16, seq_len=16, width=16, heads=2, layers=2), 2
    tokens = torch.randint(0, 16, (2, 17), generator=torch.Generator().manual_seed(0))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    oracle = build_gpt(shape, seed=3).double()
    loss = lm_loss(oracle(inputs), targets)
    loss.backward()

    def rank(comm, model):  # every rank holds the whole model and its piece of every sequence
        r = comm.rank
        mine = [shard_sequence(t, r, world, balanced, dim=1) for t in (inputs, targets)]
        logits = model(mine[0], attend=attend_by_ring(comm, balanced), positions=positions(r, world, 16, balanced))
        piece = lm_loss(logits, mine[1])
        (piece / world).backward()  # the pieces are equal, so the mean of their means is the whole mean
        return piece.detach(), {n: p.grad for n, p in model.named_parameters()}

    models = [build_gpt(shape, seed=3).double() for _ in range(world)]  # built here: torch's RNG is per process
    results = run_threads(rank, models, timeout_s=30.0).results
    torch.testing.assert_close(sum(r[0] for r in results) / world, loss.detach())
    for name, p in oracle.named_parameters():  # summed over the context ranks, as their allreduce would
        torch.testing.assert_close(sum(r[1][name] for r in results), p.grad, msg=f"gradient of {name}")


def test_bad_inputs_raise_value_errors_naming_the_problem() -> None:
    q, k, v, _ = qkv_grad(seed=1)

    def call(comm, args):
        return ring_attention(comm, *args)

    with pytest.raises(RankFailed) as bad_length:  # 5 positions cannot be a rank's two equal mirrored chunks
        run_threads(call, [(q[..., :5, :], k[..., :5, :], v[..., :5, :])] * 2)
    assert isinstance(bad_length.value.error, ValueError) and "multiple of 2" in str(bad_length.value.error)
    with pytest.raises(RankFailed) as bad_shape:
        run_threads(call, [(q, k[..., :8, :], v)] * 2)
    assert isinstance(bad_shape.value.error, ValueError) and "one shape" in str(bad_shape.value.error)
    with pytest.raises(RankFailed) as three_d:
        run_threads(call, [(q[0], k[0], v[0])] * 2)
    assert isinstance(three_d.value.error, ValueError) and "[B, a, s/N_cp, h/a]" in str(three_d.value.error)
    with pytest.raises(ValueError, match="multiple of 8"):
        shard_sequence(q[..., :12, :], 0, 4, balanced=True)
    with pytest.raises(ValueError, match="rank must be in"):
        chunk_ids(4, 4, True)
