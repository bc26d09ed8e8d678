"""Overlapped bucketed DDP on the live cluster: equal to torch's DDP, accumulation equal to a larger batch, overlap seen."""

from __future__ import annotations

import numpy as np
import pytest

from dsgd_teach.sharded import DDPConfig, assign_buckets, run_ddp
from dsgd_teach.sharded.toy import make_mlp

pytestmark = pytest.mark.timeout(120)


def test_buckets_fill_in_reverse_order_and_never_split_a_parameter():
    assert assign_buckets([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    assert assign_buckets([4, 100, 4], 8) == [[2, 1], [0]]
    assert assign_buckets([4, 4, 4], 0) == [[2], [1], [0]]
    assert sorted(i for b in assign_buckets(list(range(1, 30)), 17) for i in b) == list(range(29))


@pytest.mark.parametrize("allreduce", ["ring", "library"])
@pytest.mark.parametrize("bucket_mb", [0.0, 0.01, 1.0])
def test_overlapped_ddp_equals_torch_ddp(client, allreduce, bucket_mb):
    r = run_ddp(DDPConfig(allreduce=allreduce, bucket_mb=bucket_mb, steps=3, compare_torch=True), client)
    assert r.summary["steps"] == 3
    assert r.summary["max_diff_vs_torch_ddp"] <= 1e-6, r.summary
    assert r.summary["max_rank_divergence"] == 0.0
    buckets = r.trace[(r.trace.event == "bucket") & (r.trace.step == 0) & (r.trace.worker == 0)]
    sizes = [4 * p.numel() for p in make_mlp(64, 4).parameters()]
    assert len(buckets) == len(assign_buckets(sizes, int(bucket_mb * 2**20))) == {0.0: 8, 0.01: 3, 1.0: 1}[bucket_mb]
    assert r.summary["bytes_per_step"] == 4 * r.summary["params"]  # 2 (N-1)/N * 4 bytes * Psi at N = 2


@pytest.mark.parametrize("allreduce", ["ring", "library"])
def test_accumulating_k_microbatches_equals_one_k_times_larger_batch(client, allreduce):
    small = run_ddp(DDPConfig(allreduce=allreduce, batch_size=4, accumulate=4, steps=3), client)
    large = run_ddp(DDPConfig(allreduce=allreduce, batch_size=16, accumulate=1, steps=3), client)
    np.testing.assert_allclose(small.params, large.params, rtol=0, atol=1e-6)
    assert small.summary["bytes_per_step"] == large.summary["bytes_per_step"]  # only the last microbatch talks


def test_buckets_start_while_backward_runs_only_when_overlapped(client):
    for overlap in (True, False):
        r = run_ddp(DDPConfig(allreduce="library", bucket_mb=0.0, steps=3, overlap=overlap, width=256), client)
        t = r.trace
        for (step, rank), bwd in t[t.event == "backward"].groupby(["step", "worker"]):
            starts = t[(t.event == "bucket") & (t.step == step) & (t.worker == rank)].start
            early = int((starts < float(bwd.end.iloc[0])).sum())
            assert (early >= 1) if overlap else (early == 0), (overlap, step, rank, early)


def test_config_names_the_bad_field():
    with pytest.raises(ValueError, match="accumulate"):
        DDPConfig(accumulate=0)
    with pytest.raises(ValueError, match="allreduce"):
        DDPConfig(allreduce="tree")


@pytest.mark.parametrize("allreduce", ["ring", "library"])
def test_back_to_back_baseline_runs_alongside_and_agrees(client, allreduce):
    """The bench's baseline: every bucket after backward, on a copy, step by step (here in one bucket while ours
    overlaps several); the same parameters as ours and torch's."""
    r = run_ddp(DDPConfig(allreduce=allreduce, bucket_mb=0.01, steps=3, compare_back_to_back=True, compare_torch=True,
                          back_to_back_bucket_mb=1.0), client)
    b2b = r.trace[r.trace.event == "back_to_back"]
    assert len(b2b) == 3 * 2 and (b2b.allreduce_s > 0).all() and (b2b.backward_s > 0).all()
    ours = r.trace[r.trace.event == "bucket"].groupby(["step", "worker"]).size()
    assert (b2b.buckets == 1).all() and (ours > 1).all()
    assert r.summary["max_diff_vs_back_to_back"] <= 1e-6 and r.summary["max_diff_vs_torch_ddp"] <= 1e-6, r.summary
