"""A repository file's text as the prose tests read it: the working tree, or revision DSGD_PROSE_REV (to show a test
fails on an earlier text)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REV = os.environ.get("DSGD_PROSE_REV")


def read_text(relative: str) -> str:
    """A repository file's text, from the working tree or from revision DSGD_PROSE_REV ('' if it does not exist)."""
    if REV:
        out = subprocess.run(["git", "show", f"{REV}:{relative}"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        return out.stdout if out.returncode == 0 else ""
    path = ROOT / relative
    return path.read_text(encoding="utf-8") if path.exists() else ""
