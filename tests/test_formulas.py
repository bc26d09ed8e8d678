"""The prose's formulas against the code: each number a chapter states equals the package function that computes it.

Like tests/test_prose.py these read only markdown cells (DSGD_PROSE_REV selects a git revision's text); the
functions are in dsgd_teach/sim/formulas.py. Each test names the statement it guards.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_prose import cells, chapter, text

from dsgd_teach.sim import formulas

ROOT = Path(__file__).resolve().parents[1]


def _bench_figures() -> dict[str, float]:
    """README's benchmark table: 'figure -> value' for every numeric row (last occurrence wins)."""
    out = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        m = re.match(r"\|\s*(\w+)\s*\|\s*(\w+)\s*\|\s*([-\d.e]+)\s*\|\s*$", line)
        if m:
            out[f"{m.group(1)}.{m.group(2)}"] = float(m.group(3))
    return out


# --- chapter 05: the star's time is about N times the ring's ------------------------------------------------


def test_star_over_ring_is_a_time_ratio_of_about_n():
    """The star's gather and broadcast cannot overlap: 2(N-1)(α+βB) against 2(N-1)(α+βB/N), a ratio near N.

    The load ratio N/2 ('3B against 1.5B' at N = 4) is not how much faster the ring is; the chapter states the
    time ratio and the formula that gives it."""
    body = text(chapter("05"))
    assert "3B against 1.5B" not in body.replace(" ", "").replace("$", "")
    assert not re.search(r"usually below the predicted one because the ring", body)
    assert r"\frac{\alpha + \beta B}{\alpha + \beta B / N}" in body or r"(\alpha + \beta B)/(\alpha + \beta B/N)" in body
    assert "2(N-1)(\\alpha + \\beta B)" in body
    for n in (3, 4, 8, 64):  # bandwidth-bound: the time ratio is N, the load ratio N/2
        assert formulas.star_over_ring_time(n, 0.0, 1e-9, 4 * 2**20) == pytest.approx(n, rel=1e-5)
        assert formulas.star_over_ring_load(n) == pytest.approx(n / 2)


def test_chapter_05_quotes_the_cost_models_prediction_and_the_measured_ratio_agrees():
    """The ratios cell 26 quotes (predicted 2.98 and 3.96, measured 2.70 and 3.50) are the cost model's for the
    README's fitted link, and the measured ones lie within the tolerance the chapter states."""
    cell = next(c for c in cells(chapter("05")) if "star/ring ratios" in c)
    figures = _bench_figures()
    tolerance = int(re.search(r"within about (\d+) %", cell).group(1)) / 100
    quoted = re.search(r"measured ratios were ([\d.]+) at \$N = 3\$ and ([\d.]+) at \$N = 4\$, against predictions "
                       r"of ([\d.]+) and ([\d.]+)", cell)
    assert quoted, cell
    measured_q, predicted_q = (float(quoted.group(1)), float(quoted.group(2))), (float(quoted.group(3)),
                                                                                 float(quoted.group(4)))
    for i, n in enumerate((3, 4)):
        alpha = figures[f"shaped_hosts.alpha_us_{n}ranks"] * 1e-6
        beta = 1 / (figures[f"shaped_hosts.link_MBps_{n}ranks"] * 1e6)
        nbytes = figures["shaped_hosts.message_MiB"] * 2**20
        predicted = formulas.star_over_ring_time(n, alpha, beta, nbytes)
        assert predicted == pytest.approx(predicted_q[i], abs=0.01), (n, predicted)
        assert predicted == pytest.approx(n, rel=0.02)
        measured = figures[f"shaped_hosts.star_over_ring_{n}ranks_ratio"]
        assert measured == pytest.approx(measured_q[i], abs=0.005)
        assert abs(measured / predicted - 1) <= tolerance, (n, measured, predicted)
