"""The "will it fit?" widget: choose a model, N, ZeRO stage, precision, microbatch and checkpointing; read memory."""

from __future__ import annotations

import ipywidgets as widgets
from IPython.display import HTML

from ..static_copy import leave_static, static_caption
from .fit import Model, will_it_fit

#: Shapes of GPT-style models (layers, hidden, heads) from 125M to 70B parameters.
MODELS = {
    "125M": Model(12, 768, 12), "1.3B": Model(24, 2048, 16), "7B": Model(32, 4096, 32),
    "13B": Model(40, 5120, 40), "70B": Model(80, 8192, 64),
}


def fit_table(model: str, n: int, stage: int, precision: str, microbatch: int, seq: int, checkpoint: bool,
              gpu_gib: float) -> str:
    """An HTML table of will_it_fit's answer."""
    r = will_it_fit(MODELS[model], n, stage, microbatch, seq, checkpoint, precision, gpu_gib)
    verdict = "fits" if r["fits"] else "does NOT fit"
    return (f"<table><tr><td>parameters</td><td>{r['params'] / 1e9:.2f} B</td></tr>"
            f"<tr><td>model states per GPU</td><td>{r['states_gib']:.1f} GiB</td></tr>"
            f"<tr><td>activations kept per GPU</td><td>{r['activations_gib']:.1f} GiB</td></tr>"
            f"<tr><td>layer rebuilt in backward</td><td>{r['rebuilt_gib']:.1f} GiB</td></tr>"
            f"<tr><td>ZeRO buffers (gathered units, one gradient)</td><td>{r['buffers_gib']:.1f} GiB</td></tr>"
            f"<tr><td><b>total per GPU</b></td><td><b>{r['total_gib']:.1f} GiB: {verdict} in {gpu_gib:g} GiB</b></td></tr>"
            f"<tr><td>sent per GPU per step</td><td>{r['sent_gib_per_step']:.1f} GiB</td></tr></table>")


def fit_widget() -> widgets.VBox:
    """Controls and a live table: memory per GPU and bytes per step for the chosen set-up (executed for the book, the
    table of its initial settings also stays beneath it)."""
    controls = {
        "model": widgets.Dropdown(options=list(MODELS), value="7B", description="model"),
        "n": widgets.SelectionSlider(options=[2**i for i in range(11)], value=8, description="GPUs N"),
        "stage": widgets.Dropdown(options=[0, 1, 2, 3], value=0, description="ZeRO stage"),
        "precision": widgets.Dropdown(options=["mixed", "fp32"], value="mixed", description="precision"),
        "microbatch": widgets.IntSlider(value=1, min=1, max=32, description="microbatch"),
        "seq": widgets.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=2048, description="sequence"),
        "checkpoint": widgets.Checkbox(value=False, description="checkpointing"),
        "gpu_gib": widgets.Dropdown(options=[24.0, 40.0, 80.0, 141.0], value=80.0, description="GPU GiB"),
    }
    out = widgets.HTML()

    def update(*_: object) -> None:
        out.value = fit_table(**{k: w.value for k, w in controls.items()})

    for w in controls.values():
        w.observe(update, names="value")
    update()
    box = widgets.VBox([widgets.HBox(list(controls.values())[:4]), widgets.HBox(list(controls.values())[4:]), out])

    def static() -> list[HTML]:  # for the book: the table of the settings the cell left
        settings = {w.description: w.value for w in controls.values()}
        return [HTML(static_caption("Will it fit?", "the calculator's table", settings, out.value))]

    return leave_static(box, "Will it fit?", static)
