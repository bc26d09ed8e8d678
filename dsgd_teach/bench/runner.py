"""Run every benchmark module once and write build/bench/results.json and results.md.

A benchmark module defines `measure() -> dict[str, float | str]` (starting its own clusters); figures whose name ends in `_ratio`
are the ones to quote (the machine is shared and noisy, so absolute times are only context).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from ..runtime.clusters.cluster import cpu_count, start_client
from .report import machine_line, results_from_page

BENCH_MODULES = (
    "dsgd_teach.bench.foundation",
    "dsgd_teach.bench.hogwild",
    "dsgd_teach.bench.ps",
    "dsgd_teach.bench.syncasync",
    "dsgd_teach.bench.collectives",
    "dsgd_teach.bench.all_to_all",
    "dsgd_teach.bench.shaped_hosts",
    "dsgd_teach.bench.averaging",
    "dsgd_teach.bench.threads",
    "dsgd_teach.bench.pipeline",
    "dsgd_teach.bench.pipeline_emulated",
    "dsgd_teach.bench.pipeline_torch",
    "dsgd_teach.bench.sharded",
    "dsgd_teach.bench.zero",
    "dsgd_teach.bench.transformer_tp",
    "dsgd_teach.bench.transformer_predict",
    "dsgd_teach.bench.sim",
    "dsgd_teach.bench.delay_tolerant",
    "dsgd_teach.bench.grading",
    "dsgd_teach.bench.mutation",
    "dsgd_teach.bench.nbgrader_route",
)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cores": cpu_count(),
        "torch": torch.__version__,
        "gpus": torch.cuda.device_count(),
    }


def run_all(out_dir: Path = Path("build/bench"), only: list[str] | None = None,
            page: Path = Path("docs/benchmarks.md")) -> dict[str, Any]:
    """Measure every available benchmark module (or those in `only`); failures are recorded, not fatal.

    With `only`, the other benchmarks keep their figures from the previous results.json (on a fresh clone, from
    the page's own table), so the table in docs/benchmarks.md rewritten from it still lists every benchmark.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = out_dir / "results.json"
    before: dict[str, Any] = {}
    if only and previous.exists():
        before = json.loads(previous.read_text())
    elif only and page.exists():
        before = results_from_page(page.read_text())
    kept = {name: {**figures, "measured_at": measured_at(before, name)}
            for name, figures in before.get("benchmarks", {}).items()}
    results: dict[str, Any] = {"machine": machine(), "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               "benchmarks": kept}
    for name in BENCH_MODULES:
        short = name.rsplit(".", 1)[-1]
        if only and short not in only:
            continue
        if importlib.util.find_spec(name) is None:
            continue
        print(f"[bench] {short} ...", flush=True)
        figures = measure_in_fresh_process(name)
        results["benchmarks"][short] = {**figures, "measured_at": results["when"]}
        print(f"[bench] {short}: {json.dumps(figures, default=str)[:400]}", flush=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out_dir / "results.md").write_text(to_markdown(results))
    return results


def measured_at(results: dict[str, Any], name: str) -> str:
    """When benchmark `name` of an earlier results dict was measured (older files: from its run's dates)."""
    figures = results.get("benchmarks", {}).get(name, {})
    if "measured_at" in figures:
        return str(figures["measured_at"])
    if name in results.get("re_measured", []) or "others_when" not in results:
        return str(results.get("when", "earlier"))
    return str(results["others_when"])


def measure_in_fresh_process(name: str, timeout_s: float = 900.0) -> dict[str, Any]:
    """Run one module's measure() in a new Python process: no benchmark inherits another's threads, caches or
    heap, just as each chapter starts in a fresh kernel. Failures are returned as an "error" figure."""
    with tempfile.TemporaryDirectory(prefix="dsgd-bench-") as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, "-m", "dsgd_teach.bench.runner", name, str(out)]
        try:
            done = subprocess.run(cmd, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"TimeoutExpired: {name} took more than {timeout_s:.0f} s"}
        if not out.exists():
            return {"error": f"{name} exited with status {done.returncode} before writing its figures"}
        return json.loads(out.read_text())


def _measure_here(name: str, out: Path) -> None:
    """The child side of measure_in_fresh_process: import, measure, time, write the figures as JSON."""
    t = time.perf_counter()
    try:
        figures = importlib.import_module(name).measure()
        figures["bench_wall_s"] = round(time.perf_counter() - t, 2)
    except Exception as exc:  # keep going: one broken benchmark must not hide the others
        figures = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    out.write_text(json.dumps(figures, default=str))


def to_markdown(results: dict[str, Any]) -> str:
    """A markdown table of every figure, with the machine it came from."""
    lines = [
        machine_line(results),
        "",
        "| benchmark | figure | value |",
        "| --- | --- | --- |",
    ]
    for bench, figures in results["benchmarks"].items():
        for key, value in figures.items():
            if key == "traceback":
                continue
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            lines.append(f"| {bench} | {key} | {shown} |")
    return "\n".join(lines) + "\n"


def with_client(n_workers: int):
    """Context manager for a fresh local cluster of n_workers (benchmarks own their clusters)."""
    return start_client(n_workers, quiet=True, use_gpu=False)


if __name__ == "__main__":
    _measure_here(sys.argv[1], Path(sys.argv[2]))
