"""nbgrader's way in for a submission: read it bounded, and make its metadata problems its own failure.

`BoundedExporter` is the route's `Autograde.exporter_class`, so it is what opens every notebook autograde
converts. It reads the file with `nbread.read` (bounded, parsed in a memory-capped child; nbgrader's process never
parses a submission itself) and, while nbgrader sanitizes, strips every cell's nbgrader metadata that nbgrader
would refuse (`metadata.py`). A notebook that cannot be read becomes an empty one noting why; `DsgdGrade` then
scores it zero with that reason. What happened is noted in the notebook's metadata (`GRADING_KEY`), which
`DsgdGrade` reads: the grader's notes are taken only from the autograded copy nbgrader wrote, never from what the
student submitted.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import nbformat
from nbconvert.exporters import NotebookExporter
from nbconvert.exporters.exporter import ResourcesDict

from .. import nbread
from ..sanitize import GRADING_KEY
from ..text import clean
from .metadata import known_cells, strip_bad


class BoundedExporter(NotebookExporter):
    """NotebookExporter that reads a submission bounded, in a capped child, and strips metadata nbgrader refuses."""

    def from_filename(self, filename: str, resources: dict[str, Any] | None = None,
                      **kw: Any) -> tuple[Any, dict[str, Any]]:
        resources = resources if resources is not None else ResourcesDict()
        if not resources.get("metadata"):
            resources["metadata"] = ResourcesDict()
        path, base = os.path.split(filename)
        resources["metadata"].update(name=os.path.splitext(base)[0], path=path, modified_date=_modified(filename))
        sanitizing = getattr(self.parent, "_sanitizing", True)
        try:
            nb = nbread.read(Path(filename))
        except (nbread.Unreadable, OSError) as exc:
            nb = nbformat.v4.new_notebook()
            nb.metadata[GRADING_KEY] = {"unreadable": clean(exc, 300)}
            return self.from_notebook_node(nb, resources, **kw)
        if sanitizing:  # the submission as handed in: whatever notes it carries are the student's, not ours
            nb.metadata.pop(GRADING_KEY, None)
            problems = strip_bad(nb, self._known(resources))
            if problems:
                nb.metadata[GRADING_KEY] = {"problems": [clean(p, 300) for p in problems[:20]]}
        return self.from_notebook_node(nb, resources, **kw)

    def _known(self, resources: dict[str, Any]) -> dict[str, str]:
        """{grade_id: cell type} of the course's source notebook for this submission ({} when there is none)."""
        info = resources.get("nbgrader", {})
        coursedir = getattr(self.parent, "coursedir", None)
        if coursedir is None or "assignment" not in info:
            return {}
        folder = Path(coursedir.format_path(coursedir.source_directory, ".", info["assignment"]))
        source = folder / f"{info['notebook']}.ipynb"
        return known_cells(nbformat.read(str(source), as_version=4)) if source.is_file() else {}


def _modified(filename: str) -> str:
    try:
        stamp = datetime.datetime.fromtimestamp(os.lstat(filename).st_mtime, tz=datetime.timezone.utc)
    except OSError:
        return ""
    return stamp.strftime("%B %-d, %Y")


def notes_of(nb: Any) -> dict[str, Any]:
    """The grader's notes on an autograded notebook: {"unreadable": why} and/or {"problems": [...]}."""
    notes = nb.get("metadata", {}).get(GRADING_KEY, {})
    return notes if isinstance(notes, dict) else {}
