"""Citations checked against the text of the paper they cite: the section, figure or equation the course names is
the one that says it, and a number the course quotes is the paper's.

Read only from the course's markdown, course/NOTATION.md, the solutions and the package's docstrings; no cluster.
Set DSGD_PROSE_REV to a git revision to run them against that revision's text (each fails on the text before these
citations were checked).

What the papers say, as read for these tests:
* Li et al. (2014, OSDI): section 3.5 "Flexible Consistency" defines sequential, eventual and bounded-delay
  consistency, drawn as DAGs in Figure 6 (Figure 5 is iterations 10-12 of one worker); section 4.3 puts keys and
  servers on a consistent-hashing ring, section 4.4 "Replication and Consistency" has each server keep the key
  ranges of its k neighbours (k = 2 in their example).
* Duchi, Hazan & Singer (2011, JMLR 12): section 1.1, eq. (1), the per-coordinate step eta diag(G_t)^(-1/2) g_t;
  eq. (5) and Figure 1 ("ADAGRAD with diagonal matrices"), H_t = delta I + diag(s_t), s_t,i the root of the
  coordinate's sum of squares: delta is added to the root, not under it.
* Korthikanti et al. (2022): section 4.1, eq. (1), s b h (34 + 5 a s / h) bytes per layer; section 5 and Table 2's
  last row, full activation recomputation keeps each layer's input, 2 s b h bytes (2 s b h L in all).
* Chen et al. (2016) and Gupta et al. (2016): the counts of workers and learners of their experiments could not be
  read in their text; the course no longer attributes "a hundred" or "hundreds of learners" to them. Chen et al.'s
  abstract (ICLR 2016 workshop version) sets synchronous SGD with backup workers against asynchronous SGD, "which
  works well up to a few dozens of workers". Zhang et al. (2015), Gupta among them, ran up to 30 learners (Figure 2
  of the version read, whose section 2.4 measures a mean staleness of about n, 30 at n = 30 learners).
* Zhang, Gupta, Lian & Liu (2015, arXiv:1511.05950; IJCAI 2016): section 2.1 defines the timestamp (a scalar clock
  from 0, one tick per weight update; a gradient carries the timestamp of the weights it was computed on) and the
  staleness tau_{i,l} = i - j >= 0 of learner l's gradient of timestamp j pushed to the server at timestamp i; their
  letter is tau. Section 2.4 and Figure 1 (30 learners): under 1-softsync tau takes 0, 1 or 2, the mean under 15- and
  30-softsync stays "close to" 15 and 30, in general tau in {0, ..., 2n} with mean about n; the per-gradient rule
  alpha = alpha_0 / tau_{i,l} ends section 2.4 (section 4.3 restates it as alpha_0 / tau) and the text read does
  not say what it does at tau = 0. Section 2.3: a learner pushes its gradient before it can pull again (MPI
  blocking calls). Section 3 is the convergence analysis, not the definition.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
from prose_support import read_text

ROOT = Path(__file__).resolve().parents[1]


_read = read_text


def _flat(text: str) -> str:
    """Whitespace runs collapsed to one space."""
    return " ".join(text.split())


def _chapter(prefix: str) -> str:
    """All the markdown of chapter `prefix` as one line of text."""
    name = next(p.name for p in (ROOT / "course").glob(f"{prefix}_*.ipynb"))
    nb = nbformat.reads(_read(f"course/{name}"), as_version=4)
    return _flat(" ".join(c.source for c in nb.cells if c.cell_type == "markdown"))


def test_bounded_delay_is_li_et_al_section_3_5_figure_6():
    """Li et al. (2014) draw their consistency models in Figure 6; chapter 04 cited Figure 5 (one worker's
    iterations 10-12)."""
    ch04 = _chapter("04")
    assert "(Li et al. 2014, the parameter server, §3.5 and its Figure 6)" in ch04
    assert "Figure 5)" not in ch04
    assert "Bounded delay (Li et al. 2014, section 3.5)" in _flat(_read("course/NOTATION.md"))


def test_replication_is_li_et_al_section_4_4():
    """Chapter 03's hint and its solution name the section where Li et al. replicate key ranges on neighbours."""
    assert "Li et al. 2014, section 4.4, replicate each server's key range on its neighbours" in _chapter("03")
    solution = _flat(_read("course/solutions/03_downpour_solutions.md"))
    assert "Li et al. (2014, sections 4.3-4.4) do on their consistent-hashing ring" in solution


def test_adagrad_is_duchi_et_al_eq_1_and_their_delta_sits_outside_the_root():
    """Duchi et al.'s per-coordinate step is eq. (1) of section 1.1 and their diagonal algorithm Figure 1, with
    delta added to the root (eq. 5), as the server's eps is; NOTATION once said 'under AdaGrad's root'."""
    assert "(Duchi et al. 2011, section 1.1, eq. 1; the diagonal algorithm is their Figure 1)" in _chapter("04")
    ch03 = _chapter("03")
    assert "Duchi et al. 2011, section 1.1, eq. 1, and Figure 1, the diagonal form" in ch03
    assert "(they add it to the root, their eq. 5 and Figure 1)" in ch03
    notation = _flat(_read("course/NOTATION.md"))
    assert "under AdaGrad's root" not in notation
    assert "added to AdaGrad's root, not under it (their eq. 5 and Figure 1" in notation
    source = _read("dsgd_teach/ps/optimizers.py")
    assert "Adagrad (Duchi et al. 2011, section 1.1, eq. 1; Figure 1)" in source
    assert "/ (np.sqrt(self.accum) + self.eps)" in source  # eps outside the root, where their delta is


def test_full_recomputation_is_korthikanti_section_5_and_table_2():
    """2sbh per layer under full recomputation is Korthikanti et al.'s section 5 (Table 2, last row), not eq. 1 or
    section 4; chapter 11 once cited 'eq. 1 and section 4' for it."""
    assert "$2sbh$ when every layer is checkpointed (their section 5 and Table 2)" in _chapter("09")
    ch11 = _chapter("11")
    assert "eq. 1 and section 4" not in ch11
    assert ("keeps only its input, $2sh$ bytes (full activation recomputation: Korthikanti et al. 2022, section 5 "
            "and Table 2, for one sequence)") in ch11
    fit_source = _flat(_read("dsgd_teach/sharded/fit.py"))
    assert "2 s b h with every layer checkpointed (their section 5 and Table 2)" in fit_source
    assert "as in their section 5 and Table 2" in _flat(_read("dsgd_teach/sim/sharded.py"))


def test_full_recomputation_keeps_two_bytes_per_element_of_each_layers_input():
    """Table 2's last row, sbh(2) per layer: fit.activations under checkpointing is 2 s b h L."""
    from dsgd_teach.sharded import fit

    model = fit.Model(layers=3, hidden=64, heads=4)
    assert fit.activations(model, microbatch=2, seq=16, checkpoint=True) == 2 * 16 * 2 * 64 * 3
    assert fit.activations(model, microbatch=2, seq=16, checkpoint=False) == 3 * 16 * 2 * 64 * (34 + 5 * 4 * 16 / 64)


def test_scale_claims_are_only_what_the_papers_show():
    """Chapter 11 credited Chen et al. with 'a hundred' workers and Gupta et al. with 'hundreds of learners', counts
    that could not be found in their text; what stands is Chen et al.'s aim past the few dozen workers where
    asynchronous SGD had worked well, and Zhang et al.'s 30 learners."""
    opening = _chapter("11")
    assert "hundreds of learners" not in opening and "ran a hundred" not in opening
    assert "few dozen workers at which asynchronous SGD had worked well (Chen et al. 2016)" in opening
    assert "up to 30 learners on one parameter server (Zhang et al. 2015)" in opening
    assert "They compared 100 synchronous workers with 96 + 4 backups" not in opening
    assert "The simulator compares 100 synchronous workers with 96 + 4 backups" in opening


# --- Zhang et al. (2015): staleness is their section 2.1, the rule their section 2.4 ------------------------------

ZHANG_TEXTS = ["course/NOTATION.md", "course/solutions/04_sync_async_solutions.md",
               "course/assignments/source/ps04_syncasync/ps04_syncasync.ipynb",
               "course/assignments/source/ps10_sim/ps10_sim.ipynb", "dsgd_teach/ps/optimizers.py",
               "dsgd_teach/sim/formulas.py", "dsgd_teach/sim/papers.py"]


def _prose(relative: str) -> str:
    """A file's text as one line; for a notebook, its cells' sources joined (so LaTeX reads as written)."""
    raw = _read(relative)
    if relative.endswith(".ipynb") and raw:
        raw = "\n".join("".join(c["source"]) for c in json.loads(raw)["cells"])
    return _flat(raw)


def test_zhang_et_al_define_staleness_in_section_2_1_and_set_the_rule_in_section_2_4():
    """Zhang et al. define tau_{i,l} = i - j in section 2.1 and set alpha_0 / tau in section 2.4; the course cited
    'section 3' (their convergence analysis) for both, wrote their staleness as sigma, said sigma >= 1 for every
    asynchronous gradient (under 1-softsync it is 0, 1 or 2) and explained their mean of about N by learners that
    pull before their own gradient is applied, which their text does not say."""
    ch04, ch11 = _chapter("04"), _chapter("11")
    assert "Zhang, Gupta, Lian & Liu (2015, section 2.1) define staleness" in ch04
    assert "(Zhang et al. 2015, section 2.4" in ch04
    for body in (ch04, ch11):
        assert r"$\tau_{i,l} = i - j$" in body
    assert "(section 2.4, Figure 1" in ch11
    assert "divides by zero" in ch04 and "course's own" in ch04, "chapter 04 hides that alpha_0 / tau fails at 0"
    notation = _prose("course/NOTATION.md")
    assert r"Zhang et al.'s $\tau_{i,l} = i - j$" in notation and "(2015, section 2.1)" in notation
    server = _prose("dsgd_teach/ps/optimizers.py")
    assert "(2015, arXiv:1511.05950; IJCAI 2016) define, in their section 2.1" in server and "section 2.4" in server
    for name, body in [("chapter 04", ch04), ("chapter 11", ch11)] + [(p, _prose(p)) for p in ZHANG_TEXTS]:
        assert not re.search(r"(?:Zhang|Lian & Liu)[^§]{0,80}?section 3(?![.\d])", body), f"{name}: section 3"
        assert not re.search(r"\\sigma = i - j|\bsigma = i - j|σ = i − j", body), f"{name}: their letter is tau"
        assert not re.search(r"\\sigma \\ge 1|σ ≥ 1|sigma >= 1", body), f"{name}: their tau can be 0"
        assert not re.search(r"pulls? (?:new weights )?(?:before|without waiting)", body), f"{name}: invented pull"
