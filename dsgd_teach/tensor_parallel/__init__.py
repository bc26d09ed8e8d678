"""Chapter 07, second half: tensor parallelism, one block's weights split across ranks (Megatron-LM)."""

from typing import Any

from ..experiments import Experiment
from .megatron import TensorParallelConfig, TensorParallelExtras, dense_block, run_tensor_parallel

__all__ = ["TensorParallelConfig", "TensorParallelExtras", "dense_block", "run_tensor_parallel"]


def _plot_tensor_parallel(result: Any) -> Any:
    """Figure for the CLI: bytes each rank sent forward and backward."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    sent = result.trace.pivot_table(index="worker", columns="event", values="bytes_sent", aggfunc="sum")
    sent.plot.bar(ax=ax)
    ax.set_ylabel("bytes sent")
    fig.tight_layout()
    return fig


EXPERIMENTS = {
    "tensor-parallel": Experiment("tensor-parallel", TensorParallelConfig, run_tensor_parallel,
                                  "one block split by columns then rows (Megatron), checked against the dense one",
                                  _plot_tensor_parallel),
}
