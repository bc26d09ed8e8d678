"""Chapter 09 on the models learners write (norms, embeddings, tied, frozen, unused and sometimes-used parameters):
OverlappedDDP and ZeroAdam equal PyTorch's own DDP, ZeroRedundancyOptimizer and fully_shard at N = 2, 3, 4, or
raise a ValueError naming the parameter; a stage-3 model is read through ZeroAdam, never from freed memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from distributed import Client

from dsgd_teach.runtime.ranks.comm import Comm
from dsgd_teach.runtime.ranks.group import plan_group, run_in_group
from dsgd_teach.sharded import OverlappedDDP, ZeroAdam, zero_formula
from dsgd_teach.sharded.toy import batch, flat_params
from dsgd_teach.sharded.zoo import make
from dsgd_teach.trace import TraceRecorder

pytestmark = pytest.mark.timeout(600)
STEPS, ROWS, TOL = 3, 8, 1e-6


def _loss(model: torch.nn.Module, step: int, rank: int) -> torch.Tensor:
    x, y = batch(0, step, rank, ROWS)
    dtype = next(model.parameters()).dtype
    return torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)


def _ddp_cases(ctx, comm):  # noqa: ANN001 - run_in_group's rank signature
    """(kind, allreduce, find_unused) -> our parameters and torch DDP's after STEPS momentum-SGD steps, or our error."""
    torch.set_num_threads(1)
    out = {}
    cases = [("norm_embedding", "library", False), ("tied", "ring", False), ("frozen", "library", False),
             ("unused", "library", True), ("unused", "ring", True), ("sometimes", "library", True),
             ("sometimes", "ring", True), ("unused", "library", False)]
    for kind, allreduce, find_unused in cases:
        ours, theirs = make(kind), make(kind)
        ddp = OverlappedDDP(ours, comm, 256, allreduce, find_unused_parameters=find_unused)  # small: several buckets
        ref = torch.nn.parallel.DistributedDataParallel(theirs, bucket_cap_mb=256 / 2**20,
                                                        find_unused_parameters=find_unused)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ours, theirs)]
        try:
            for step in range(STEPS):
                for net, opt in ((ddp, opts[0]), (ref, opts[1])):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(net(batch(0, step, comm.rank, ROWS)[0]),
                                                 batch(0, step, comm.rank, ROWS)[1]).backward()
                    if net is ddp:
                        ddp.finish()
                    opt.step()
            out[(kind, allreduce, find_unused)] = (flat_params(ours).numpy(), flat_params(theirs).numpy())
        except ValueError as exc:
            out[(kind, allreduce, find_unused)] = str(exc)
            break  # the other ranks' collectives no longer match: this case is the last
        finally:
            ddp.close()
    return out


def _zero_cases(ctx, comm, stages):  # noqa: ANN001
    """(kind, stage) -> ZeroAdam's parameters and torch's own sharding's after STEPS Adam steps, or our error."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.set_num_threads(1)
    out = {}
    for kind in ("norm_embedding", "tied", "frozen"):
        for stage in stages:
            ours, theirs = make(kind), make(kind)
            zero = ZeroAdam(ours, comm, stage, "library" if stage % 2 else "ring", lr=1e-2)
            if stage == 3:
                fully_shard(theirs)
                ref, opt = theirs, torch.optim.Adam(theirs.parameters(), lr=1e-2, foreach=False)
            else:
                ref = torch.nn.parallel.DistributedDataParallel(theirs)
                trainable = [p for p in theirs.parameters() if p.requires_grad]
                opt = (ZeroRedundancyOptimizer(trainable, optimizer_class=torch.optim.Adam, lr=1e-2, foreach=False)
                       if stage == 1 else torch.optim.Adam(trainable, lr=1e-2, foreach=False))
            for step in range(STEPS):
                _loss(ours, step, comm.rank).backward()
                zero.step()
                opt.zero_grad()
                _loss(ref, step, comm.rank).backward()
                opt.step()
            mine = zero.full_params().numpy()
            zero.close()
            if stage == 3:
                theirs_flat = torch.cat([p.full_tensor().detach().reshape(-1) for p in theirs.parameters()])
            else:
                theirs_flat = flat_params(theirs)
            out[(kind, stage)] = (mine, theirs_flat.numpy())
    return out


def _adam_oracle(kind: str, world: int) -> np.ndarray:
    """Single-process Adam on the global batch, a parameter no rank used counted with a zero gradient."""
    model = make(kind)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2, foreach=False)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(_loss(model, step, r) for r in range(world)) / world
        loss.backward()
        for p in model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
    return flat_params(model).numpy()


def _zero_unused(ctx, comm, unused):  # noqa: ANN001
    """Every stage on the models with an unused or sometimes-used layer: parameters, or the error (one per stage).

    A layer only some ranks run is left out of stage 3, which gathers each layer when the layer runs: every rank
    must run the same layers in the same order (FSDP asks the same)."""
    torch.set_num_threads(1)
    out = {}
    for kind in ("unused", "sometimes"):
        for stage in range(4 if kind == "unused" else 3):
            model = make(kind)
            zero = ZeroAdam(model, comm, stage, "library", lr=1e-2, unused=unused)
            try:
                for step in range(STEPS):
                    _loss(model, step, comm.rank).backward()
                    zero.step()
                out[(kind, stage)] = zero.full_params().numpy()
            except ValueError as exc:
                out[(kind, stage)] = str(exc)
                return out  # the other ranks' collectives no longer match
            finally:
                zero.close()
    return out


def _run(client: Client, world: int, fn, *args):  # noqa: ANN001
    spec = plan_group(client, world, "cpu", 20.0)
    outs, _ = run_in_group(client, spec, fn, [args] * world, TraceRecorder(), 300.0)
    return outs


@pytest.fixture(scope="module")
def clients(cluster4: Client) -> Client:
    return cluster4


@pytest.mark.parametrize("world", [2, 3, 4])
def test_overlapped_ddp_equals_torch_ddp_or_names_the_unused_parameter(clients, world):
    outs = _run(clients, world, _ddp_cases)
    for key, got in outs[0].items():
        if key == ("unused", "library", False):
            assert isinstance(got, str) and "spare.weight" in got and "find_unused_parameters=True" in got, got
            continue
        assert not isinstance(got, str), (key, got)
        ours, theirs = got
        assert np.abs(ours - theirs).max() <= TOL, (world, key, np.abs(ours - theirs).max())
    assert ("unused", "library", False) in outs[0]  # every case ran, the error case last


@pytest.mark.parametrize("world", [2, 3, 4])
def test_zero_equals_torch_sharding_on_norms_embeddings_tied_and_frozen_parameters(clients, world):
    outs = _run(clients, world, _zero_cases, (0, 1, 2, 3))
    for rank_out in outs:
        for key, (ours, theirs) in rank_out.items():
            assert np.abs(ours - theirs).max() <= TOL, (world, key, np.abs(ours - theirs).max())
    frozen = make("frozen")
    start = flat_params(frozen).numpy()
    mask = np.concatenate([np.full(p.numel(), p.requires_grad) for p in frozen.parameters()])
    for stage in range(4):
        after = outs[0][("frozen", stage)][0]
        assert np.array_equal(after[~mask], start[~mask]) and not np.allclose(after[mask], start[mask]), stage


@pytest.mark.parametrize("world", [2, 3, 4])
def test_zero_with_an_unused_parameter_names_it_or_counts_it_as_zero(clients, world):
    errors = _run(clients, world, _zero_unused, "error")
    assert all("spare.weight" in v and "unused='zero'" in v for o in errors for v in o.values()), errors
    zeros = _run(clients, world, _zero_unused, "zero")
    for kind in ("unused", "sometimes"):
        expect = _adam_oracle(kind, world)
        for stage in range(4 if kind == "unused" else 3):
            got = zeros[0][(kind, stage)]
            assert np.abs(got - expect).max() <= TOL, (world, kind, stage, np.abs(got - expect).max())


def _read_stage3(ctx, comm, precision):  # noqa: ANN001
    """After a stage-3 step: what plain reads of the model raise, and the values ZeroAdam's readers give."""
    torch.set_num_threads(1)
    model = make("norm_embedding")
    zero = ZeroAdam(model, comm, 3, "library", precision=precision, lr=1e-2)
    _loss(model, 0, comm.rank).float().backward()
    zero.step()
    raised = []
    for read in (lambda: model.out.weight.sum(), lambda: model.out.weight.detach().float().numpy(),
                 lambda: model.state_dict(), lambda: repr(model.norm.weight)):
        try:
            read()
            raised.append("")
        except RuntimeError as exc:
            raised.append(str(exc))
    with zero.gathered():
        inside = model.out.weight.detach().float().clone()
    state = zero.state_dict()
    full = zero.full_params()
    zero.close()
    return raised, inside, state["out.weight"].float(), full


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_stage3_model_is_read_through_zero_adam_with_a_clear_message_otherwise(client, precision):
    outs = _run(client, 2, _read_stage3, precision)
    for raised, inside, state, full in outs:
        assert all("zero.gathered()" in r and "ZeRO stage 3" in r for r in raised), raised
        assert torch.equal(inside, state) and inside.abs().sum() > 0
        assert torch.equal(outs[0][3], full)  # every rank gathers the same parameters


def test_formula_honours_fp32_and_mixed_precision():
    comm = Comm(0, 1, torch.device("cpu"), 10.0)
    for precision, mixed in (("fp32", False), ("bf16", True)):
        zero = ZeroAdam(make("norm_embedding"), comm, 1, "library", precision=precision)
        psi = sum(u.padded for u in zero.units)
        assert zero.formula() == zero_formula(psi, 1, 1, mixed=mixed)
        assert zero.formula(mixed=not mixed) != zero.formula()
    assert zero_formula(100, 4, 0, mixed=False) == {"params": 400, "grads": 400, "optimizer": 800, "total": 1600}
    assert zero_formula(100, 4, 3, mixed=False)["total"] == 1600 / 4


def test_bad_arguments_and_a_model_with_nothing_to_train_are_named():
    comm = Comm(0, 1, torch.device("cpu"), 10.0)
    for kwargs, field in (({"stage": 4}, "stage"), ({"how": "tree"}, "how"), ({"precision": "fp8"}, "precision"),
                          ({"unused": "skip"}, "unused")):
        with pytest.raises(ValueError, match=field):
            ZeroAdam(make("tied"), comm, **kwargs)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ZeroAdam(make("tied").requires_grad_(False), comm)
    model = make("tied")
    ZeroAdam(model, comm, 2, "library")
    _loss(model, 0, 0).backward()
    with pytest.raises(ValueError, match="backward ran twice"):
        _loss(model, 1, 0).backward()


def _unused_then_used(ctx, comm):  # noqa: ANN001
    """A parameter the forward did not reach, then given a gradient through the loss: PyTorch's DDP refuses it too."""
    model = make("unused")
    ddp = OverlappedDDP(model, comm, 256, "library", find_unused_parameters=True)
    x, y = batch(0, 0, comm.rank, ROWS)
    loss = torch.nn.functional.mse_loss(ddp(x), y) + 0.01 * model.spare.weight.sum()
    try:
        loss.backward()
        return ""
    except RuntimeError as exc:
        return str(exc)
    finally:
        ddp.close()


def test_a_parameter_found_unused_that_then_gets_a_gradient_is_an_error_not_a_lost_gradient(client):
    outs = _run(client, 2, _unused_then_used)
    assert all("spare.weight" in o and "found unused" in o for o in outs), outs
