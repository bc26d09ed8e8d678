"""The delay-tolerant rules on the live cluster: chapter 04's async server and chapter 03's shard apply each gradient
with the delay they observed, so the trace alone replays to the final parameters."""

from __future__ import annotations

import numpy as np
import pytest

from dsgd_teach.ps import DownpourConfig, run_downpour
from dsgd_teach.syncasync import AsyncConfig, run_async
from dsgd_teach.syncasync.replay import replay_async

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize(("server", "optimizer"), [("gate", "adarevision"), ("ps", "dcasgd")])
def test_async_rule_on_the_cluster_replays_from_its_trace(client, server: str, optimizer: str) -> None:
    script = [[0.0, 0.05, 0.0, 0.1] * 4, [0.03, 0.0] * 8]  # injected delays, so pushes really are stale
    config = AsyncConfig(workers=2, steps=24, lr=0.3, batch_size=16, eval_every=12, server=server,
                         optimizer=optimizer, dc_lambda=1.0, delay_script=script)
    result = run_async(config, client)
    pushes = result.trace[result.trace.event == "push"]
    assert len(pushes) >= config.steps and (pushes.staleness > 0).any()
    np.testing.assert_allclose(result.params, replay_async(config, result.trace), rtol=1e-4, atol=1e-5)

def test_downpour_runs_adarevision_on_the_shards(client) -> None:
    result = run_downpour(DownpourConfig(replicas=2, shards=2, steps=20, optimizer="adarevision", eval_every=10),
                          client)
    evals = result.trace[result.trace.event == "eval"]
    assert result.summary["updates"] == 40 and evals.train_loss.iloc[-1] < evals.train_loss.iloc[0]
