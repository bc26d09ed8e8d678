"""Read a submitted notebook in a child process with capped memory, and keep only what grading needs of it.

`read(path)` (in the grader) opens the file without following a link or blocking on a FIFO, checks it is a regular
file of at most MAX_BYTES, and hands the open file as stdin to `python -m dsgd_teach.grading.nbread`, which caps
its own address space (CHILD_MB), CPU time and output file size before reading, under a wall-clock timeout. The
child bounds the text (`jsonbound`: size, nesting, number of objects and elements) before parsing it with `json`
(nbformat converts older formats), and writes back a sanitized notebook (`sanitize.py`): cells of a known type with
text sources and, of their metadata, only the nbgrader part; no outputs. The grader bounds that again before
parsing it. So a parse bomb costs the grader nothing: the child refuses it and the submission scores zero with
the reason.
"""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import jsonbound

MAX_BYTES = 64 * 1024 * 1024  # a submitted notebook's file
MAX_OUT = 16 * 1024 * 1024  # the sanitized notebook (sources and nbgrader metadata only)
CHILD_MB = 1024  # the reading child's address space
CHILD_CPU_S = 60
TIMEOUT_S = 120
NOTEBOOK = jsonbound.Bounds(MAX_BYTES, max_containers=200_000, max_elements=2_000_000, max_depth=100)
SANITIZED = jsonbound.Bounds(MAX_OUT + 1024, max_containers=100_000, max_elements=400_000, max_depth=8)


class Unreadable(ValueError):
    """The notebook could not be read within the bounds; the message says why."""


def read(path: Path) -> Any:
    """The sanitized notebook (a NotebookNode) of a submitted file, read in a memory-capped child; raises Unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{path.name} is not a regular file")
        if st.st_size > MAX_BYTES:
            raise Unreadable(f"the notebook is larger than {MAX_BYTES >> 20} MB")
        return _from_child(fd)
    finally:
        os.close(fd)


def _from_child(fd: int) -> Any:
    """Run the reading child on fd (its stdin) and parse what it wrote, bounded before parsing."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.run([sys.executable, "-m", "dsgd_teach.grading.nbread"], stdin=fd, stdout=out,
                                  stderr=err, timeout=TIMEOUT_S, close_fds=True)
        except subprocess.TimeoutExpired:
            raise Unreadable(f"reading the notebook took longer than {TIMEOUT_S} s") from None
        out.seek(0)
        data = out.read(MAX_OUT + 2048)
        if proc.returncode != 0 or not data:
            err.seek(0, os.SEEK_END)
            err.seek(max(0, err.tell() - 300))
            tail = err.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise Unreadable(f"reading the notebook failed (exit {proc.returncode}, limit {CHILD_MB} MB of memory): "
                             f"{tail[0][:200]}")
    try:
        jsonbound.check(data, SANITIZED, "the notebook's cells")
        answer = json.loads(data)
    except (jsonbound.TooLarge, ValueError, RecursionError) as exc:
        raise Unreadable(str(exc)[:300]) from None
    if not isinstance(answer, dict) or not isinstance(answer.get("error", answer.get("notebook")), (str, dict)):
        raise Unreadable("the reading process sent something else than a notebook")
    if "error" in answer:
        raise Unreadable(str(answer["error"])[:300])
    import nbformat  # the grader's own import; the child never needs it for an nbformat 4 notebook

    return nbformat.from_dict(answer["notebook"])


def _limit() -> None:
    """In the child, before it reads anything: cap its memory, CPU time, output file size and open files; no core files."""
    for res, value in ((resource.RLIMIT_AS, CHILD_MB << 20), (resource.RLIMIT_CPU, CHILD_CPU_S),
                       (resource.RLIMIT_FSIZE, MAX_OUT + 4096), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_NOFILE, 256)):
        resource.setrlimit(res, (value, value))


def main() -> int:
    """The child: read stdin (bounded), check its bounds, parse, sanitize, write {"notebook"} or {"error"}."""
    from .sanitize import sanitize

    _limit()
    data = sys.stdin.buffer.read(MAX_BYTES + 1)
    try:
        jsonbound.check(data, NOTEBOOK, "the notebook")
        nb = json.loads(data)
        del data
        if not isinstance(nb, dict) or nb.get("nbformat") != 4:
            import nbformat  # older formats (v3 worksheets) are converted by nbformat; 1.6 s to import

            nb = nbformat.reads(json.dumps(nb), as_version=4)
        answer: dict[str, Any] = {"notebook": sanitize(nb)}
    except jsonbound.TooLarge as exc:
        answer = {"error": str(exc)[:300]}
    except Exception as exc:  # noqa: BLE001 - whatever the parser raises is this notebook's reason
        answer = {"error": f"not a readable notebook: {type(exc).__name__}: {str(exc)[:200]}"}
    out = json.dumps(answer, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(out) > MAX_OUT:
        out = json.dumps({"error": f"the notebook's cells hold more than {MAX_OUT >> 20} MB of text"}).encode()
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
