"""environment.yml, binder/ and pyproject.toml list the same dependencies (no conda solver is reachable here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"torch": "pytorch", "msgpack": "msgpack-python"}  # conda-forge spells these apart
BINDER_NAMES = {"torch": "pytorch-cpu", "msgpack": "msgpack-python"}


def _split(requirement: str) -> tuple[str, str]:
    match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", requirement)
    assert match, requirement
    return match.group(1).lower().replace("_", "-"), match.group(2).replace(" ", "")


def _pyproject() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(_split(d) for d in deps)


def _conda_env(path: Path) -> dict[str, str]:
    env = yaml.safe_load(path.read_text())
    assert env["channels"] == ["conda-forge"], f"{path}: use conda-forge only"
    found: dict[str, str] = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            found.update(_split(d) for d in dep["pip"])
        elif not dep.startswith(("python=", "pip")) or dep.startswith("pip:"):
            name, spec = _split(dep)
            found[name] = spec
    return found


@pytest.mark.parametrize(("path", "names"), [("environment.yml", CONDA_NAMES), ("binder/environment.yml", BINDER_NAMES)])
def test_conda_files_match_pyproject(path, names):
    expected = {names.get(n, n): spec for n, spec in _pyproject().items()}
    assert _conda_env(ROOT / path) == expected


def test_torch_is_pinned_everywhere():
    assert _pyproject()["torch"] == "==2.13.0"
    assert _conda_env(ROOT / "binder/environment.yml")["pytorch-cpu"] == "==2.13.0"


def test_gpu_extra_is_optional():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(_split(d)[0] == "dask-cuda" for d in project["dependencies"])
    assert any(_split(d)[0] == "dask-cuda" for d in project["optional-dependencies"]["gpu"])


def test_binder_scripts_follow_repo2docker_conventions():
    post = (ROOT / "binder/postBuild").read_text().splitlines()
    assert post[0].strip() == "set -e"
    assert any("pip install" in line and "-e ." in line for line in post)
    start = [line for line in (ROOT / "binder/start").read_text().splitlines() if line.strip()]
    assert start[0].startswith("#!")
    assert any("DASK_DISTRIBUTED__DASHBOARD__LINK" in line and "proxy/{port}/status" in line for line in start)
    assert start[-1].strip() == 'exec "$@"'
    assert (ROOT / "binder/start").stat().st_mode & 0o111


def test_ci_runs_exactly_the_readme_test_command():
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ci[-1].strip() == "make test"
    assert "make test" in (ROOT / "README.md").read_text()
