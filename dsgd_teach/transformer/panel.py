"""Chapter 10's widgets: rank the layouts of a model on N ranks (predicted), and run one layout live."""

from __future__ import annotations

import io

import ipywidgets as widgets
from distributed import Client
from IPython.display import Image, display
from matplotlib.figure import Figure

from ..panel import ExperimentPanel
from .calibration import Calibration, rank_layouts
from .experiment import FULL_SHAPE, SMOKE_SHAPE, TransformerConfig, run
from .model import GPTShape
from .plots import plot_ranking, plot_run_live

#: Models to rank: the chapter's two, and GPT-2 small's shape (Radford et al. 2019, Table 2: 12 layers, h 768).
MODELS = {
    "chapter, smoke": SMOKE_SHAPE,
    "chapter, full": FULL_SHAPE,
    "chapter with 8 experts": SMOKE_SHAPE.replace(experts=8, top_k=2),
    "GPT-2 small (124M)": GPTShape(vocab=50_257, seq_len=1024, width=768, heads=12, layers=12),
}


def ranking_table(model: str, ranks: int, batch: int, microbatches: int, memory_mib: float,
                  cal: Calibration) -> str:
    """The ten fastest layouts as an HTML table (predicted ms per step, memory per rank, whether it fits)."""
    table = rank_layouts(MODELS[model], ranks, batch, cal, memory_mib * 2**20, microbatches)
    if not len(table):
        return f"<p>No layout of {ranks} ranks splits this model and a batch of {batch} evenly.</p>"
    show = table.head(10).assign(step_ms=table.step_s * 1e3, memory_MiB=table.memory_bytes / 2**20)
    return show[["layout", "m", "step_ms", "compute_s", "bubble_s", "memory_MiB", "fits"]].to_html(
        index=False, float_format=lambda v: f"{v:.3g}")


def ranking_widget(cal: Calibration) -> widgets.VBox:
    """Choose a model, N, the batch, m and the memory per rank; read the layouts ranked by predicted step time."""
    controls = {
        "model": widgets.Dropdown(options=list(MODELS), value="chapter, full", description="model"),
        "ranks": widgets.Dropdown(options=[2, 4, 8, 16, 32, 64], value=8, description="ranks N"),
        "batch": widgets.Dropdown(options=[8, 16, 32, 64, 256], value=16, description="batch B"),
        "microbatches": widgets.Dropdown(options=[1, 2, 4, 8], value=2, description="m"),
        "memory_mib": widgets.FloatLogSlider(value=1024, base=2, min=0, max=17, description="MiB per rank"),
    }
    html, picture = widgets.HTML(), widgets.Output()

    def update(*_: object) -> None:
        values = {k: w.value for k, w in controls.items()}
        html.value = ranking_table(**values, cal=cal)
        fig = Figure(figsize=(7, 3.6))  # not pyplot's: this runs on the widget thread, beside the cells' figures
        table = rank_layouts(MODELS[values["model"]], values["ranks"], values["batch"], cal,
                             values["memory_mib"] * 2**20, values["microbatches"])
        if len(table):
            plot_ranking(fig.add_subplot(), table)
        png = io.BytesIO()
        fig.savefig(png, format="png", bbox_inches="tight")
        picture.clear_output(wait=True)
        with picture:
            display(Image(data=png.getvalue(), format="png"))

    for w in controls.values():
        w.observe(update, names="value")
    update()
    items = list(controls.values())
    return widgets.VBox([widgets.HBox(items[:3]), widgets.HBox(items[3:]), widgets.HBox([html, picture])])


def run_panel(client: Client, config: TransformerConfig, title: str = "A transformer on a mesh") -> ExperimentPanel:
    """Run, live, a layout of the chapter's GPT: loss, bytes per axis, tokens per expert and tokens dropped."""
    axis = {a: widgets.Dropdown(options=[1, 2, 4, 8], value=getattr(config, a), description=a)
            for a in ("dp", "tp", "pp", "cp", "ep")}
    keep_experts_on_data_ranks(axis["dp"], axis["ep"])
    controls = {**axis, "sequence_parallel": widgets.Checkbox(value=config.sequence_parallel, description="SP")}
    return ExperimentPanel(client, run, config.replace(verbose=False, check=False), controls=controls, plot=plot_run_live,
                           title=title, figsize=(12, 3.4))


def keep_experts_on_data_ranks(dp: widgets.Dropdown, ep: widgets.Dropdown) -> None:
    """Keep N_ep dividing N_dp as either dropdown changes: the expert ranks are data-parallel ranks (mesh.py)."""

    def follow(change: dict) -> None:
        if dp.value % ep.value == 0:
            return
        if change["owner"] is dp:  # fewer data ranks: as many expert ranks as still divide them
            ep.value = max(e for e in ep.options if dp.value % e == 0)
        else:  # more expert ranks: as many data ranks
            dp.value = ep.value

    dp.observe(follow, names="value")
    ep.observe(follow, names="value")
