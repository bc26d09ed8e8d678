"""Asynchronous SGD on the cluster: every worker pushes as soon as its gradient is ready, nobody waits.

Each gradient was computed from parameters some updates old; its staleness (version_applied - 1 - version_read)
is measured exactly at the server. The server's update rule (`optimizer`, shared with chapter 03 and the
simulator: SGD, AdaGrad, AdaRevision, delay-compensated ASGD, or the staleness-aware step lr / (staleness + 1)
of Zhang et al. 2015) uses that measured delay; a staleness bound (StalenessGate) caps it. The default server is
this chapter's AsyncServer actor, which decides both atomically when a gradient lands; server="ps" reuses
chapter 03's ShardedServer instead (every rule, but no staleness bound).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from distributed import Client

from ..config import check_bool, check_choice, check_float, check_int
from ..models import loss_and_grad
from ..problem import get_problem
from ..ps.optimizers import DEFAULT_DC_LAMBDA, OPTIMIZERS
from ..runtime.clusters.workers import get_workers
from ..runtime.ranks.live import WorkerContext, pick_workers, run_live
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, stat
from .actors import AsyncServer
from .ps_adapter import PsAsAsyncServer
from .settings import ChapterConfig, EvalRecorder, summarize
from .step_server import ParameterServer, record_async_push

SERVERS = ("gate", "ps")


@dataclass(frozen=True)
class AsyncConfig(ChapterConfig):
    """Asynchronous SGD: `steps` updates in total from `workers` processes; a server rule and a staleness bound.

    `optimizer` is the server's update rule (one of OPTIMIZERS); `staleness_aware=True` is the same as
    optimizer="staleness_aware". `dc_lambda` is delay-compensated ASGD's lambda.
    """

    staleness_aware: bool = False
    staleness_bound: int | None = None
    server: str = "gate"
    optimizer: str = "sgd"
    dc_lambda: float = DEFAULT_DC_LAMBDA

    def validate(self) -> None:
        super().validate()
        check_bool("staleness_aware", self.staleness_aware)
        if self.staleness_bound is not None:
            check_int("staleness_bound", self.staleness_bound, 0, 1000)
        check_choice("server", self.server, SERVERS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_float("dc_lambda", self.dc_lambda, 0.0, 1000.0)
        if self.staleness_aware and self.optimizer not in ("sgd", "staleness_aware"):
            raise ValueError(
                f"staleness_aware=True is optimizer='staleness_aware'; it cannot be combined with {self.optimizer!r}"
            )
        if self.server == "ps" and self.staleness_bound is not None:
            raise ValueError("server='ps' has no staleness gate; use server='gate' for staleness_bound")

    @property
    def rule(self) -> str:
        """The server's update rule (staleness_aware=True selects 'staleness_aware')."""
        return "staleness_aware" if self.staleness_aware else self.optimizer


def async_worker(ctx: WorkerContext, config: AsyncConfig, server: Any) -> int:
    """One rank of asynchronous SGD: read the current w, compute a minibatch gradient, push it; the server applies
    it at once, never waiting for the others. Returns the number of gradients this rank pushed."""
    problem = get_problem(config.problem)
    shard = problem.train_shard(ctx.rank, config.world)
    delays = config.delay_model()
    ps = ParameterServer(server, ctx, config.timeout_s)
    ps.join(ctx.rank)  # start together: nobody races ahead while the others load
    k = 0
    while not ps.stopping():
        t0 = time.perf_counter()
        current = ps.pull(ctx.rank)  # waits while a staleness gate holds this rank back
        if not current.running:
            break
        t_begin, t1 = time.time() - ctx.t0, time.perf_counter()
        idx = batch_indices(shard.n_samples, config.batch_size, k, config.seed + ctx.rank)
        loss, grad = loss_and_grad(problem.model, current.w, shard.X[idx], shard.y[idx])
        compute_s = time.perf_counter() - t1
        delay = delays.delay(ctx.rank, k)
        if delay > 0:
            time.sleep(delay)  # injected straggler delay, recorded as injected_delay
        t2 = time.perf_counter()
        receipt = ps.push(ctx.rank, grad)  # applied at once: w <- w - eta * grad (scaled by the server's rule)
        if receipt is None:
            break
        comm_s = (t1 - t0) + (time.perf_counter() - t2)
        record_async_push(ctx, k, receipt, loss, current.w, t_begin, compute_s, delay, comm_s)
        k += 1
    return k


def run_async(config: AsyncConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """Run asynchronous SGD on the cluster and return its trace (one "push" event per applied gradient)."""
    get_workers(client, config.world, policy="present", instead="use fewer workers/backups")
    problem = get_problem(config.problem)
    recorder = EvalRecorder(problem, on_update)
    t_start = time.perf_counter()
    budget = config.timeout_s + config.steps * (0.5 + 20 * config.severity) / config.workers
    if config.server == "ps":
        from ..ps import ShardedServer

        server = ShardedServer.start(
            client, problem.init_params, 1, optimizer=config.rule, lr=config.lr, dc_lambda=config.dc_lambda
        )
        try:
            adapter = PsAsAsyncServer(server, config.steps, config.eval_every, config.rule == "staleness_aware")
            _, stopped = run_live(client, async_worker, [(config, adapter)] * config.world, recorder, timeout_s=budget)
            params, version = server.pull()[0], server.pull()[1][0]
        finally:
            server.close()
    else:
        future = client.submit(
            AsyncServer, problem.init_params, config.lr, config.steps, config.staleness_bound,
            config.staleness_aware, config.eval_every, world=config.world, optimizer=config.optimizer,
            dc_lambda=config.dc_lambda, actor=True, pure=False,
            workers=pick_workers(client, 1), allow_other_workers=False,
        )
        server = future.result(timeout=config.timeout_s)
        try:
            _, stopped = run_live(client, async_worker, [(config, server)] * config.world, recorder, timeout_s=budget)
            params, version = server.report().result(timeout=30)
        finally:
            try:
                server.stop_all().result(timeout=5)
            except Exception:  # the actor's worker may be gone already; nothing left to wake then
                pass
            future.release()
    trace = recorder.frame()
    pushes = trace[trace.event == "push"]
    summary = summarize(trace, t_start, {
        "updates": int(version),
        "mean_staleness": stat(pushes, "staleness", "mean"),
        "max_staleness": int(pushes.staleness.max()) if len(pushes) else 0,
        "bytes_sent": int(pushes.bytes_sent.sum()) if len(pushes) else 0,
    })
    return Result(config, trace, summary, params, stopped)
