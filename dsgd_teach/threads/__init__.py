"""Chapter 06: intra-op and inter-op parallelism (TensorFlow's two thread pools, done in PyTorch).

Every configuration runs in a fresh process started by a cluster worker (the inter-op pool can be sized once
per process); each measurement reports the pool sizes really in effect and the process that ran it.
"""

from .common import counts
from .gpu import StreamsConfig, run_streams
from .interop import InterOpConfig, fork_demos, interop_table, run_inter_op
from .intra import IntraOpConfig, intra_table, run_intra_op
from .lab import ThreadsLabConfig, lab_table, run_threads_lab
from .oversub import OversubConfig, oversub_table, run_oversubscription
from .plots import plot_interop, plot_intra, plot_lab, plot_oversub, plot_streams, show

__all__ = [
    "InterOpConfig",
    "IntraOpConfig",
    "OversubConfig",
    "StreamsConfig",
    "ThreadsLabConfig",
    "counts",
    "fork_demos",
    "interop_table",
    "intra_table",
    "lab_table",
    "oversub_table",
    "plot_interop",
    "plot_intra",
    "plot_lab",
    "plot_oversub",
    "plot_streams",
    "run_inter_op",
    "run_intra_op",
    "run_oversubscription",
    "run_streams",
    "run_threads_lab",
    "show",
]

from ..experiments import Experiment  # noqa: E402

EXPERIMENTS = {
    "intra-op": Experiment("intra-op", IntraOpConfig, run_intra_op,
                           "matmul / conv / MLP-step time against intra-op threads, one fresh process per count", show),
    "inter-op": Experiment("inter-op", InterOpConfig, run_inter_op,
                           "two-tower TorchScript model: branches sequential vs torch.jit.fork, per inter-op pool size",
                           show),
    "oversubscription": Experiment("oversubscription", OversubConfig, run_oversubscription,
                                   "P concurrent processes x T threads against the cores: the floor(cores/P) rule",
                                   show),
    "cuda-streams": Experiment("cuda-streams", StreamsConfig, run_streams,
                               "independent kernel chains on one CUDA stream vs one stream each (GPU workers only)",
                               show),
    "threads-lab": Experiment("threads-lab", ThreadsLabConfig, run_threads_lab,
                              "one setting of intra-op / inter-op threads, size and processes vs the 1/1/1 baseline",
                              show),
}
