"""Turn build/bench/results.json into the benchmark page's tables and a few plots in build/bench/.

docs/benchmarks.md holds the latest tables between the markers `<!-- bench:start -->` and `<!-- bench:end -->`;
this module rewrites only what lies between them, so the rest of the page is never touched. Run it as
`python -m dsgd_teach.bench.report` after `dsgd-teach bench` (make bench does both).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

MARK_START = "<!-- bench:start -->"
MARK_END = "<!-- bench:end -->"


def _shown(value: Any) -> str:
    """A figure as the table shows it: 4 significant digits for floats, text cut short."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.4g}"
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def machine_line(results: dict[str, Any]) -> str:
    """One sentence saying when and on what the figures were measured."""
    m = results.get("machine", {})
    when = results.get("when", "?")
    dates: dict[str, list[str]] = {}
    for name, figures in results.get("benchmarks", {}).items():
        dates.setdefault(str(figures.get("measured_at", when)), []).append(name)
    if len(dates) > 1:  # `bench --only` runs: each date with what it measured; the run that measured most (the
        # oldest of equals) is "the others"
        others = max(sorted(dates), key=lambda at: len(dates[at]))
        when = "; ".join(f"{at} ({', '.join(dates[at])})" for at in sorted(dates) if at != others)
        when += f"; the others {others}"
    return (
        f"Measured {when} on {m.get('cores', '?')} cores ({m.get('processor', '?')}, "
        f"{m.get('platform', '?')}), Python {m.get('python', '?')}, torch {m.get('torch', '?')}, "
        f"GPUs: {m.get('gpus', 0)}."
    )


def bench_table(results: dict[str, Any]) -> str:
    """The benchmark section: the machine, the ratio figures (the ones to quote), then every figure folded away."""
    benches: dict[str, dict[str, Any]] = results.get("benchmarks", {})
    lines = [machine_line(results), "", "| benchmark | figure (ratio, same run) | value |", "| --- | --- | --- |"]
    for bench, figures in benches.items():
        if "error" in figures:
            lines.append(f"| {bench} | **failed** | {_shown(figures['error'])} |")
            continue
        for key, value in figures.items():
            if key.endswith("_ratio"):
                lines.append(f"| {bench} | {key} | {_shown(value)} |")
    walls = [f"{b} {f['bench_wall_s']:.0f} s" for b, f in benches.items() if isinstance(f.get("bench_wall_s"), float)]
    if walls:
        lines += ["", f"Time per benchmark: {', '.join(walls)}."]
    lines += ["", "<details><summary>every figure</summary>", "", "| benchmark | figure | value |", "| --- | --- | --- |"]
    for bench, figures in benches.items():
        for key, value in figures.items():
            if key != "traceback":
                lines.append(f"| {bench} | {key} | {_shown(value)} |")
    lines += ["", "</details>"]
    return "\n".join(lines)


def results_from_page(text: str) -> dict[str, Any]:
    """The figures a page's bench section lists (its "every figure" table), as results.json holds them: what a
    fresh clone, without build/bench/results.json, keeps when `dsgd-teach bench --only` re-measures a few."""
    start, end = text.find(MARK_START), text.find(MARK_END)
    if start < 0 or end < start:
        return {}
    section = text[start:end]
    benches: dict[str, dict[str, Any]] = {}
    every = section.split("<summary>every figure</summary>", 1)[-1]
    for line in every.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 3 or cells[0] in ("benchmark", "---") or not line.startswith("|"):
            continue
        bench, key, value = cells
        benches.setdefault(bench, {})[key] = _figure(value)
    measured = section.split("Measured ", 1)[-1].split(" on ", 1)[0] if "Measured " in section else "earlier"
    out: dict[str, Any] = {"when": measured.split(" (", 1)[0], "benchmarks": benches}
    if " (" in measured and "; the others from the run started " in measured:  # an older `--only` run's line
        again, others = measured.split(" (", 1)[1].rstrip(")").split("; the others from the run started ", 1)
        out["re_measured"], out["others_when"] = again.split(", "), others
    return out if benches else {}


def _figure(text: str) -> Any:
    """A table cell read back: an int, a float (n/a is nan), or the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return float("nan") if text == "n/a" else text


def replace_section(text: str, section: str) -> str:
    """text with everything between the bench markers replaced by section (ValueError if a marker is missing)."""
    start, end = text.find(MARK_START), text.find(MARK_END)
    if start < 0 or end < start:
        raise ValueError(f"the page needs the markers {MARK_START} and {MARK_END} (in that order)")
    return text[: start + len(MARK_START)] + "\n" + section.strip() + "\n" + text[end:]


def update_readme(results: dict[str, Any], readme: Path) -> None:
    """Rewrite the bench section of readme from results."""
    readme.write_text(replace_section(readme.read_text(), bench_table(results)))


def write_plots(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """ratios.png (every `_ratio` figure) and bench_time.png (seconds per benchmark) into out_dir."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    benches = results.get("benchmarks", {})
    ratios = [
        (f"{b}: {k}", float(v)) for b, f in benches.items() for k, v in f.items()
        if k.endswith("_ratio") and isinstance(v, (int, float)) and math.isfinite(v) and v > 0
    ]
    written = []
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(ratios) + 1.2))
    if ratios:
        labels, values = zip(*ratios, strict=True)
        ax.barh(range(len(values)), values, color="tab:blue")
        ax.set_yticks(range(len(values)), labels, fontsize=7)
        ax.set_xscale("log")
        ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("ratio (against a reference measured in the same run)")
    ax.set_title(machine_line(results), fontsize=7)
    fig.tight_layout()
    written.append(out_dir / "ratios.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    walls = [(b, float(f["bench_wall_s"])) for b, f in benches.items() if isinstance(f.get("bench_wall_s"), (int, float))]
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(walls) + 1.2))
    if walls:
        names, secs = zip(*walls, strict=True)
        ax.barh(range(len(secs)), secs, color="tab:orange")
        ax.set_yticks(range(len(secs)), names, fontsize=8)
    ax.set_xlabel("seconds")
    ax.set_title("time per benchmark module", fontsize=9)
    fig.tight_layout()
    written.append(out_dir / "bench_time.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    """`python -m dsgd_teach.bench.report [--results ...] [--readme ...] [--out ...]`."""
    parser = argparse.ArgumentParser(prog="python -m dsgd_teach.bench.report")
    parser.add_argument("--results", type=Path, default=Path("build/bench/results.json"))
    parser.add_argument("--readme", type=Path, default=Path("docs/benchmarks.md"), help="the page holding the markers")
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    update_readme(results, args.readme)
    for path in write_plots(results, args.out):
        print(f"plot written to {path}")
    print(f"bench table written into {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
