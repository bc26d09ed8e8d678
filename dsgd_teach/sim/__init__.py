"""A discrete-event simulator (SimPy) of the course's distributed algorithms, for up to 1000 workers.

Driven by the chapters' own configs (see from_config) and returning the same Result and trace format, so the
chapters' plots and widget panels work on simulated runs unchanged.
"""

from ..experiments import Experiment
from .calibrate import calibrate, fit_machine, real_runs
from .config import MAX_SIM_WORKERS, SimConfig, from_config
from .network import AlphaBetaNet, ring_closed_form
from .pipeline import PipelineSimConfig, plot_simulated_pipeline, run_pipeline_simulated
from .plots import (
    plot_allreduce_vs_workers,
    plot_calibration,
    plot_layouts_at_scale,
    plot_result,
    plot_sharded_at_scale,
    plot_sim_live,
    plot_staleness_vs_workers,
    plot_step_times,
)
from .run import run_simulated
from .sharded import (
    TRANSFORMERS,
    ShardedSimConfig,
    fewest_gpus,
    run_sharded_sim,
    sharded_sweep,
    simulate_sharded_step,
)
from .transformer import GPT3, Cluster, best_layouts, rank_at_scale

__all__ = [
    "EXPERIMENTS",
    "GPT3",
    "MAX_SIM_WORKERS",
    "TRANSFORMERS",
    "AlphaBetaNet",
    "Cluster",
    "ShardedSimConfig",
    "SimConfig",
    "best_layouts",
    "calibrate",
    "fewest_gpus",
    "fit_machine",
    "from_config",
    "plot_allreduce_vs_workers",
    "plot_calibration",
    "plot_layouts_at_scale",
    "plot_result",
    "plot_sharded_at_scale",
    "plot_sim_live",
    "plot_staleness_vs_workers",
    "plot_step_times",
    "rank_at_scale",
    "real_runs",
    "ring_closed_form",
    "run_sharded_sim",
    "run_simulated",
    "sharded_sweep",
    "simulate_sharded_step",
]

EXPERIMENTS = {
    "simulated": Experiment(
        "simulated", SimConfig, run_simulated,
        "discrete-event simulation of sync/async SGD or an allreduce, up to 1000 workers (no cluster needed)",
        plot_result,
        needs_cluster=False,
    ),
    "pipeline-simulated": Experiment(
        "pipeline-simulated", PipelineSimConfig, run_pipeline_simulated,
        "one step of a naive, GPipe or 1F1B pipeline for up to 64 stages and 256 microbatches (no cluster needed)",
        plot_simulated_pipeline,
        needs_cluster=False,
    ),
}
