"""The mixture of experts: routing, capacity and drops, the load-balancing loss by hand, and expert parallelism.

The single-process layer is checked against a token-by-token loop written from the papers' definitions; the
expert-parallel layer (ranks as threads over the course's Comm) against the single-process one with groups = N_ep:
same output, same gradients, same drops, and bytes equal to the formula.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from dsgd_teach.runtime.ranks.thread_group import RankFailed, run_threads
from dsgd_teach.transformer.expert_parallel import ExpertParallelMoE, expert_parallel_bytes, expert_range
from dsgd_teach.transformer.experts import MoE, aux_loss_of, expert_capacity, route
from dsgd_teach.transformer.model import GPTShape, build_gpt, lm_loss


def shape(experts: int = 4, top_k: int = 1, capacity_factor: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(width=8, hidden=16, experts=experts, top_k=top_k, capacity_factor=capacity_factor)


def layer(seed: int, groups: int = 1, **kw) -> MoE:
    torch.manual_seed(seed)
    return MoE(shape(**kw), groups=groups).double()


def by_loop(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: each group's tokens claim slots first choice first, in token order; gates as the papers say."""
    out = torch.zeros_like(x)
    per_group = x.shape[0] // moe.groups
    capacity = math.ceil(moe.capacity_factor * per_group * moe.top_k / moe.num_experts)
    for g in range(moe.groups):
        tokens = range(g * per_group, (g + 1) * per_group)
        probs = {t: torch.softmax(moe.router(x[t]), dim=-1) for t in tokens}
        chosen = {t: probs[t].topk(moe.top_k).indices.tolist() for t in tokens}
        taken = [0] * moe.num_experts
        for choice in range(moe.top_k):
            for t in tokens:
                e = chosen[t][choice]
                taken[e] += 1
                if taken[e] > capacity:
                    continue  # dropped: this choice adds nothing
                top = probs[t][chosen[t]]
                gate = top[choice] if moe.top_k == 1 else top[choice] / top.sum()
                out[t] += gate * moe.experts[e](x[t])
    return out


@pytest.mark.parametrize("top_k, capacity_factor, groups", [(1, 1.0, 1), (2, 0.75, 1), (2, 1.0, 2), (1, 8.0, 1)])
def test_moe_equals_the_token_by_token_loop(top_k: int, capacity_factor: float, groups: int) -> None:
    moe = layer(seed=top_k, groups=groups, top_k=top_k, capacity_factor=capacity_factor)
    x = torch.randn(24, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(moe(x), by_loop(moe, x))
    assert sum(moe.stats["tokens_per_expert"]) == 24 * top_k
    assert sum(moe.stats["kept_per_expert"]) + moe.stats["dropped"] == 24 * top_k
    assert max(moe.stats["kept_per_expert"]) <= moe.stats["capacity"] * groups  # capacity is per group
    if capacity_factor == 8.0:
        assert moe.stats["dropped"] == 0


def test_capacity_and_drops_by_hand() -> None:
    # 6 tokens, 3 experts, top-1, C = 1: capacity ceil(6/3) = 2. Five tokens pick expert 0, one picks expert 2.
    logits = torch.tensor([[5.0, 0, 0]] * 5 + [[0, 0, 5.0]])
    r = route(logits, top_k=1, capacity_factor=1.0)
    assert r.capacity == expert_capacity(6, 3, 1, 1.0) == 2
    assert r.keep[:, 0].tolist() == [True, True, False, False, False, True]  # the first two in line get the slots
    assert r.stats(3) == {"tokens_per_expert": [5, 0, 1], "kept_per_expert": [2, 0, 1], "dropped": 3,
                          "dropped_tokens": 3, "capacity": 2}
    # top-2, C = 0.75: capacity ceil(0.75 · 4 · 2 / 3) = 2. Every token's first choice queues before any second
    # choice, so token 2's first choice (expert 1) gets a slot and token 0's second choice of expert 1 does not
    logits = torch.tensor([[3.0, 2.0, 0], [0, 3.0, 2.0], [2.0, 3.0, 0], [3.0, 0, 2.0]])
    r = route(logits, top_k=2, capacity_factor=0.75)
    assert r.expert.tolist() == [[0, 1], [1, 2], [1, 0], [0, 2]] and r.capacity == 2
    assert r.slot.tolist() == [[0, 2], [0, 0], [1, 2], [1, 1]]
    assert r.keep.tolist() == [[True, False], [True, True], [True, False], [True, True]]
    assert expert_capacity(10, 4, 2, 1.25) == 7  # ceil(1.25 · 10 · 2 / 4) = ceil(6.25)


def test_dropped_tokens_leave_the_layer_as_zero_so_the_residual_carries_them() -> None:
    moe = layer(seed=0, capacity_factor=0.1)  # capacity ceil(0.1 · 12 / 4) = 1: most tokens are dropped
    x = torch.randn(12, 8, dtype=torch.float64)
    y = moe(x)
    dropped = (~route(moe.router(x), 1, 0.1).keep[:, 0]).nonzero().view(-1)
    assert len(dropped) == moe.stats["dropped_tokens"] >= 8
    assert torch.equal(y[dropped], torch.zeros_like(y[dropped]))


def test_gates_keep_float64_logits_precision_and_lift_bfloat16_to_float32() -> None:
    logits = torch.randn(12, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
    routing = route(logits, top_k=2, capacity_factor=2.0)
    top = torch.softmax(logits, dim=-1).topk(2, dim=-1).values
    assert routing.gate.dtype == torch.float64
    assert torch.allclose(routing.gate, top / top.sum(dim=-1, keepdim=True), rtol=0, atol=1e-15)
    low = route(logits.to(torch.bfloat16), top_k=1, capacity_factor=2.0)
    assert low.gate.dtype == torch.bfloat16 and torch.isfinite(low.gate.float()).all()


def test_load_balancing_loss_by_hand() -> None:
    # Router probabilities chosen outright (logits = log p); Switch eq. 4-6 with E = 2 experts, T = 4 tokens:
    # first choices 0, 0, 1, 0 -> f = (3/4, 1/4); P = mean p = (0.6, 0.4); aux = 2 (0.75·0.6 + 0.25·0.4) = 1.1
    p = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.2, 0.8], [0.9, 0.1]], dtype=torch.float64)
    assert route(p.log(), 1, 1.0).aux_loss.item() == pytest.approx(1.1)
    uniform = torch.zeros(8, 4)
    assert route(uniform, 1, 1.0).aux_loss.item() == pytest.approx(1.0)  # balanced routing gives 1
    # in two groups the loss is each group's, averaged: (2(1·0.65 + 0·0.35) + 2(0.5·0.55 + 0.5·0.45)) / 2 = 1.15
    assert route(p.log(), 1, 1.0, groups=2).aux_loss.item() == pytest.approx(1.15)


def run_expert_parallel(world: int, top_k: int, capacity_factor: float, seed: int = 0):
    """Single-process MoE (groups = world) and every rank's expert-parallel layer on the same tokens and loss."""
    moe = layer(seed, groups=world, top_k=top_k, capacity_factor=capacity_factor)
    g = torch.Generator().manual_seed(seed + 1)
    x, w = torch.randn(world * 10, 8, generator=g, dtype=torch.float64), torch.randn(world * 10, 8, generator=g,
                                                                                       dtype=torch.float64)
    xs = x.clone().requires_grad_()
    ((moe(xs) * w).sum() + 0.01 * moe.aux_loss).backward()

    def rank(comm, r):
        ep = ExpertParallelMoE(moe, comm=comm)
        mine = x[r * 10 : (r + 1) * 10].clone().requires_grad_()
        y = ep(mine)
        ((y * w[r * 10 : (r + 1) * 10]).sum() + 0.01 * ep.aux_loss / world).backward()
        return y.detach(), mine.grad, ep.router.weight.grad, [p.grad for p in ep.experts.parameters()], ep.stats

    run = run_threads(rank, range(world), timeout_s=30.0)
    return moe, xs, run


@pytest.mark.parametrize("world, top_k, capacity_factor", [(2, 1, 1.0), (2, 2, 0.75), (4, 2, 1.25), (4, 1, 0.5)])
def test_expert_parallel_equals_the_single_process_layer(world: int, top_k: int, capacity_factor: float) -> None:
    moe, xs, run = expert_parallel_against_oracle(world, top_k, capacity_factor)
    res = run.results
    per = 4 // world
    for r, out in enumerate(res):
        owned = [p.grad for e in expert_range(4, world, r) for p in moe.experts[e].parameters()]
        for ours, ref in zip(out[3], owned, strict=True):
            torch.testing.assert_close(ours, ref)
        assert len(out[3]) == 4 * per  # fc and proj weight and bias of each of its experts
    dropped = sum(r[4]["dropped"] for r in res)
    moe(xs.detach())
    assert dropped == moe.stats["dropped"]  # the same drops as the single process


def expert_parallel_against_oracle(world: int, top_k: int, capacity_factor: float):
    """run_expert_parallel; AssertionError naming what differs from the single-process layer (output, the input's
    gradient, the router's gradient summed over the ranks)."""
    moe, xs, run = run_expert_parallel(world, top_k, capacity_factor)
    res = run.results
    torch.testing.assert_close(torch.cat([r[0] for r in res]), moe(xs.detach()), msg="output differs")
    torch.testing.assert_close(torch.cat([r[1] for r in res]), xs.grad, msg="input gradient differs")
    torch.testing.assert_close(sum(r[2] for r in res), moe.router.weight.grad,  # summed over ranks, as dp would
                               msg="router gradient differs")
    return moe, xs, run


# --- negative controls: break one thing and the oracle comparison must fail -------------------------------------


def test_the_oracle_catches_a_dispatch_to_the_wrong_rank(monkeypatch) -> None:
    """Each rank holding its mirror's experts: the all-to-all sends the rows to ranks whose experts are others'."""
    from dsgd_teach.transformer import expert_parallel

    real = expert_parallel.expert_range
    monkeypatch.setattr(expert_parallel, "expert_range", lambda e, w, r: real(e, w, w - 1 - r))
    with pytest.raises(AssertionError, match="output differs"):
        expert_parallel_against_oracle(2, 1, 1.0)


def test_the_oracle_catches_a_dropped_aux_loss(monkeypatch) -> None:
    """The ranks' load-balancing loss left out of their backward: outputs agree, the router's gradient does not."""
    from dsgd_teach.transformer import expert_parallel

    def without_aux(*args, **kw):
        routing = route(*args, **kw)
        routing.aux_loss = routing.aux_loss.detach()
        return routing

    monkeypatch.setattr(expert_parallel, "route", without_aux)
    with pytest.raises(AssertionError, match="input gradient differs|router gradient differs"):
        expert_parallel_against_oracle(2, 1, 1.0)


@pytest.mark.parametrize("world", [2, 4])
def test_bytes_sent_equal_the_formula(world: int) -> None:
    _, _, run = run_expert_parallel(world, top_k=2, capacity_factor=1.0)
    for r, (log, res) in enumerate(zip(run.logs, run.results, strict=True)):
        st = res[4]
        sent = sum(m["bytes"] for m in log if m["direction"] == "send")
        assert sent == expert_parallel_bytes(st["rows_sent"], st["rows_received"], r, 8, 8, experts=4)
        assert st["bytes_sent"] == expert_parallel_bytes(st["rows_sent"], st["rows_received"], r, 8, 8, experts=4,
                                                         backward=False)


def test_a_gpt_with_experts_trains_with_its_aux_loss() -> None:
    model = build_gpt(GPTShape(vocab=16, seq_len=8, width=16, heads=2, layers=2, experts=4, top_k=2), seed=0)
    assert sum(isinstance(m, MoE) for m in model.modules()) == 2
    tokens = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = lm_loss(model(tokens), tokens) + 0.01 * aux_loss_of(model)
    loss.backward()
    assert aux_loss_of(model).item() > 0
    assert model.blocks[0].mlp.router.weight.grad.abs().sum() > 0


def test_bad_inputs_raise_value_errors() -> None:
    with pytest.raises(ValueError, match="top_k"):
        route(torch.zeros(4, 2), top_k=3, capacity_factor=1.0)
    with pytest.raises(ValueError, match="groups"):
        route(torch.zeros(5, 2), top_k=1, capacity_factor=1.0, groups=2)
    with pytest.raises(ValueError, match="experts >= 1"):
        MoE(shape(experts=0))
    moe = layer(seed=0, experts=3)
    with pytest.raises(RankFailed) as failed:
        run_threads(lambda comm, _: ExpertParallelMoE(moe, comm=comm), range(2))
    assert isinstance(failed.value.error, ValueError) and "divide the 3 experts" in str(failed.value.error)
