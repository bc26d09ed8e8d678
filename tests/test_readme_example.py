"""The README's API example, saved as a script and run the way a newcomer would (`python example.py`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def api_example() -> str:
    """The first python block under the README's "One experiment API" heading."""
    section = README.read_text().split("## One experiment API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's API section has no python example"
    return match.group(1)


def test_readme_example_has_the_main_guard():
    assert 'if __name__ == "__main__":' in api_example()


@pytest.mark.timeout(300)
def test_readme_example_runs_as_a_script(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(api_example())
    env = {**os.environ, "PYTHONPATH": str(README.parent), "DSGD_SMOKE": "1"}
    env.pop("DSGD_SCHEDULER", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final_train_loss" in proc.stdout
