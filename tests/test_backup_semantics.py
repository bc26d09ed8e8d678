"""One semantics for backup workers on the cluster and in the simulator: a worker still in its injected delay when
the step completes is cancelled. Checked against the order-statistic formula and against the cluster itself."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dsgd_teach.runtime.clusters.cluster import start_client
from dsgd_teach.sim import from_config, run_simulated
from dsgd_teach.sim.calibrate import fit_machine
from dsgd_teach.sim.papers import order_statistic_check
from dsgd_teach.syncasync import SyncConfig, run_sync

pytestmark = pytest.mark.timeout(240)

# Per rank, per step: every step has one long delay (cancelled once the other two are in) and its second-fastest
# delay is >= 0.5 s, so the step time is set by the scripted, trace-labelled delays and not by this machine.
SCRIPT = [
    [1.2, 0.5, 0.6, 1.2, 0.5, 0.6],
    [0.5, 1.2, 0.5, 0.6, 1.2, 0.5],
    [0.5, 0.6, 1.2, 0.5, 0.7, 1.2],
]

def test_chen_formula_agrees_with_the_simulator_on_the_same_draws() -> None:
    table = order_statistic_check(total=100, backups=4, steps=30)
    assert table.simulated_s.mean() == pytest.approx(table.formula_s.mean(), rel=0.05)
    np.testing.assert_allclose(table.simulated_s, table.formula_s, rtol=0.05)
    assert (table.formula_s < table.slowest_s).all()


def test_scripted_backups_cancel_the_same_gradients_on_the_cluster_and_in_the_simulator() -> None:
    """Every step aggregates the two ranks with the shorter delays and cancels the third, on both, and waits for the
    second-fastest delay. Step times are not compared: on a busy machine they carry the load (chapter 11's fit of
    this machine is tested in test_sim); which gradient each step takes is what the two must agree on."""
    config = SyncConfig(workers=2, backups=1, steps=len(SCRIPT[0]), batch_size=16, delay_script=SCRIPT, eval_every=6)
    with dask.config.set({"distributed.worker.memory.pause": False}), start_client(3, quiet=True, use_gpu=False) as c:
        real = run_sync(config, c)
    machine = fit_machine(real.trace)  # compute time and per-step overhead of this machine, as chapter 11 does
    sim = run_simulated(from_config(config, **machine))
    delays = np.array(SCRIPT)  # rank x step
    slowest = delays.argmax(axis=0)
    want_cancelled = [(step, int(rank)) for step, rank in enumerate(slowest)]
    want_aggregated = [sorted(set(range(3)) - {int(rank)}) for rank in slowest]
    second_fastest = np.sort(delays, axis=0)[1]
    for name, result in (("cluster", real), ("simulator", sim)):
        trace = result.trace
        rank = "worker" if "worker" in trace else "rank"
        cut = trace[trace.event == "cancelled"]
        assert sorted(zip(cut.step.astype(int), cut[rank].astype(int), strict=True)) == want_cancelled, (name, cut)
        updates = trace[trace.event == "update"].sort_values("step")
        aggregated = [sorted(int(r) for r in str(a).split(",")) for a in updates.aggregated]
        assert aggregated == want_aggregated, (name, aggregated)
        assert (updates.step_s.to_numpy() >= second_fastest).all(), (name, updates.step_s.tolist())
        assert result.summary["cancelled"] == len(SCRIPT[0])  # one long delay cut short per step
