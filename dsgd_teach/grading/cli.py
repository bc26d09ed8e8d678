"""`dsgd-teach grade SUBMISSIONS_DIR`: grade a class against the assignment sources (entry for the main CLI)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import container, deadlines
from .batch import Limits, grade_batch
from .canvas import match, read_roster
from .export import CANVAS_UNMATCHED, FORMATS, export
from .paths import default_source_dir
from .safeio import UnsafeOutput


def build_parser() -> argparse.ArgumentParser:
    """The `grade` sub-command's arguments."""
    p = argparse.ArgumentParser(prog="dsgd-teach grade", description="Grade submitted notebooks in sandboxed kernels.")
    p.add_argument("submissions", type=Path, help="folder of <student>/[<assignment>/]*.ipynb or <student>.ipynb")
    p.add_argument("--assignment", help="grade only this assignment (e.g. ps01_sgd); students without it get 0")
    p.add_argument("--out", type=Path, default=Path("graded"), help="where grades.csv and feedback/ go")
    p.add_argument("--source", type=Path, default=None, help="assignment sources (default: course/assignments/source)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--notebook-s", type=int, default=900,
                   help="wall-clock seconds per notebook, whatever its number of cells (default 900)")
    p.add_argument("--memory-mb", type=int, default=1536, help="address-space limit per kernel (default 1536)")
    p.add_argument("--cpu-s", type=int, default=600, help="CPU seconds per kernel (default 600)")
    p.add_argument("--seed", type=int, default=None, help="seed for hidden-test inputs (default: random per batch)")
    p.add_argument("--jobs", type=int, default=None,
                   help="submissions graded at once (default 1; with --scheduler, the cluster's worker threads)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="grade on the dask cluster at ADDRESS (e.g. tcp://10.0.0.5:8786): each submission runs in "
                        "a sandbox on one worker's host, verdicts and files are made here")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--export", action="append", choices=FORMATS, default=[],
                   help="also write grades for a learning-management system: gradescope (results.json per "
                        "submission under OUT/gradescope/) or canvas (OUT/canvas_grades.csv); may be repeated")
    p.add_argument("--roster", type=Path, default=None,
                   help="with --export canvas: the course's Canvas gradebook export (CSV); each folder is matched "
                        "to its student by SIS User ID, SIS Login ID or ID, the unmatched listed in "
                        "OUT/canvas_unmatched.csv")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="grade without the OS sandbox (bubblewrap); grades.csv and every feedback page say so")
    p.add_argument("--container-mode", action="store_true",
                   help="where bubblewrap cannot start (no user namespaces, e.g. in Docker), grade in container mode: "
                        "a uid of its own per submission, seccomp, rlimits, no namespaces (see grading/README.md); "
                        f"also switched on by {container.SWITCH}=1")
    deadlines_args(p)
    return p


def deadlines_args(p: argparse.ArgumentParser) -> None:
    """--due, --late-penalty, --late-cutoff-days, --extensions (shared with `dsgd-teach gradescope`)."""
    p.add_argument("--due", default=None, help="due date, ISO 8601 with a UTC offset (e.g. 2026-12-01T23:59+00:00)")
    p.add_argument("--late-penalty", type=float, default=0.0,
                   help="fraction of the points earned deducted per started day late (e.g. 0.1)")
    p.add_argument("--late-cutoff-days", type=float, default=None,
                   help="days after the due date past which a submission earns nothing")
    p.add_argument("--extensions", type=Path, default=None, help="CSV with columns student,days: extra days each")


def policy_of(args: argparse.Namespace) -> deadlines.LatePolicy | None:
    """The late policy the arguments ask for (None without --due); ValueError names a bad value."""
    if args.due is None:
        if args.late_penalty or args.late_cutoff_days is not None or args.extensions is not None:
            raise ValueError("--late-penalty, --late-cutoff-days and --extensions need --due")
        return None
    return deadlines.load_policy(args.due, args.late_penalty, args.late_cutoff_days, args.extensions)


def main(argv: list[str]) -> int:
    """Run the grader; 0 when the batch completed (whatever the grades), 2 on a usage or source error."""
    args = build_parser().parse_args(argv)
    if not args.submissions.is_dir():
        print(f"error: {args.submissions} is not a folder", file=sys.stderr)
        return 2
    source = args.source or default_source_dir()
    if source is None or not source.is_dir():
        print("error: assignment sources not found; pass --source DIR", file=sys.stderr)
        return 2
    try:
        policy = policy_of(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    late = None if policy is None else (
        lambda sub: policy.apply(sub.grades, deadlines.submitted_at(sub.path), sub.student))
    sandbox = container.select(args.unsafe_no_sandbox, args.container_mode or container.enabled())
    roster = None
    if args.roster is not None:
        if "canvas" not in args.export:
            print("error: --roster needs --export canvas", file=sys.stderr)
            return 2
        try:
            roster = read_roster(args.roster)
        except (OSError, ValueError, UnsafeOutput) as exc:
            print(f"error: the roster: {exc}", file=sys.stderr)
            return 2
    cluster = None
    if args.scheduler:
        from .cluster import ClusterRun

        try:
            cluster = ClusterRun(args.scheduler, sandbox=sandbox)
        except (OSError, RuntimeError, ValueError) as exc:
            print(f"error: the dask cluster at {args.scheduler}: {exc}", file=sys.stderr)
            return 2
    try:
        subs = grade_batch(args.submissions, source, args.out, assignment=args.assignment,
                           limits=Limits(args.timeout, args.memory_mb, args.cpu_s, args.notebook_s), seed=args.seed,
                           jobs=args.jobs or (cluster.slots if cluster else 1), progress=not args.no_progress,
                           sandbox=sandbox, late=late, run=cluster)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        by = cluster.graded_by() if cluster is not None else None
        if cluster is not None:
            cluster.close()
    total = sum(g.points for s in subs for g in s.grades)
    print(f"graded {len(subs)} notebook(s), {total:g} points in all -> {args.out / 'grades.csv'}")
    if by:
        print(f"runs graded per worker: {', '.join(f'{w} {n}' for w, n in sorted(by.items()))}")
    if args.export:
        try:
            written = export(args.out, subs, args.export, roster=roster)
        except (OSError, ValueError, UnsafeOutput) as exc:
            print(f"error: the export failed: {exc}", file=sys.stderr)
            return 2
        print(f"exported {', '.join(args.export)}: {len(written)} file(s) under {args.out}")
        if roster is not None:
            m = match([s.student for s in subs], roster)
            print(f"canvas roster: {len(m.found)} folder(s) matched, {len(m.folders_without_student)} folder(s) and "
                  f"{len(m.students_without_folder)} student(s) unmatched (see {args.out / CANVAS_UNMATCHED})")
    if sandbox == "container":
        print(f"NOTE: graded in {container.LABEL}", file=sys.stderr)
    if args.unsafe_no_sandbox:
        print("WARNING: graded with --unsafe-no-sandbox; these grades are not protected against a hostile class",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
