"""Step through the ring allreduce: which chunk each rank holds, and which partial sums move in each step.

The state is symbolic: cell (rank, chunk) is the set of ranks whose inputs have been added into that chunk.
It is driven by a message list: the planned `ring_schedule`, or the messages a real run logged in its trace.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, Rectangle

from .algorithms import chunk_sizes, ring_schedule

State = list[list[frozenset[int]]]


def messages_from_trace(trace: pd.DataFrame) -> list[dict[str, Any]]:
    """The ring messages of a run's trace (event == 'message') in the schedule's format."""
    rows = trace[(trace.event == "message") & (trace.algorithm == "ring")]
    return [
        {"step": int(r.step), "phase": r.phase, "src": int(r.worker), "dst": int(r.peer), "chunk": int(r.chunk),
         "elements": int(r.elements)}
        for r in rows.itertuples()
    ]


def ring_states(n: int, messages: Sequence[dict[str, Any]]) -> list[State]:
    """State before step 0, after step 0, ...: reduce-scatter messages add sets, all-gather ones overwrite."""
    state: State = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    states = [state]
    n_steps = 2 * (n - 1)
    for s in range(n_steps):
        new = [row[:] for row in state]
        for m in messages:
            if m["step"] != s:
                continue
            src, dst, c = m["src"], m["dst"], m["chunk"]
            new[dst][c] = state[dst][c] | state[src][c] if m["phase"] == "reduce-scatter" else state[src][c]
        state = new
        states.append(state)
    return states


def draw_ring_step(ax: Axes, n: int, k: int, step: int, messages: Sequence[dict[str, Any]] | None = None) -> None:
    """Draw the ranks on a circle with their chunks after `step` messages-steps (0 = the inputs)."""
    messages = list(ring_schedule(k, n) if messages is None else messages)
    states = ring_states(n, messages)
    step = max(0, min(step, len(states) - 1))
    state = states[step]
    sizes = chunk_sizes(k, n)
    ax.clear()
    ax.set_aspect("equal")
    ax.axis("off")
    radius, cell = 1.0, 0.22
    centres = [(radius * math.sin(2 * math.pi * r / n), radius * math.cos(2 * math.pi * r / n)) for r in range(n)]
    cmap = matplotlib.colormaps["viridis"]
    for r, (x, y) in enumerate(centres):
        x0 = x - n * cell / 2
        for c in range(n):
            done = len(state[r][c]) / n
            ax.add_patch(Rectangle((x0 + c * cell, y - cell / 2), cell, cell, facecolor=cmap(0.15 + 0.8 * done),
                                   edgecolor="black", lw=0.8, alpha=0.35 if sizes[c] == 0 else 1.0))
            label = "".join(str(i) for i in sorted(state[r][c])) if n <= 4 else str(len(state[r][c]))
            ax.text(x0 + (c + 0.5) * cell, y, label, ha="center", va="center", fontsize=7,
                    color="white" if done < 0.6 else "black")
        ax.text(x, y + cell * 0.95, f"rank {r}", ha="center", va="bottom", fontsize=8, fontweight="bold")
    now = [m for m in messages if m["step"] == step - 1]
    for m in now:
        (x1, y1), (x2, y2) = centres[m["src"]], centres[m["dst"]]
        ax.add_patch(FancyArrowPatch((x1, y1 - cell * 0.7), (x2, y2 - cell * 0.7), arrowstyle="-|>",
                                     mutation_scale=12, color="tab:red", connectionstyle="arc3,rad=-0.25"))
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2 - cell
        ax.text(mx * 0.8, my * 0.8, f"chunk {m['chunk']}\n{m['elements']} el.", fontsize=7, color="tab:red",
                ha="center", va="center")
    if step == 0:
        title = f"inputs: rank r holds only its own vector (k={k}, chunks {sizes})"
    else:
        phase = now[0]["phase"] if now else ("reduce-scatter" if step <= n - 1 else "all-gather")
        sent = sum(m["elements"] for m in now)
        title = f"after step {step - 1} ({phase}): {len(now)} messages, {sent} elements in total"
    ax.set_title(title, fontsize=9)
    pad = radius + n * cell / 2 + 0.2
    ax.set_xlim(-pad, pad)
    ax.set_ylim(-pad, pad)


def ring_png(n: int, k: int, step: int, messages: Sequence[dict[str, Any]] | None = None) -> bytes:
    """The picture of one ring step as PNG bytes (drawn off-screen, no pyplot state touched)."""
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 5.5), dpi=80)
    draw_ring_step(fig.add_subplot(), n, k, step, messages)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def ring_steps_png(n: int, k: int, messages: Sequence[dict[str, Any]] | None = None, columns: int = 3) -> bytes:
    """Every step of the ring, the inputs first, side by side in one PNG (the stepper's static copy)."""
    import io

    from matplotlib.figure import Figure

    steps = 2 * (n - 1) + 1
    rows = math.ceil(steps / columns)
    fig = Figure(figsize=(4.6 * min(steps, columns), 4.8 * rows), dpi=72)
    for step in range(steps):
        ax = fig.add_subplot(rows, min(steps, columns), step + 1)
        draw_ring_step(ax, n, k, step, messages)
        ax.set_title(textwrap.fill(ax.get_title(), 44), fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def ring_stepper(n: int = 4, k: int = 10, messages: Sequence[dict[str, Any]] | None = None):  # noqa: ANN201
    """A widget: a slider (and play button) stepping through the ring's 2(n-1) steps, redrawing the chunks.

    Each step is rendered to a PNG shown in an Image widget, so it works in any front end (and headless). Executed
    for the book, every step also stays beneath it as one static figure (ring_steps_png).
    """
    import ipywidgets as widgets
    from IPython.display import HTML, Image

    from ..static_copy import leave_static, static_caption

    slider = widgets.IntSlider(value=0, min=0, max=2 * (n - 1), description="step", continuous_update=False)
    play = widgets.Play(value=0, min=0, max=2 * (n - 1), interval=1200, description="play")
    widgets.jslink((play, "value"), (slider, "value"))
    image = widgets.Image(value=ring_png(n, k, 0, messages), format="png", layout=widgets.Layout(width="420px"))

    def redraw(change: dict[str, Any]) -> None:
        image.value = ring_png(n, k, change["new"], messages)

    slider.observe(redraw, names="value")

    def static() -> list[Any]:  # for the book: the slider's every position at once
        what = f"all its {2 * (n - 1)} steps, the inputs first"
        source = {"n": n, "k": k, "messages": "the planned ring_schedule" if messages is None else "a run's trace"}
        return [Image(data=ring_steps_png(n, k, messages), format="png"),
                HTML(static_caption("The ring allreduce, step by step", what, source))]

    return leave_static(widgets.VBox([widgets.HBox([play, slider]), image]), "The ring allreduce", static)
