"""Skip slow optional imports in the grader's own short-lived processes (one per graded notebook)."""

from __future__ import annotations

import sys

#: nbformat imports jsonschema, which imports rfc3987_syntax when it is installed (jupyter_events pulls it in). That
#: module builds a lark grammar on import: 3 s of CPU, for jsonschema's "iri" format check, which no notebook
#: schema uses. A None entry in sys.modules makes jsonschema's optional import fail, and it goes on without it.
SLOW_OPTIONAL = ("rfc3987_syntax",)


def skip_slow_optional_imports() -> None:
    """Make the SLOW_OPTIONAL modules unimportable in this process (kept where one is already imported)."""
    for name in SLOW_OPTIONAL:
        sys.modules.setdefault(name, None)
