"""Federated averaging (McMahan et al. 2017) and its baseline FedSGD, with clients run on the live cluster.

The data stays where it is: N_c clients each own a partition of the training set (rebuilt on the worker from the
seed; never shipped). Each round the server (the driver) samples m = max(1, round(C N_c)) clients, sends each the
global model, and the workers run those clients' local training as dask tasks, several clients per worker. The
server averages the returned models weighted by the clients' sample counts. A client that drops out (on purpose,
with probability `dropout`, or because its worker died) is left out of that round's average and marked in the
trace; the round never waits longer than round_timeout_s.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import pandas as pd
from distributed import Client

from ..models import loss_and_grad
from ..problem import ProblemSpec, get_problem
from ..runtime.clusters.cluster import worker_addresses
from ..runtime.ranks.rounds import collect
from ..sampling import batch_indices
from ..trace import OnUpdate, Result, StopRequested, TraceRecorder, stat
from .config import FedAvgConfig
from .partitions import client_rows


def weighted_average(models: list[np.ndarray], counts: list[int]) -> np.ndarray:
    """The sample-weighted mean sum_k n_k w_k / sum_k n_k (in float64, returned as float32)."""
    if not models or len(models) != len(counts) or min(counts) <= 0:
        raise ValueError("weighted_average needs one positive sample count per model, and at least one model")
    n = np.asarray(counts, dtype=np.float64)
    stacked = np.stack([np.asarray(m, dtype=np.float64) for m in models])
    return ((n / n.sum()) @ stacked).astype(np.float32)


def client_update(spec: ProblemSpec, partition: tuple[int, str, float], k: int, w: np.ndarray, plan: dict[str, Any]
                  ) -> dict[str, Any]:
    """Client k's local training from the global model w; runs on a worker. plan: epochs, batch, lr, mu, seed,
    quit_after (steps after which the client drops out; -1 never) and delay_s (an injected, labelled wait)."""
    t = time.perf_counter()
    problem = get_problem(spec)
    rows = client_rows(spec, *partition)[k]
    X, y = problem.train.X[rows], problem.train.y[rows]
    n = len(rows)
    batch = min(plan["batch"], n)
    steps = plan["epochs"] * -(-n // batch)
    w_global, w_k, losses = w, w.astype(np.float32, copy=True), []
    for step in range(steps):
        if step == plan["quit_after"]:
            return {"client": k, "rows": n, "dropped": True, "steps": step, "compute_s": time.perf_counter() - t}
        idx = batch_indices(n, batch, step, plan["seed"])
        loss, grad = loss_and_grad(problem.model, w_k, X[idx], y[idx])
        if plan["mu"] > 0:  # FedProx: a pull back towards the global model keeps a client from drifting far
            grad = grad + np.float32(plan["mu"]) * (w_k - w_global)
        w_k -= np.float32(plan["lr"]) * grad
        losses.append(loss)
    time.sleep(plan["delay_s"])
    return {"client": k, "rows": n, "dropped": False, "steps": steps, "params": w_k, "loss": float(np.mean(losses)),
            "classes": int(len(np.unique(y))), "compute_s": time.perf_counter() - t}


def sample_clients(config: FedAvgConfig, rnd: int) -> list[int]:
    """The round's m clients, drawn without replacement from a generator seeded by (seed, round)."""
    rng = np.random.default_rng([config.seed, rnd])
    return sorted(int(k) for k in rng.choice(config.clients, config.clients_per_round, replace=False))


def client_plan(config: FedAvgConfig, rnd: int, k: int) -> dict[str, Any]:
    """What client k does in round rnd: E epochs of minibatch SGD (FedAvg) or one full-batch step (FedSGD)."""
    fedsgd = config.algorithm == "fedsgd"
    rng = np.random.default_rng([config.seed, rnd, k, 1])
    quits = config.dropout > 0 and rng.random() < config.dropout
    return {"epochs": 1 if fedsgd else config.local_epochs, "batch": 10**9 if fedsgd else config.batch_size,
            "lr": config.lr, "mu": config.prox_mu, "seed": config.seed + 1000 * rnd + k,
            "quit_after": 1 if quits else -1, "delay_s": config.client_delay_s}


def run_fedavg(config: FedAvgConfig, client: Client, on_update: OnUpdate | None = None) -> Result:
    """FedAvg (or FedSGD) rounds on the cluster; the trace has per-client updates and losses, rounds, evals."""
    recorder = TraceRecorder(on_update)
    problem = get_problem(config.problem)
    partition = (config.clients, config.partition, config.size_skew)
    sizes = [len(r) for r in client_rows(config.problem, *partition)]
    w = problem.init_params.copy()
    stopped, t0, run_id, total_bytes = False, time.perf_counter(), uuid.uuid4().hex[:8], 0
    try:
        for rnd in range(config.steps):
            addresses = worker_addresses(client)
            if not addresses:
                raise RuntimeError("the cluster has no workers left to run clients on")
            chosen = sample_clients(config, rnd)
            pinned = {k: addresses[i % len(addresses)] for i, k in enumerate(chosen)}
            futures = {
                k: client.submit(client_update, config.problem, partition, k, w,
                                 client_plan(config, rnd, k), workers=[pinned[k]],
                                 allow_other_workers=False, pure=False, retries=0, key=f"fedclient-{run_id}-{rnd}-{k}")
                for k in chosen
            }
            recorder.record(step=rnd, event="round_start", round=rnd, clients=len(chosen))
            done, lost = collect(client, futures, pinned, config.round_timeout_s)
            kept = [done[k] for k in chosen if k in done and not done[k]["dropped"]]
            round_bytes = w.nbytes * (len(chosen) + len(kept))  # the model down to every client, back from the kept
            total_bytes += round_bytes
            new_w = weighted_average([r["params"] for r in kept], [r["rows"] for r in kept]) if kept else w
            for r in kept:
                recorder.record(worker=r["client"], step=rnd, event="client_update", round=rnd, loss=r["loss"],
                                rows=r["rows"], classes=r["classes"], local_steps=r["steps"],
                                bytes_sent=2 * w.nbytes, compute_s=r["compute_s"], injected_delay=config.client_delay_s,
                                drift=float(np.linalg.norm(r["params"] - new_w)),
                                delta=float(np.linalg.norm(r["params"] - w)))
            for k in chosen:
                if k in lost or done[k]["dropped"]:
                    why = lost.get(k, "dropped out")
                    recorder.record(worker=k, step=rnd, event="client_lost", round=rnd, reason=why, rows=sizes[k],
                                    bytes_sent=w.nbytes)
            w = new_w
            loss = float(np.average([r["loss"] for r in kept], weights=[r["rows"] for r in kept])) if kept else np.nan
            recorder.record(step=rnd, event="update", round=rnd, loss=loss, version_read=rnd, version_applied=rnd + 1,
                            bytes_sent=round_bytes, cum_bytes=total_bytes, clients_kept=len(kept),
                            clients_lost=len(chosen) - len(kept))
            if (rnd + 1) % config.eval_every == 0 or rnd + 1 == config.steps:
                metrics = problem.evaluate(w)
                recorder.record(step=rnd, event="eval", round=rnd, loss=metrics["train_loss"], cum_bytes=total_bytes,
                                version_applied=rnd + 1, **metrics)
                if config.target_accuracy and metrics["test_accuracy"] >= config.target_accuracy:
                    break
    except StopRequested:
        stopped = True
    return Result(config, recorder.frame(), summarise(recorder.frame(), time.perf_counter() - t0), w, stopped)


def summarise(trace: pd.DataFrame, wall_s: float) -> dict[str, float]:
    """Rounds run, bytes, clients lost, and the last evaluation."""
    updates, evals = trace[trace.event == "update"], trace[trace.event == "eval"]
    return {
        "wall_s": wall_s,
        "rounds": len(updates),
        "bytes_sent": int(updates.bytes_sent.sum()),
        "clients_lost": int((trace.event == "client_lost").sum()),
        "final_train_loss": stat(evals, "train_loss", "last"),
        "final_test_accuracy": stat(evals, "test_accuracy", "last"),
    }


def fed_curve(trace: pd.DataFrame) -> pd.DataFrame:
    """One row per evaluation of a federated run: round (from 1), cumulative bytes, time, loss, accuracy."""
    evals = trace[trace.event == "eval"].copy()
    evals["rounds"] = evals["round"] + 1
    return evals[["rounds", "cum_bytes", "time", "train_loss", "test_accuracy"]].reset_index(drop=True)


def rounds_to_accuracy(result: Result, target: float) -> float:
    """First round (counted from 1) whose evaluation reaches target test accuracy; NaN if none did."""
    curve = fed_curve(result.trace)
    hit = curve[curve.test_accuracy >= target]
    return stat(hit, "rounds", "first")
