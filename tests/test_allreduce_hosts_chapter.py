"""Chapter 05's shaped-links cell: it says why when it cannot make hosts, and draws what it measured when it can.

The real run (network namespaces, five dask processes, links shaped to 200 Mbit/s) is the first test here, where
namespaces can be made (root, as in CI); the chapters' own runs leave the hosts out (JupyterLab runs them as Binder
does, the compat stage on a CLI deployment). How much the ring beats the star there is timing, quoted by `make bench`
(dsgd_teach/bench/shaped_hosts.py). Then, without starting anything: the fallback prints its reason and makes no
host, an outside deployment is left alone, and the cell turns a measurement into a labelled picture and ratios.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from dsgd_teach.collectives import shaped_links  # noqa: E402
from dsgd_teach.config import sized  # noqa: E402
from dsgd_teach.runtime.clusters import hosts  # noqa: E402

CHAPTER = Path(__file__).resolve().parents[1] / "course" / "05_allreduce.ipynb"


def _cell() -> str:
    cells = [c.source for c in nbformat.read(CHAPTER, as_version=4).cells
             if c.cell_type == "code" and "shaped_allreduce(" in c.source]
    assert len(cells) == 1, "chapter 05 has one cell that measures on shaped hosts"
    return cells[0]


def _run_cell() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_cell(), {"sized": sized, "pd": pd, "plt": plt})  # noqa: S102 - the chapter's own cell
    return out.getvalue()


@pytest.fixture
def no_hosts_made(monkeypatch):
    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("hosts.up called although the demonstration was skipped")

    monkeypatch.setattr(hosts, "up", refuse)


def _namespaces() -> set[str]:
    """The network namespaces on this machine (`ip netns list`)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.timeout(600)
def test_as_root_the_cell_measures_star_and_ring_on_real_shaped_hosts() -> None:
    reason = shaped_links.shaped_unavailable()
    if reason:
        pytest.skip(f"shaped hosts cannot be made here: {reason}")
    before = _namespaces()
    plt.close("all")
    printed = _run_cell()
    plt.close("all")
    for n in (3, 4):
        assert f"N = {n}: star " in printed and "star/ring measured" in printed, printed
    assert "made, measured and removed in" in printed, printed
    assert _namespaces() == before, "the cell left network namespaces behind"


def test_without_namespaces_the_cell_prints_why(monkeypatch, no_hosts_made) -> None:
    monkeypatch.setattr(hosts, "available", lambda: "network namespaces need root (CI runs as root)")
    printed = _run_cell()
    assert "shaped hosts not made here: network namespaces need root" in printed


def test_an_outside_deployment_is_left_alone(monkeypatch, no_hosts_made) -> None:
    monkeypatch.setattr(hosts, "available", lambda: None)
    monkeypatch.setenv("DSGD_SCHEDULER", "tcp://10.213.1.1:8786")
    assert "DSGD_SCHEDULER" in shaped_links.shaped_allreduce()["skipped"]
    assert "DSGD_SCHEDULER" in _run_cell()


def test_a_measurement_becomes_a_labelled_picture(monkeypatch) -> None:
    rows = [{"N": n, "algorithm": a, "measured_s": t, "predicted_s": t * 0.9}
            for n, a, t in ((3, "naive", 0.7), (3, "ring", 0.25), (4, "naive", 1.0), (4, "ring", 0.3))]
    measured = {"rate": "200mbit", "mib": 4, "rows": rows, "alpha_us": [400.0, 420.0], "link_MBps": [23.5, 23.4],
                "hosts": ["a,b,c", "a,b,c,d"], "wall_s": 40.0}
    monkeypatch.setattr(shaped_links, "shaped_allreduce", lambda **kwargs: measured)
    plt.close("all")
    printed = _run_cell()
    assert "N = 3: star 0.700 s, ring 0.250 s; star/ring measured 2.80, predicted 2.80" in printed
    assert "N = 4:" in printed and "23.4 MB/s" in printed
    title = plt.gcf().axes[0].get_title()
    assert "emulated hosts" in title and "200mbit" in title, "the plot says which mode drew it"
    plt.close("all")


def test_the_shaped_hosts_can_be_turned_off(monkeypatch, no_hosts_made) -> None:
    """DSGD_SHAPED_HOSTS=0 (a kernel with little memory) makes nothing even where namespaces could be made."""
    monkeypatch.setattr(hosts, "available", lambda: None)
    monkeypatch.setenv("DSGD_SHAPED_HOSTS", "0")
    assert "DSGD_SHAPED_HOSTS=0" in shaped_links.shaped_allreduce()["skipped"]
    assert "DSGD_SHAPED_HOSTS=0" in _run_cell()
