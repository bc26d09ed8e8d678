"""The chapters' prose: statements that were once wrong stay corrected, and one notation holds across the course.

These tests read only the markdown cells of the notebooks and course/NOTATION.md; they start no cluster.
Set DSGD_PROSE_REV to a git revision (e.g. the commit before the corrections) to run them against the text of
that revision instead of the working tree: each test here fails on the text before issue 33's corrections.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import nbformat
import numpy as np
import pytest
from prose_support import read_text

from dsgd_teach.ps.optimizers import ServerAdagrad

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
CHAPTERS = sorted(p.name for p in COURSE.glob("[0-9][0-9]_*.ipynb"))


_read = read_text


@cache
def cells(chapter: str) -> tuple[str, ...]:
    """The markdown cells of one chapter, each with its whitespace runs collapsed to one space."""
    nb = nbformat.reads(_read(f"course/{chapter}"), as_version=4)
    return tuple(" ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown")


@cache
def raw_cells(chapter: str) -> tuple[str, ...]:
    """The markdown cells of one chapter as written (line structure kept, for headings)."""
    nb = nbformat.reads(_read(f"course/{chapter}"), as_version=4)
    return tuple(c.source for c in nb.cells if c.cell_type == "markdown")


def text(chapter: str) -> str:
    """All the markdown of one chapter as one line of text."""
    return " ".join(cells(chapter))


def chapter(prefix: str) -> str:
    """The notebook file name of chapter `prefix` ('04' -> '04_sync_async.ipynb')."""
    return next(name for name in CHAPTERS if name.startswith(prefix))


@cache
def notation_rows() -> dict[str, str]:
    """NOTATION.md's symbol table: each symbol (as written between $...$ in the first column) -> its row."""
    rows: dict[str, str] = {}
    for line in _read("course/NOTATION.md").splitlines():
        if not line.startswith("| $"):
            continue
        first = line.split("|")[1]
        for symbol in re.findall(r"\$([^$]+)\$", first):
            rows[_norm_symbol(symbol)] = line
    return rows


def _norm_symbol(symbol: str) -> str:
    """A symbol without spaces and braces, so `n_{k}` and `n_k` compare equal."""
    return re.sub(r"[\s{}]", "", symbol)


def test_chapters_found():
    assert len(CHAPTERS) >= 10, CHAPTERS


# --- statements that were wrong -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHAPTERS)
def test_staleness_bound_zero_is_not_called_fully_serial(name):
    """Stale synchronous parallel with s = 0 is bulk-synchronous, not serial (Ho et al. 2013)."""
    body = text(name)
    for match in re.finditer(r"fully serial", body):
        near = body[max(0, match.start() - 120):match.end() + 120]
        assert not re.search(r"s\s*=\s*0", near), f"{name}: 'fully serial' next to s = 0: ...{near}..."
    if re.search(r"stale synchronous parallel", body, re.I):
        assert "bulk-synchronous" in body, f"{name} cites SSP without saying that its s = 0 is bulk-synchronous"
        assert re.search(r"bounded[- ]delay", body, re.I), f"{name} cites SSP but not the bounded-delay rule"


@pytest.mark.parametrize("name", CHAPTERS)
def test_expected_maximum_is_the_harmonic_number(name):
    """E[max of N exponentials] = mu H_N exactly; ln N (+ gamma) only approximates H_N for large N."""
    body = text(name)
    assert not re.search(r"\\approx\s*\\mu\s*\\ln", body), f"{name}: E[max] written as ≈ μ ln N"
    assert "≈ μ ln" not in body
    if re.search(r"\\ln\s*N", body):
        assert "H_N" in body and "\\gamma" in body, f"{name} uses ln N without H_N and Euler's gamma"


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_duplicate_section_titles(name):
    """No two headings of a chapter share a title, or a number ('Reproduction 4' twice)."""
    heads = [line.lstrip("#").strip() for cell in raw_cells(name) for line in cell.splitlines()
             if re.match(r"#{1,6} ", line)]
    titles = [h.lower() for h in heads]
    assert len(titles) == len(set(titles)), f"{name}: duplicate headings {sorted(titles)}"
    labels = [m.group(1).lower() for h in heads if (m := re.match(r"(.*?\d+)\s*[·.:—–-]\s", h))]
    assert len(labels) == len(set(labels)), f"{name}: duplicate numbered headings {sorted(labels)}"


def test_one_bit_sgd_names_its_simplification_and_what_feedback_does():
    """Seide et al. quantise per column; error feedback bounds the accumulated error, it does not unbias a step."""
    section = next(c for c in cells(chapter("04")) if c.startswith("## ") and "Seide" in c and "feedback" in c)
    assert "feedback** fixes" not in section and "feedback fixes" not in section
    assert re.search(r"per column|each \**column", section), "04 does not say Seide et al. quantise per column"
    assert "§3" in section and "bounded" in section and "biased" in section


def test_adagrad_adds_the_square_before_dividing():
    """Chapter 03's Adagrad formula updates G first and says where it starts, as ServerAdagrad does."""
    cell = next(c for c in cells(chapter("03")) if c.startswith("## Why Adagrad"))
    formula = re.search(r"\$\$(.+?)\$\$", cell).group(1)
    assert formula.index("G_i \\leftarrow") < formula.index("w_i \\leftarrow"), formula
    assert "0.1" in cell and "§4.1" in cell

    rule = ServerAdagrad(2)  # the code the formula describes: first step of a coordinate with g = 2
    new = rule.apply(np.zeros(2, np.float32), np.array([2.0, 0.0], np.float32), 1.0)
    assert np.isfinite(new).all()
    assert new[0] == pytest.approx(-2.0 / np.sqrt(0.1 + 4.0), rel=1e-5)


def test_bubble_in_both_conventions():
    body = text(chapter("07"))
    assert "(p-1)/(m+p-1)" in body.replace(" ", "")
    assert re.search(r"\\dfrac\{p-1\}\{m\}|\(p-1\)/m(?!\+)", body), "07 lacks the (p-1)/m convention"
    assert "§2.3" in body and "§2.2.1" in body


def test_fedavg_defines_its_weights_and_reads_table_2_plainly():
    body = text(chapter("08"))
    assert re.search(r"n = \\sum_\{?k", body), "08 never defines n in the FedAvg average"
    assert re.search(r"n = \\sum_r n_r", body), "08 never defines n in the local-SGD average"
    assert "Algorithm 1" in body and "Table 2" in body
    assert "C = 0.1" in body, "08 does not say that McMahan et al.'s Table 2 ran C = 0.1"
    assert "twice as many rounds" in body, "08 hides that 0.5x means twice as many rounds"


def test_staleness_counting_convention_is_explained():
    """Zhang et al.'s tau_{i,l} = i - j is our tau; their mean "close to" N does not tell N - 1 from N, and the course's
    N - 1 is its own count (no protocol the paper does not describe is invented to explain an extra update)."""
    body = text(chapter("11"))
    assert "report exactly this" not in body
    assert "N-1" in body.replace(" ", "") and "\\tau_{i,l} = i - j" in body
    assert "does not tell $N - 1 = 29$ from 30" in body and "pulls new weights before" not in body
    assert "count that also includes the worker's own update" not in body


# --- numbers in the prose ----------------------------------------------------------------------------------

PROVENANCE = re.compile(r"docs/benchmarks\.md|\d{4}-\d{2}-\d{2}|Table \d|printed|your (?:own )?run")


@pytest.mark.parametrize("prefix", ["02", "08", "09", "11"])
def test_measured_ratios_say_where_they_come_from(prefix):
    """A cell that quotes a measured ratio (1.48x) names its source: the benchmark page with its date, a paper's
    table, or the learner's own run."""
    for cell in cells(chapter(prefix)):
        ratios = re.findall(r"\d+\.\d+\s*×", cell)
        if ratios:
            assert PROVENANCE.search(cell), f"{prefix}: bare past figures {ratios} in: {cell[:200]}..."


def test_hogwild_quotes_the_benchmark_page():
    """Chapter 02 quotes docs/benchmarks.md with its date, not figures from unnamed past runs."""
    body = text(chapter("02"))
    assert "0.89–0.92" not in body
    cell = next(c for c in cells(chapter("02")) if "docs/benchmarks.md" in c and "×" in c)
    assert re.search(r"\d{4}-\d{2}-\d{2}", cell) and "2-core" in cell


# --- one notation ------------------------------------------------------------------------------------------


def test_notation_page_exists_and_chapter_00_links_it():
    assert notation_rows(), "course/NOTATION.md has no symbol table"
    assert "(NOTATION.md)" in text(chapter("00")), "chapter 00 does not link NOTATION.md"
    glossary = _read("course/NOTATION.md").lower()
    for term in ("staleness", "straggler", "backup worker", "bubble", "microbatch", "allreduce", "reduce-scatter",
                 "all-gather", "parameter server", "local sgd"):
        assert term in glossary, f"NOTATION.md's glossary lacks {term!r}"


@pytest.mark.parametrize("symbol, meaning", [
    ("N", "workers"), ("K", "elements"), ("p", "stages"), ("m", "microbatches"), ("H", "local steps"),
    ("\\tau", "staleness"), ("\\alpha", "latency"), ("\\beta", "seconds per byte"), ("\\eta", "learning rate"),
])
def test_notation_core_symbols(symbol, meaning):
    row = notation_rows().get(symbol)
    assert row is not None, f"NOTATION.md has no row for ${symbol}$"
    assert meaning in row, f"NOTATION.md: ${symbol}$ should mean {meaning!r}: {row}"


STOP = {"the", "and", "that", "this", "with", "from", "each", "what", "much", "longer", "takes", "than", "before"}


def _keywords(phrase: str) -> set[str]:
    return {w for w in re.findall(r"[a-z_]{4,}", phrase.lower()) if w not in STOP}


@pytest.mark.parametrize("name", CHAPTERS)
def test_symbols_defined_in_chapters_mean_the_same_in_notation(name):
    """'where $X$ is ...' in a chapter: NOTATION.md has X, and its row shares a keyword with the definition."""
    rows = notation_rows()
    defs = re.findall(r"(?:where|with) \$([A-Za-z\\]+(?:_\{?[A-Za-z\\]+\}?)?)\$ (?:is|are|the) ([^.;:)]{3,80})",
                      text(name))
    for symbol, phrase in defs:
        row = rows.get(_norm_symbol(symbol))
        assert row is not None, f"{name} defines ${symbol}$ ({phrase!r}) but NOTATION.md does not list it"
        assert _keywords(phrase) & _keywords(row), f"{name}: ${symbol}$ is {phrase!r}, NOTATION.md says {row}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_beta_is_never_a_bandwidth(name):
    """β is seconds per byte everywhere (chapter 05's meaning); nothing divides by it or calls it a bandwidth."""
    body = text(name)
    assert not re.search(r"(?<!1)/\s*\\beta|\{[^{}]*\\beta\s*\}\s*\\right\)|\\frac\{[^{}]*\}\{[^{}]*\\beta\}", body), \
        f"{name} divides by β, as if it were a bandwidth"
    assert not re.search(r"\\beta\$?\s*(?:\(?here\)?\s*)?is an? (?:the )?bandwidth", body), \
        f"{name} calls β a bandwidth"
    assert not re.search(r"\\beta\$ here is a bandwidth", body)


@pytest.mark.parametrize("name", CHAPTERS)
def test_tau_is_never_the_averaging_period(name):
    """τ is staleness; EASGD's communication period is H (`sync_every`)."""
    body = text(name)
    assert not re.search(r"[Ee]very \$\\tau\$ (?:local )?steps", body), f"{name} uses τ as a period"


@pytest.mark.parametrize("name", CHAPTERS)
def test_bare_alpha_is_latency(name):
    """A cell that writes a bare α (not α_e) is about latency; EASGD's rate is α_e, AdaRevision's base rate η."""
    for cell in cells(name):
        if re.search(r"\\alpha(?![_A-Za-z])", cell):
            assert re.search(r"latenc|α–β|\\alpha\$–\$\\beta|alpha-beta|alpha_s", cell), \
                f"{name}: α that is not the latency in: {cell[:200]}..."


@pytest.mark.parametrize("name", CHAPTERS)
def test_worker_count_is_n(name):
    """The worker count is N: not n ranks, p cores, R replicas, nor K clients."""
    body = text(name)
    bad = re.findall(r"\$[npR]\$ \**(?:ranks|cores|workers|replicas|learners)\b|\$K\$ \**clients", body)
    assert not bad, f"{name} counts workers with another letter: {bad}"


# --- issue 46: statements corrected, each guarded ---------------------------------------------------------------


@cache
def code_cells(chapter_name: str) -> tuple[str, ...]:
    """The code cells of one chapter, as written."""
    nb = nbformat.reads(_read(f"course/{chapter_name}"), as_version=4)
    return tuple(c.source for c in nb.cells if c.cell_type == "code")


def test_hogwild_rho_is_a_maximum():
    """Recht et al. (2011, section 2) define rho as a maximum over examples, not the chance two random updates collide."""
    row = next(c for c in cells(chapter("02")) if "| $\\rho$ |" in c)
    assert "the chance two random updates can collide" not in row
    assert "a maximum" in row
    assert "largest" in _read("course/solutions/02_hogwild_solutions.md").split("## Exercise 2")[0]


def test_bounded_delay_async_sgd_converges_with_a_shrinking_step():
    body = text(chapter("04"))
    assert "no general convergence guarantee" not in body
    for source in ("Agarwal & Duchi (2011)", "Lian et al. (2015)", "Recht et al. (2011, section 4)"):
        assert source in body, source


def test_agarwal_and_duchis_rate_counts_iterations_of_n_nodes():
    """Agarwal & Duchi (2011, abstract and main result): N-node architectures reach O(1/sqrt(NT)) after T iterations,
    NT gradients in all; 'after T updates' of one gradient each would beat the optimal rate of T samples."""
    body = text(chapter("04"))
    assert "$O(1/\\sqrt{NT})$ after $T$ updates" not in body
    assert "$O(1/\\sqrt{NT})$ after $T$ iterations (each of which brings in a gradient from every node)" in body

def test_the_gate_is_not_described_as_an_ssp_clock_rule():
    solution = _read("course/solutions/04_sync_async_solutions.md").split("## Exercise 4")[1].split("\n## ")[0]
    assert "ahead of the slowest worker" not in solution
    assert "bounded-delay" in solution and "updates" in solution


def test_checkpointing_states_the_rebuilt_segment():
    body = text(chapter("09"))
    assert "L/k + k" in body and "2\\sqrt{L}" in body


def test_ddp_divides_before_the_allreduce():
    body = text(chapter("09"))
    assert "waits for the outstanding buckets and divides by $N$." not in body
    assert "*before* the allreduce" in body


def test_ring_optimality_bounds_the_busiest_rank():
    exercise = next(c for c in cells(chapter("11")) if c.startswith("## What to try"))
    assert "can send fewer per rank" not in exercise and "busiest rank" in exercise


def test_the_delay_table_says_it_ran_1400_workers():
    cell = next(c for c in cells(chapter("11")) if "| 1400 |" in c)
    assert "**1400** workers, not the 1000" in cell


def test_lians_rate_counts_updates_with_t_not_the_vector_size_k():
    body = text(chapter("04"))
    assert "O(1/\\sqrt{K})$ after $K$ updates" not in body and "O(1/\\sqrt{T})$ after $T$ updates" in body


def test_averaging_message_and_client_count():
    body = text(chapter("08"))
    assert "clients $K$" not in body and "$K + 3$ elements" in body


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_vague_sources(name):
    """'our sources', 'the guide', '(Codemia)': a learner cannot look these up."""
    body = text(name)
    for vague in ("our sources", "the guide", "Codemia", "this course's sources", "survey source"):
        assert vague.lower() not in body.lower(), f"{name} cites {vague!r}"


@pytest.mark.parametrize("prefix, shown", [
    ("04", ("SyncRound", "SyncCoordinator.push", "quantize", "OneBitCompressor.encode", "ServerAdaRevision.apply",
            "ServerDCASGD.apply", "staleness_aware_scale")),
    ("07", ("decoupled_rank", "_tp_rank", "_SumOverRanks")),
    ("08", ("easgd_worker", "average_parameters")),
    ("09", ("ZeroAdam.step", "Stage0", "Stage1", "Stage2", "Stage3")),
    ("10", ("flops_per_token", "ColumnParallelLinear", "RowParallelLinear", "GatherSequence", "merge",
            "RingAttention.forward", "RingAttention.backward", "route", "ExpertParallelMoE.forward", "all_to_all",
            "load_balancing_loss", "aux_loss_of", "composed_rank")),
    ("11", ("memory_bytes", "rebuilt_layer", "buffer_bytes", "phases_under_passes", "predict_at_scale")),
])
def test_sections_show_the_code_they_describe(prefix, shown):
    code = "\n".join(code_cells(chapter(prefix)))
    for name in shown:
        assert f"show_source({name})" in code, f"chapter {prefix} does not show {name}"


# --- every symbol a chapter uses is on the notation page, listed for that chapter -------------------------------

_GREEK = ("alpha beta gamma delta epsilon eta theta lambda mu nu rho sigma tau phi psi omega Omega Delta Psi Sigma "
          "Gamma Lambda Phi").split()
_MACROS_WITH_TEXT = r"\\(?:text|mathrm|operatorname|mathbb|textbf|mathit|mathcal)\{[^{}]*\}"


def _math_spans(markdown: str) -> list[str]:
    """The $...$ and $$...$$ spans of markdown, code spans and blocks left out."""
    markdown = re.sub(r"```.*?```", "", markdown, flags=re.S)
    markdown = re.sub(r"`[^`]*`", "", markdown)
    spans = re.findall(r"\$\$(.+?)\$\$", markdown, flags=re.S)
    return spans + re.findall(r"\$([^$]+)\$", re.sub(r"\$\$(.+?)\$\$", "", markdown, flags=re.S))


def _span_symbols(span: str, listed: set[str]) -> set[str]:
    """Letters a math span uses as symbols: Latin letters and Greek macros, with a subscript kept where the notation
    page lists the subscripted form (H_N, S_t, eta_old); \\text{...}, function names and subscripts' own letters
    are not symbols."""
    s = re.sub(r"_\\(?:text|mathrm)\{([^{}]*)\}", r"_{\1}", span)  # n_\text{fetch} is n_{fetch}
    s = re.sub(_MACROS_WITH_TEXT, " ", s)
    out = set()
    token = re.compile(r"(?<![A-Za-z\\_^])(\\(?:" + "|".join(_GREEK) + r")(?![A-Za-z])|[A-Za-z](?![A-Za-z]))"
                       r"(?:_(\{[^{}]*\}|\\?[A-Za-z0-9]+))?")
    for m in token.finditer(re.sub(r"\\(?!(?:" + "|".join(_GREEK) + r")(?![A-Za-z]))[A-Za-z]+", " ", s)):
        base, sub = m.group(1), _norm_symbol(m.group(2) or "")
        out.add(f"{base}_{sub}" if f"{base}_{sub}" in listed else base)
    return out


@cache
def notation_chapters() -> dict[str, set[str]]:
    """NOTATION.md's symbol table: symbol -> the chapters its row lists ('00–11' expanded)."""
    out: dict[str, set[str]] = {}
    for line in _read("course/NOTATION.md").splitlines():
        if not line.startswith("| $"):
            continue
        cols = line.split("|")
        chapters = set()
        for a, b in re.findall(r"(\d\d)(?:–(\d\d))?", cols[-2]):
            chapters |= {f"{i:02d}" for i in range(int(a), int(b or a) + 1)}
        for symbol in re.findall(r"\$([^$]+)\$", cols[1]):
            for one in symbol.split(","):
                one = re.sub(r"\\(?:text|mathrm)\{([^{}]*)\}", r"\1", one)
                out.setdefault(_norm_symbol(one), set()).update(chapters)
    return out


def chapter_symbols(name: str) -> set[str]:
    """Every symbol the markdown of chapter `name` writes in math."""
    listed = set(notation_chapters())
    return {sym for span in _math_spans("\n".join(raw_cells(name))) for sym in _span_symbols(span, listed)}


@pytest.mark.parametrize("name", CHAPTERS)
def test_notation_lists_every_symbol_of_every_chapter(name):
    """A symbol a chapter writes must have a row on NOTATION.md that names this chapter: a letter used in a sense
    the page does not list for that chapter (b for the batch in 01, x for the parameters in 02, p for a power of two
    in 05) fails here until the page lists it, or the chapter uses the course's letter."""
    rows, number = notation_chapters(), name[:2]
    unlisted = sorted(s for s in chapter_symbols(name) if number not in rows.get(_norm_symbol(s), set()))
    assert not unlisted, f"{name} writes {unlisted}, which NOTATION.md does not list for chapter {number}"


def test_the_notation_test_catches_a_letter_in_an_unlisted_sense():
    listed = set(notation_chapters())
    assert _span_symbols(r"\frac1b \sum_{i \in B_t} \nabla \ell(w_t; x_i)", listed) >= {"b", "w", "x"}
    assert "b" not in {s for s, ch in notation_chapters().items() if "01" in ch}, "b is backups, never the batch"
    assert "p" not in {s for s, ch in notation_chapters().items() if "05" in ch}, "p is stages; 05 has none"


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (COURSE / "assignments" / "source").glob(
    "*/*.ipynb")))
def test_assignments_count_ranks_with_n(path):
    """ps05 and ps11 once counted ranks with p (p is pipeline stages), ps07 with n (n is rows)."""
    nb = nbformat.reads(_read(path), as_version=4)
    body = " ".join(" ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    bad = re.findall(r"\$[pn]\$ (?:ranks|workers)|Each of \$p\$ ranks|\$p - 1\$ (?:reduce-scatter|all-gather)", body)
    assert not bad, f"{path} counts ranks with another letter: {bad}"


def test_fsdp_prefetching_cites_its_sections():
    """Zhao et al. (2023): backward and forward prefetching are sections 3.3.2 and 3.3.3, the rate limiter that keeps
    at most two all-gathers in flight (the two gathered units the fit counts) is section 3.4.2."""
    for body in (text(chapter("09")), " ".join(_read("course/solutions/09_sharded_data_parallel_solutions.md").split())):
        assert re.search(r"section 3\.3\.2", body) and "3.3.3" in body and "section 3.4.2" in body
    assert "Zhao et al. 2023, section 3.4.2" in text(chapter("11"))


def _references(prefix: str) -> tuple[str, str]:
    """A chapter's markdown without its references, and its references paragraph (from '**References.**' to the end
    of that cell)."""
    ch = cells(chapter(prefix))
    i = next((i for i, c in enumerate(ch) if "**References.**" in c), None)
    assert i is not None, f"chapter {prefix} has no **References.** paragraph"
    before, refs = ch[i].split("**References.**", 1)
    return " ".join((*ch[:i], before, *ch[i + 1:])), refs


@pytest.mark.parametrize("prefix, least", [("04", 12), ("05", 6), ("06", 3), ("11", 12)])
def test_chapters_give_full_references(prefix, least):
    """Every 'Author (et al.) year' a chapter cites has an entry, with a title, in its References: chapter 04 once
    listed six sources by nickname only ('Recht et al. 2011 (Hogwild!)') and left out the eight others it leans on,
    chapter 06 had no references at all."""
    cited_in, refs = _references(prefix)
    cited = set(re.findall(r"([A-Z][a-z]+)(?: et al\.| & [A-Z][\w ]+?)?,? \(?(\d{4}[ab]?)\b", cited_in))
    cited = {(name, year) for name, year in cited if name not in {"At", "In", "The"}}
    assert len(cited) >= least, cited
    for name, year in sorted(cited):
        assert re.search(rf"{name}\b[^*]*?\({year}\), \*", refs), f"chapter {prefix} cites {name} {year} without a reference"


def test_horovods_scale_is_the_128_gpus_of_its_benchmarks():
    """Sergeev & Del Balso (2018) benchmarked Horovod on 1 to 128 GPUs (chapter 05 quotes its 128-GPU efficiency);
    chapter 11 once credited them, and Baidu, with 'thousands of GPUs'."""
    opening = cells(chapter("11"))[0]
    assert "thousands of GPUs" not in opening
    assert "up to 128 GPUs (Horovod's benchmarks, Sergeev & Del Balso 2018)" in opening
    assert "on 128 GPUs" in text(chapter("05"))


def test_the_intra_op_sweep_stops_at_the_cores_the_prose_says_so():
    """Chapter 06's intra-op sweep runs T = 1 .. cores (run_intra_op: max_threads None means the worker's cores), so
    the prose cannot read 'with more threads than cores the speedup falls below 1 thread's' off that plot; past the
    cores (the panel's sliders reach twice them) the speedup stops growing and often drops."""
    import inspect

    from dsgd_teach.threads import intra, panel
    from dsgd_teach.threads.common import counts

    cell = next(c for c in cells(chapter("06")) if c.startswith("The dashed line is the ideal"))
    assert "with more threads than cores the speedup falls *below* 1 thread's" not in cell
    assert "The sweep stops at the worker's cores" in cell and "twice the cores" in cell
    assert intra.IntraOpConfig().max_threads is None
    assert "config.max_threads or cores" in inspect.getsource(intra.run_intra_op)
    assert max(counts(8)) == 8
    assert "2 * worker_cores(client)" in inspect.getsource(panel.threads_panel)

def test_distbelief_citation_names_both_sections():
    """Dean et al. (2012): section 3 is model parallelism (a partition's work over a machine's cores), section 4 the
    data parallelism across machines (Downpour); chapter 06 once credited both to section 3."""
    body = text(chapter("06"))
    assert "(2012, section 3) already combined" not in body
    assert "(their section 3)" in body and "across machines (section 4)" in body


#: Letters a solution may write outside NOTATION.md's rows for its chapter: solutions 02 quotes Recht et al.'s
#: step-decay factor beta (saying it is not NOTATION's) and names n_nz, n_features.
_SOLUTION_QUOTES = {"02": {"\\beta", "n"}}


@pytest.mark.parametrize("number", ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "11"])
def test_solutions_use_the_notation_of_their_chapter(number):
    """The worked solutions follow NOTATION.md as the chapters do (X_(k) for an order statistic, f for the loss,
    u for a unit once slipped in): every symbol a solution writes has a row that names its chapter."""
    path = next(p for p in (COURSE / "solutions").glob(f"{number}_*_solutions.md"))
    rows, listed = notation_chapters(), set(notation_chapters())
    symbols = {s for span in _math_spans(_read(str(path.relative_to(ROOT)))) for s in _span_symbols(span, listed)}
    unlisted = sorted(s for s in symbols - _SOLUTION_QUOTES.get(number, set())
                      if number not in rows.get(_norm_symbol(s), set()))
    assert not unlisted, f"{path.name} writes {unlisted}, which NOTATION.md does not list for chapter {number}"
