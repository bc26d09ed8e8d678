"""The picture of a mesh: ranks as a grid, each axis's groups drawn as lines, the collective each axis carries.

Columns are the fast axes (tensor inside context), rows the slow ones (data inside pipeline), so neighbouring
boxes are neighbouring ranks, as on a machine whose closest GPUs share the fastest links (mesh.py's order).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .mesh import Layout

#: What travels on each axis in one training step, for the legend.
COLLECTIVES = {
    "dp": "allreduce of gradients (ring: reduce-scatter + all-gather)",
    "tp": "allreduce of activations and their gradients, 2 per block each way",
    "tp_sp": "all-gather + reduce-scatter of activations (sequence parallel)",
    "pp": "send/recv of activations forward, their gradients back",
    "cp": "ring of key/value blocks (and their gradients back)",
    "ep": "all-to-all of tokens to their experts and back",
}
COLORS = {"dp": "#1f77b4", "tp": "#d62728", "pp": "#2ca02c", "cp": "#9467bd", "ep": "#ff7f0e"}
#: Where each axis's line runs through a box (offsets from its centre), so lines of different axes stay apart.
OFFSETS = {"dp": (-0.22, 0.0), "ep": (0.22, 0.0), "pp": (0.0, 0.0), "tp": (0.0, 0.22), "cp": (0.0, -0.32)}
GAP = 0.5  # the extra space between blocks of an outer axis


def rank_position(layout: Layout, rank: int) -> tuple[float, float]:
    """Where a rank's box is drawn: x from (cp, tp), y from (pp, dp); rank 0 at the top left."""
    c = layout.coords(rank)
    x = c["cp"] * (layout.tp + GAP) + c["tp"]
    y = c["pp"] * (layout.dp + GAP) + c["dp"]
    return x, -y


def axis_label(axis: str, layout: Layout, sequence_parallel: bool = False) -> str:
    """The legend's line for one axis: its size and the collective on it."""
    what = COLLECTIVES["tp_sp" if axis == "tp" and sequence_parallel else axis]
    return f"{axis} (N={getattr(layout, axis)}): {what}"


def draw_mesh(ax: Axes, layout: Layout, sequence_parallel: bool = False) -> None:
    """Draw `layout`'s ranks and, for every axis of size > 1, each of its groups as a line through its ranks."""
    for rank in range(layout.world):
        x, y = rank_position(layout, rank)
        c = layout.coords(rank)
        ax.add_patch(plt.Rectangle((x - 0.4, y - 0.4), 0.8, 0.8, facecolor="#f4f4f4", edgecolor="#555555"))
        ax.text(x, y + 0.08, str(rank), ha="center", va="center", fontsize=12, weight="bold")
        detail = " ".join(f"{a}{c[a]}" for a in ("dp", "tp", "pp", "cp") if getattr(layout, a) > 1)
        ax.text(x, y - 0.16, detail, ha="center", va="center", fontsize=6, color="#555555")
    for axis in layout.active:
        dx, dy = OFFSETS[axis]
        for i, group in enumerate(layout.groups(axis)):
            xs, ys = zip(*(rank_position(layout, r) for r in group), strict=True)
            xs = [x + dx for x in xs]
            ys = [y + dy for y in ys]
            if axis == "cp" and len(group) > 2:  # a ring: close the loop
                xs, ys = [*xs, xs[0]], [*ys, ys[0]]
            ax.plot(xs, ys, "-o", color=COLORS[axis], lw=2.5, ms=4, alpha=0.85,
                    label=axis_label(axis, layout, sequence_parallel) if i == 0 else None)
    for s in range(layout.pp if layout.pp > 1 else 0):
        top = -(s * (layout.dp + GAP)) + 0.5
        ax.text(-0.6, top - layout.dp / 2, f"stage {s}", rotation=90, ha="center", va="center", fontsize=8)
    width = layout.cp * (layout.tp + GAP) - GAP
    height = layout.pp * (layout.dp + GAP) - GAP
    ax.set_xlim(-0.9, width)
    ax.set_ylim(-height - 0.1, 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    sizes = " × ".join(f"{a}={getattr(layout, a)}" for a in ("dp", "tp", "pp", "cp", "ep") if getattr(layout, a) > 1)
    ax.set_title(f"{layout.world} ranks: {sizes or 'one rank'}", fontsize=10)
    if layout.active:
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.02), fontsize=7, frameon=False)


def plot_mesh(layout: Layout, sequence_parallel: bool = False, figsize: tuple[float, float] | None = None) -> Figure:
    """A figure of the mesh (see draw_mesh), sized to the grid."""
    cols = layout.cp * (layout.tp + GAP)
    rows = layout.pp * (layout.dp + GAP)
    fig, ax = plt.subplots(figsize=figsize or (max(4.5, 1.3 * cols + 1.0), 1.3 * rows + 1.6))
    draw_mesh(ax, layout, sequence_parallel)
    fig.tight_layout()
    return fig
