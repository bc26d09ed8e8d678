"""The `dsgd-teach` command: run an experiment with a progress bar, check the set-up, benchmark, grade."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
import typing
from pathlib import Path
from typing import Any

from . import __version__


def _field_parser(value: str, annotation: Any, default: Any, name: str = "value", config_cls: Any = None) -> Any:
    """Convert a command-line string to the type of a config field; a wrong type names field, type and range."""
    try:
        return _convert(value, annotation, default)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(_type_message(name, value, annotation, default, config_cls)) from exc


def _type_message(name: str, value: str, annotation: Any, default: Any, config_cls: Any) -> str:
    """The config's own refusal of the raw string (it names the field, the type and the range), else a plain one."""
    if config_cls is not None:
        try:
            config_cls(**{name: value})
        except (ValueError, TypeError) as exc:
            if name in str(exc):
                return str(exc)
    kind = type(default).__name__ if default is not None else str(annotation)
    return f"{name} must be of type {kind}, got {value!r}"


def _convert(value: str, annotation: Any, default: Any) -> Any:
    text = str(annotation)
    if value.lower() == "none" and ("None" in text or default is None):
        return None
    if isinstance(default, bool) or "bool" in text:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true/false, got {value!r}")
    if isinstance(default, int) or text.startswith("int"):
        return int(value)
    if isinstance(default, float) or text.startswith("float"):
        return float(value)
    return value


def _add_config_options(parser: argparse.ArgumentParser, config_cls: type) -> None:
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        default = field.default
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=field.name,
            default=argparse.SUPPRESS,
            type=lambda v, a=hints.get(field.name), d=default, n=field.name: _field_parser(v, a, d, n, config_cls),
            help=f"(default: {default!r})",
        )


def cmd_run(argv: list[str]) -> int:
    """`dsgd-teach run EXPERIMENT [--field value ...]`: run it on a cluster, print a summary, save a PNG."""
    from .experiments import registry

    known = registry()
    head = argparse.ArgumentParser(prog="dsgd-teach run", add_help=False)
    head.add_argument("experiment", nargs="?", choices=sorted(known))
    args, rest = head.parse_known_args(argv)
    if args.experiment is None:
        print("experiments:\n" + "\n".join(f"  {n:<22} {e.description}" for n, e in sorted(known.items())))
        return 0 if not rest or rest == [] else 2
    exp = known[args.experiment]
    parser = argparse.ArgumentParser(prog=f"dsgd-teach run {args.experiment}", description=exp.description)
    parser.add_argument("--cluster-workers", type=int, default=None, help="cluster size (default: the config's workers, else 2)")
    parser.add_argument("--out", type=Path, default=None, help="PNG file for the figure (default build/<experiment>.png)")
    _add_config_options(parser, exp.config_cls)
    opts = vars(parser.parse_args(rest))
    n_cluster = opts.pop("cluster_workers")
    out = opts.pop("out") or Path("build") / f"{args.experiment}.png"
    try:
        config = exp.config_cls(**opts)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run_with_progress(exp, config, n_cluster, out)


def _run_with_progress(exp: Any, config: Any, n_cluster: int | None, out: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from tqdm import tqdm

    from .plots import compare
    from .runtime.clusters.cluster import start_client

    # a config that needs more processes than its "workers" (e.g. backups) says so with a `world` attribute
    n = n_cluster or getattr(config, "world", None) or getattr(config, "workers", None) or 2
    total = getattr(config, "steps", None)
    cluster = start_client(n) if exp.needs_cluster else contextlib.nullcontext(None)
    with cluster as client, tqdm(total=total, unit="step", desc=exp.name) as bar:
        seen = [0]

        def on_update(event: dict[str, Any]) -> None:
            step = event.get("step", -1)
            if isinstance(step, (int, float)) and step + 1 > seen[0]:
                bar.update(int(step + 1 - seen[0]))
                seen[0] = int(step + 1)
            if event.get("loss") == event.get("loss") and event.get("loss") is not None:  # not NaN
                bar.set_postfix(loss=f"{event['loss']:.4f}", refresh=False)

        t = time.perf_counter()
        result = exp.run(config, client, on_update)
    print(f"{exp.name} finished in {time.perf_counter() - t:.1f} s")
    for key, value in result.summary.items():
        print(f"  {key:<24} {value:.5g}" if isinstance(value, float) else f"  {key:<24} {value}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = exp.plot(result) if exp.plot is not None else compare({exp.name: result})
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"figure saved to {out}")
    return 0


def cmd_doctor(argv: list[str]) -> int:
    """`dsgd-teach doctor`: versions, cores, GPUs and how long the cluster takes to start."""
    import platform

    import dask
    import distributed
    import numpy
    import torch

    from .runtime.clusters.cluster import cpu_count, start_client

    argparse.ArgumentParser(prog="dsgd-teach doctor").parse_args(argv)
    print(f"dsgd-teach {__version__}, Python {platform.python_version()} on {platform.platform()}")
    print(f"dask {dask.__version__}, distributed {distributed.__version__}, torch {torch.__version__}, numpy {numpy.__version__}")
    print(f"cores available: {cpu_count()}; torch intra-op threads here: {torch.get_num_threads()}")
    gpus = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) if gpus else "none"
    print(f"GPUs: {gpus} ({names})")
    try:
        import dask_cuda  # noqa: F401

        print("dask-cuda: installed")
    except ImportError:
        print("dask-cuda: not installed (only needed for GPUs: pip install 'dsgd-teach[gpu]')")
    t = time.perf_counter()
    with start_client(quiet=True) as client:
        started = time.perf_counter() - t
        print(f"cluster: {client.info.note}; started in {started:.1f} s; dashboard {client.dashboard_link}")
        print_worker_memory(client)
        t = time.perf_counter()
        client.submit(sum, [1, 2], pure=False).result(timeout=30)
        print(f"first task round trip: {(time.perf_counter() - t) * 1e3:.1f} ms")
    return 0


def print_worker_memory(client: object) -> None:
    """One line per worker: resident memory after its imports, its limit, and the room left before dask pauses it."""
    from .memory import MiB, pause_fraction, plan_worker_memory, worker_footprints

    plan = plan_worker_memory(1)
    print(f"torch build: {plan.build}; a worker's measured baseline after its imports: {plan.baseline / MiB:.0f} MiB; "
          f"machine memory: {plan.machine / MiB:.0f} MiB; dask pauses a worker at {pause_fraction():.0%} of its limit")
    for address, f in sorted(worker_footprints(client).items()):
        limit = f"{f['limit'] / MiB:.0f} MiB" if f["limit"] else "none"
        print(f"  worker {address}: baseline {f['rss'] / MiB:.0f} MiB, limit {limit}, "
              f"headroom {f['headroom'] / MiB:.0f} MiB before pause, status {f['status']}")


def cmd_bench(argv: list[str]) -> int:
    """`dsgd-teach bench [--only NAME ...]`: run the benchmark suite into build/bench/."""
    from .bench.runner import run_all

    parser = argparse.ArgumentParser(prog="dsgd-teach bench")
    parser.add_argument("--only", nargs="*", default=None, help="benchmark module names (default: all)")
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    results = run_all(args.out, args.only)
    from .bench.report import update_readme, write_plots

    write_plots(results, args.out)
    page = Path("docs/benchmarks.md")  # the tables live there; the README quotes a few headline ratios
    if page.exists():
        update_readme(results, page)
    failed = [name for name, figures in results["benchmarks"].items() if "error" in figures]
    print(f"results written to {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 1 if failed else 0


def cmd_grade(argv: list[str]) -> int:
    """`dsgd-teach grade SUBMISSIONS_DIR ...`: grade a class (see dsgd_teach.grading)."""
    from .grading.cli import main as grade_main

    return grade_main(argv)


def cmd_similarity(argv: list[str]) -> int:
    """`dsgd-teach similarity SUBMISSIONS_DIR ...`: the most similar pairs of solution cells per question."""
    from .grading.similarity import main as similarity_main

    return similarity_main(argv)


def cmd_check(argv: list[str]) -> int:
    """`dsgd-teach check NOTEBOOK`: run its visible tests in the grader's sandbox, before submitting."""
    from .grading.check_cli import main as check_main

    return check_main(argv)


def cmd_gradescope(argv: list[str]) -> int:
    """`dsgd-teach gradescope ASSIGNMENT --out autograder.zip`: Gradescope's autograder for an assignment."""
    from .grading.gradescope_cli import main as gradescope_main

    return gradescope_main(argv)


COMMANDS = {"run": cmd_run, "doctor": cmd_doctor, "bench": cmd_bench, "grade": cmd_grade,
            "similarity": cmd_similarity, "check": cmd_check, "gradescope": cmd_gradescope}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the dsgd-teach command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"dsgd-teach {__version__}\nusage: dsgd-teach {{{','.join(COMMANDS)}}} ...\n")
        for name, fn in COMMANDS.items():
            print(f"  {name:<8} {(fn.__doc__ or '').split(':', 1)[-1].strip()}")
        return 0 if argv else 2
    if argv[0] == "--version":
        print(__version__)
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        print(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return command(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
