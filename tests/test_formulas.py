"""The prose's formulas against the code: each number a chapter states equals the package function that computes it.

Like tests/test_prose.py these read only markdown cells (DSGD_PROSE_REV selects a git revision's text); the
functions are in dsgd_teach/sim/formulas.py. Each test names the statement it guards.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_prose import cells, chapter, code_cells, text

from dsgd_teach.sim import formulas

ROOT = Path(__file__).resolve().parents[1]


def _plain(path: str) -> str:
    """A course file's text; for a notebook, its cells' sources joined (so LaTeX reads as written)."""
    from test_prose import _read

    raw = _read(path)
    if path.endswith(".ipynb") and raw:
        return "\n".join("".join(c["source"]) for c in json.loads(raw)["cells"])
    return raw


def _bench_figures() -> dict[str, float]:
    """The benchmark table of docs/benchmarks.md: 'figure -> value' for every numeric row (last occurrence wins)."""
    out = {}
    for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines():
        m = re.match(r"\|\s*(\w+)\s*\|\s*(\w+)\s*\|\s*([-\d.e]+)\s*\|\s*$", line)
        try:
            if m:
                out[f"{m.group(1)}.{m.group(2)}"] = float(m.group(3))
        except ValueError:  # a range such as a load average, "1.8-2.4": not a figure
            pass
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


# --- chapters 04 and 11: one staleness, one staleness-aware rule ---------------------------------------------

STALENESS_TEXTS = ["course/NOTATION.md", "course/solutions/04_sync_async_solutions.md",
                   "course/solutions/11_at_scale_solutions.md",
                   "course/assignments/source/ps04_syncasync/ps04_syncasync.ipynb",
                   "course/assignments/source/ps10_sim/ps10_sim.ipynb"]


def test_the_staleness_aware_rule_is_lr_over_tau_plus_one_everywhere():
    """Zhang et al.'s tau_{i,l} = i - j (2015, section 2.1) is our tau; their alpha_0 / tau (section 2.4) divides by
    zero at tau = 0, and the course's own rule is lr / (tau + 1). Chapter 04, the server, the simulator, ps04 and
    NOTATION all say so; the old lr / max(1, tau), which left tau <= 1 untouched, is nowhere."""
    from dsgd_teach.ps.optimizers import ServerStalenessAware, staleness_aware_scale

    for tau in range(6):
        assert staleness_aware_scale(tau) == pytest.approx(1 / (tau + 1))
        assert formulas.staleness_aware_step(0.6, tau) == pytest.approx(0.6 / (tau + 1))
        assert ServerStalenessAware().scale(10, 10 + tau) == pytest.approx(1 / (tau + 1))  # server: version - read
        assert formulas.staleness(10, 10 + tau + 1) == tau
    body = text(chapter("04"))
    assert r"\frac{\eta}{\tau_t + 1}" in body, "chapter 04 does not state the rule lr / (tau + 1)"
    assert r"\tau_{i,l} = i - j" in body and "course's own choice" in body
    assert "the same schedule counted differently" not in body
    for name in (chapter("04"), chapter("11")):
        assert not re.search(r"\\frac\{\\eta\}\{\\max\(1", text(name)), f"{name} states lr / max(1, tau)"
    for path in STALENESS_TEXTS:
        assert not re.search(r"\\frac\{\\eta\}\{\\max\(1|/ max\(1, (?:tau|\\tau|v - r|version - read)",
                             _plain(path)), f"{path} still divides by max(1, tau)"
    assert r"\frac{\eta}{\tau + 1}" in _plain(STALENESS_TEXTS[3]), "ps04 does not state lr / (tau + 1)"
    assert r"$\eta/(\tau + 1)$" in _plain("course/NOTATION.md")


def test_round_robin_staleness_is_n_minus_one():
    body = text(chapter("11"))
    assert "exactly $N-1$ updates old" in body
    assert formulas.round_robin_staleness(1000) == 999


# --- chapter 11: the 70B fit and what overlap hides --------------------------------------------------------------


def test_chapter_11s_70b_answer_is_fit_py_with_the_rebuilt_layer_and_the_buffers():
    """'ZeRO-3 fits from N = 15 (79.8 GiB: 64.3 states, 5.0 checkpoints, 6.1 rebuilt layer, 4.5 buffers)' is what
    fewest_gpus and fit.py give; the old 'N = 13 (79 GiB)' left out Korthikanti's rebuilt layer and the gathered
    units (chapter 09 counts both)."""
    from dsgd_teach.sharded.fit import will_it_fit
    from dsgd_teach.sim import TRANSFORMERS, ShardedSimConfig, fewest_gpus, simulate_sharded_step

    cell = next(c for c in cells(chapter("11")) if c.startswith("**The answer.**"))
    m = re.search(r"ZeRO-3 fits from \$N = (\d+)\$ \(([\d.]+) GiB per GPU: ([\d.]+) GiB of model states, ([\d.]+) of "
                  r"kept checkpoints, ([\d.]+) for the layer rebuilt in backward, ([\d.]+) of buffers\)", cell)
    assert m, cell[:300]
    n = int(m.group(1))
    table = fewest_gpus("70B")
    assert table.fewest_gpus.isna().tolist() == [True, True, True, False]
    assert n == int(table.fewest_gpus.iloc[3])
    c = ShardedSimConfig(workers=n)
    row = simulate_sharded_step(c)
    for group, key in zip(range(2, 7), ("total_gib", "states_gib", "activations_gib", "rebuilt_gib", "buffers_gib"),
                          strict=True):
        assert float(m.group(group)) == pytest.approx(row[key], abs=0.051), key
    fit = will_it_fit(TRANSFORMERS["70B"][0], n, 3, c.microbatch, c.seq, c.checkpoint, gpu_gib=80.0)
    assert fit["fits"] and fit["total_gib"] == row["total_gib"]
    assert not will_it_fit(TRANSFORMERS["70B"][0], n - 1, 3, c.microbatch, c.seq, c.checkpoint)["fits"]
    assert "ZeRO-3 fits from $N = 13$ (79 GiB" not in cell


def test_chapter_11_says_stages_1_to_3_lose_the_same_time_and_ddp_none():
    """ZeRO-1/2's all-gather runs after the optimizer step (Rajbhandari et al. 2020, section 7.2.1): overlapped, stages
    1-3 take the same step, DDP hides everything behind backward (sim/sharded.py)."""
    from dsgd_teach.sim import ShardedSimConfig, simulate_sharded_step

    body = text(chapter("11"))
    assert "*after* the optimizer step" in body
    assert "hidden behind the backward pass when overlapped" not in body
    rows = {s: simulate_sharded_step(ShardedSimConfig(workers=1024, stage=s)) for s in range(4)}
    lost = float(re.search(r"stages 1, 2 and 3 all take about ([\d.]+) s longer than DDP's step", body).group(1))
    for s in (1, 2, 3):
        assert rows[s]["step_s"] - rows[0]["step_s"] == pytest.approx(lost, abs=0.1), s
    assert rows[0]["exposed_comm_s"] == pytest.approx(0.0, abs=1e-9)
    computes = float(re.search(r"each step computes for ([\d.]+) s", body).group(1))
    assert rows[0]["compute_s"] == pytest.approx(computes, abs=0.05)



def test_chapter_11s_other_70b_numbers_are_the_simulators():
    """Every other number of Reproduction 6 is the simulator's or fit.py's: 2Ψ bytes (120 GiB) that stage 2 keeps, 16.5
    GiB per GPU at 1024, 485 GiB of activations without checkpointing, a 5.2 s ring phase, a 10.6 s backward and a
    3.5 s forward, stage 3 twice the compute without overlap; and Ψ ≈ 65·10^9 against Llama 2 70B's 69·10^9, about
    7 % more (it once said 6 %)."""
    from dsgd_teach.sharded.fit import GIB
    from dsgd_teach.sim import ShardedSimConfig, simulate_sharded_step

    cells11 = cells(chapter("11"))
    shape = next(c for c in cells11 if c.startswith("## Reproduction 6"))
    answer = next(c for c in cells11 if c.startswith("**The answer.**"))
    rows = {s: simulate_sharded_step(ShardedSimConfig(workers=1024, stage=s)) for s in range(4)}
    psi = rows[0]["params"]
    assert psi / 1e9 == pytest.approx(65, abs=0.5) and "$\\Psi \\approx 65 \\cdot 10^9$" in shape
    more = int(re.search(r"makes the real model 69B, about (\d+) % more than shown", shape).group(1))
    assert more == round(100 * (69e9 / psi - 1))
    keeps = int(re.search(r"\$2\\Psi\$ bytes, (\d+) GiB", answer).group(1))
    assert keeps == int(2 * psi / GIB)
    at_1024 = float(re.search(r"needs about ([\d.]+) GiB at 1024", answer).group(1))
    assert rows[3]["total_gib"] == pytest.approx(at_1024, abs=0.05)
    no_ckpt = int(re.search(r"leaves (\d+) GiB of activations", answer).group(1))
    assert simulate_sharded_step(ShardedSimConfig(workers=1024, stage=3, checkpoint=False))["activations_gib"] == \
        pytest.approx(no_ckpt, abs=0.5)
    phase = float(re.search(r"each ring phase moves about \$2\\Psi\$ bytes in about ([\d.]+) s", answer).group(1))
    assert rows[0]["comm_s"] / 2 == pytest.approx(phase, abs=0.05)  # DDP's allreduce is two ring phases
    assert rows[3]["comm_s"] / 3 == pytest.approx(phase, abs=0.05)  # stage 3: gather, gather, reduce-scatter
    backward = float(re.search(r"behind the ([\d.]+) s backward pass", answer).group(1))
    forward = float(re.search(r"outlasts the ([\d.]+) s\s+forward pass", answer).group(1))
    assert rows[0]["compute_s"] * 6 / 8 == pytest.approx(backward, abs=0.05)  # 6Ψ of the 8Ψ per token
    assert rows[0]["compute_s"] * 2 / 8 == pytest.approx(forward, abs=0.05)
    assert phase > forward and 2 * phase < backward  # what the cell concludes from them
    no_overlap = simulate_sharded_step(ShardedSimConfig(workers=1024, stage=3, overlap=False))
    assert "stage 3 takes twice as long as\nthe compute" in _plain(f"course/{chapter('11')}") or \
        "stage 3 takes twice as long as the compute" in answer
    assert no_overlap["step_s"] / no_overlap["compute_s"] == pytest.approx(2, abs=0.15)


def test_chapter_11s_machine_numbers_are_the_simulators_defaults():
    """Reproduction 3's 100 MB model on 10 GB/s links with 5 us latency, and Reproduction 6's 4096-token sequence,
    150 TFLOP/s (LLaMA 65B's 380 tokens/s per GPU times 6Ψ) and 200 Gb/s links with β = 4·10^-11 s per byte, are the
    defaults the chapter's calls run with (papers.allreduce_vs_workers, ShardedSimConfig)."""
    import inspect

    from dsgd_teach.sim import ShardedSimConfig
    from dsgd_teach.sim.papers import allreduce_vs_workers

    body = text(chapter("11"))
    defaults = {k: v.default for k, v in inspect.signature(allreduce_vs_workers).parameters.items()}
    assert "a 100 MB model, links of 10 GB/s ($\\beta = 10^{-10}$ s per byte), latency $\\alpha = 5\\,\\mu s$" in body
    assert 4 * defaults["elements"] == 100e6 and defaults["bandwidth_Bps"] == 10e9 and defaults["alpha_s"] == 5e-6
    c = ShardedSimConfig()
    assert "$s = 4096$ tokens" in body and c.seq == 4096 and c.microbatch == 1
    assert "at\n150 TFLOP/s" in _plain(f"course/{chapter('11')}") or "at 150 TFLOP/s" in body
    assert c.flop_s == 150e12 and 380 * 6 * 65.2e9 == pytest.approx(c.flop_s, rel=0.02)
    assert "200 Gb/s (`bandwidth_Bps=25e9`, so $\\beta = 4 \\cdot 10^{-11}$ s per byte)" in body
    assert c.bandwidth_Bps == 200e9 / 8 and 1 / c.bandwidth_Bps == pytest.approx(4e-11) and c.alpha_s == 5e-6


def test_chapter_11s_simulator_speed_is_the_benchmarks():
    """Chapter 11 once said simulating a hundred workers for a minute 'takes a second or two of ours'; at the default
    5 ms gradient that is about 400 000 gradient events, far more than the benchmark's pace. It now quotes the
    benchmark (dsgd_teach/bench/sim.py): 1000 synchronous workers for 100 steps, wall seconds and simulated seconds
    from docs/benchmarks.md."""
    import inspect

    from dsgd_teach.bench import sim as sim_bench

    cell = next(c for c in cells(chapter("11")) if c.startswith("## What is simulated, and how"))
    assert "a minute of their time takes a second or two of ours" not in cell
    m = re.search(r"(\d+) synchronous workers for (\d+) steps, about (\d+) simulated seconds, took ([\d.]+) s of ours",
                  cell)
    workers, steps, simulated, wall = int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))
    figures = _bench_figures()
    assert "SimConfig(workers=1000, steps=steps" in inspect.getsource(sim_bench.measure) and workers == 1000
    assert steps == figures["sim.sync_1000w_steps"]
    assert wall == round(figures["sim.sync_1000w_wall_s"], 1)
    assert simulated == round(figures["sim.sync_1000w_wall_s"] * figures["sim.sync_1000w_sim_per_wall_ratio"])


def test_chapter_11s_delay_table_is_the_benchmark_table():
    """Reproduction 5's table (4 and 1400 workers: mean delay, AdaGrad's and AdaRevision's final loss, mean ± sd) and
    its '3000 updates, learning rate 0.5' are docs/benchmarks.md's delay_tolerant rows, rounded as written."""
    figures = _bench_figures()
    cell = next(c for c in cells(chapter("11")) if "| 1400 |" in c)
    assert f"{int(figures['delay_tolerant.updates'])} updates, learning rate {figures['delay_tolerant.lr']:g}" in cell
    rows = re.findall(r"\| (\d+) \| (\d+) \| ([\d.]+) ± ([\d.]+) \| ([\d.]+) ± ([\d.]+) \|", cell)
    assert [int(r[0]) for r in rows] == [4, 1400], rows
    for workers, delay, *losses in rows:
        key = f"delay_tolerant.n{workers}"
        assert int(delay) == round(figures[f"{key}_adagrad_mean_delay"])
        for (mean, sd), rule in zip((losses[:2], losses[2:]), ("adagrad", "adarevision"), strict=True):
            digits = len(mean.split(".")[1])
            assert float(mean) == pytest.approx(figures[f"{key}_{rule}_loss_mean"], abs=0.6 * 10**-digits), (key, rule)
            assert float(sd) == pytest.approx(figures[f"{key}_{rule}_loss_sd"], abs=0.6 * 10**-len(sd.split(".")[1]))

# --- the other formulas the prose states -----------------------------------------------------------------------


def test_expected_maxima_quoted_in_chapter_04():
    """'H_3 = 1.83, where ln 3 = 1.10 would be 40 % too low' and the exercise's μ(H_{N+b} - H_b)."""
    import math

    body = text(chapter("04"))
    quoted = re.findall(r"\$H_(\d) = ([\d.]+)\$, where \$\\ln (\d) = ([\d.]+)\$ would be (\d+) % too low", body)
    assert {int(n) for n, *_ in quoted} >= {2, 3}, quoted
    for n, h, n_ln, ln, low in quoted:
        n = int(n)
        assert int(n_ln) == n
        assert formulas.expected_max_exponential(n) == pytest.approx(float(h), abs=0.005)
        assert math.log(n) == pytest.approx(float(ln), abs=0.005)
        assert 1 - math.log(n) / formulas.harmonic(n) == pytest.approx(int(low) / 100, abs=0.01)
    assert formulas.expected_kth_of_exponential(3, 3) == pytest.approx(formulas.expected_max_exponential(3))
    solution = _plain("course/solutions/04_sync_async_solutions.md")
    assert "(H_3 - H_1)\\,\\mu = 0.83\\,\\mu" in solution
    assert formulas.expected_kth_of_exponential(2, 3) == pytest.approx(0.8333, abs=1e-3)



def test_chapter_04s_barrier_numbers_are_for_the_n_its_synchronous_runs_have():
    """Chapter 04's synchronous runs have N - 1 = 2 workers (the third process is section 2's backup); its prose once
    said 'at the N = 3 this chapter runs' and quoted H_3 for the barrier. The N the prose gives is the code's."""
    code = "\n".join(code_cells(chapter("04")))
    asked = int(re.search(r"get_workers\(client, (\d+),", code).group(1))
    assert "SYNC_WORKERS = max(1, N - 1)" in code and "workers=SYNC_WORKERS" in code
    body = text(chapter("04"))
    assert "At the $N = 3$ this chapter runs" not in body
    stated = int(re.search(r"Its synchronous runs have \$N = (\d+)\$ workers", body).group(1))
    assert stated == max(1, asked - 1)
    assert f"$H_{stated} = " in body


def test_chapter_05s_exercise_asks_no_crossover_the_cost_model_does_not_have():
    """At a power of two N, halving-doubling has the ring's bandwidth term and fewer latency terms, so it beats the ring
    at every size (solutions 05, exercise 2); the exercise once asked for 'the one [size] below which it beats the
    ring'. The crossover with recursive doubling is B* = 2.4 alpha/beta at N = 8, as the solution says."""
    from dsgd_teach.collectives import AlphaBeta, predict_seconds

    exercise = next(c for c in cells(chapter("05")) if c.startswith("## What you measured")).split("2. From")[1]
    assert "and the one below which it beats the ring" not in exercise
    assert "or does it beat the ring at every size?" in exercise
    model = AlphaBeta(alpha=50e-6, beta=1e-9)
    for n in (4, 8, 16):
        for k in (1, 100, 10_000, 10**6, 10**8):
            assert predict_seconds(model, "halving-doubling", n, k) < predict_seconds(model, "ring", n, k), (n, k)
    crossover = 2.4 * model.alpha / model.beta / 4  # elements
    assert predict_seconds(model, "halving-doubling", 8, int(crossover * 1.1)) < predict_seconds(model, "doubling", 8,
                                                                                                int(crossover * 1.1))
    assert predict_seconds(model, "halving-doubling", 8, int(crossover * 0.9)) > predict_seconds(model, "doubling", 8,
                                                                                                int(crossover * 0.9))


def test_halving_doubling_matches_the_rings_bytes_only_at_a_power_of_two():
    """Chapter 05 once said halving-doubling 'sends the same total per rank as the ring' for any N; its heat maps run at
    N = 3 in smoke mode, where the fold makes one rank send 2B against the ring's 4B/3 (elements_sent, the count the
    chapter checks against the logged messages)."""
    from dsgd_teach.collectives import elements_sent

    cell = next(c for c in cells(chapter("05")) if c.startswith("The star pours everything"))
    assert "When $N$ is a power of two, halving-doubling sends the same total per rank as the ring" in cell
    m = re.search(r"at \$N = (\d)\$, \$(\d)B\$ against the ring's \$(\d)B/(\d)\$", cell)
    n, hd, ring_num, ring_den = (int(g) for g in m.groups())
    k = 12 * n
    assert max(elements_sent("halving-doubling", k, n, r) for r in range(n)) == hd * k
    assert elements_sent("ring", k, n, 0) * ring_den == ring_num * k
    for n in (2, 4, 8):
        k = 16 * n
        assert [elements_sent("halving-doubling", k, n, r) for r in range(n)] == \
            [elements_sent("ring", k, n, r) for r in range(n)]


def test_bus_bandwidth_is_cited_and_is_the_code_that_computes_it():
    """Chapter 05's busbw = B/t · 2(N-1)/N is nccl-tests' definition (now cited, with its page in the References) and
    cost_model.bus_bandwidth, which the chapter's table prints."""
    from dsgd_teach.collectives.cost_model import bus_bandwidth

    cell = next(c for c in cells(chapter("05")) if c.startswith("## The professional reference"))
    assert r"\text{busbw} = \frac{B}{t}\cdot\frac{2(N-1)}{N}" in cell
    assert "nccl-tests" in cell and "bus_bandwidth" in cell
    assert "nccl-tests/blob/master/doc/PERFORMANCE.md" in text(chapter("05"))
    for n in (2, 3, 4, 8):
        assert bus_bandwidth(1e6, n, 0.01) == pytest.approx(1e6 / 0.01 * 2 * (n - 1) / n)

def test_ring_bytes_and_the_bubble_of_chapters_05_and_07():
    assert "2\\,(N-1)\\,\\frac{K}{N}" in text(chapter("05"))
    for n in (2, 3, 4, 8):
        assert formulas.ring_elements_per_rank(n, 24 * n) == 2 * (n - 1) * 24
    body = text(chapter("07")).replace(" ", "")
    assert "(p-1)/(m+p-1)" in body and "(p-1)/m" in body
    for p, m in ((4, 16), (8, 8), (2, 1)):
        assert formulas.bubble_of_step(p, m) == pytest.approx((p - 1) / (m + p - 1))
        assert formulas.bubble_over_compute(p, m) == pytest.approx((p - 1) / m)


def test_zero_memory_table_and_the_checkpoint_peak_of_chapter_09():
    body = text(chapter("09"))
    for formula in ("16\\Psi", "4\\Psi + 12\\Psi/N", "2\\Psi + 14\\Psi/N", "16\\Psi/N"):
        assert formula in body
    psi, n = 7e9, 8
    expect = (16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n)
    for stage, value in enumerate(expect):
        assert formulas.zero_states_bytes(psi, n, stage) == pytest.approx(value)
    assert "112 GB for a\n7B model" in _plain(f"course/{chapter('09')}") or "112 GB" in body
    assert formulas.zero_states_bytes(7e9, 1, 0) == pytest.approx(112e9)
    cell = next(c for c in cells(chapter("09")) if "$L = 16$ and $k = 4$" in c)
    peak = int(re.search(r"\$L/k \+ k = (\d+)\$", cell).group(1))
    assert formulas.checkpoint_peak_layers(16, 4) == peak
    assert formulas.checkpoint_peak_layers(16, 4) == min(formulas.checkpoint_peak_layers(16, k) for k in (1, 2, 4, 8, 16))


def test_the_shaped_hosts_bench_quotes_the_readme_run():
    """The bench's docstring once said star/ring 3.3 at N = 4 (an earlier run) where the benchmark table, which chapter
    05 quotes, says 3.50: the docstring's figures are the table's (docs/benchmarks.md), rounded as written."""
    from dsgd_teach.bench import shaped_hosts

    doc, figures = " ".join(shaped_hosts.__doc__.split()), _bench_figures()
    quoted = re.search(r"measured star/ring ([\d.]+) \(N = 3\) and ([\d.]+) \(N = 4\); model error star (\d+) % and "
                       r"(\d+) %, ring (\d+) % and (\d+) %", doc)
    assert quoted, doc
    for i, n in enumerate((3, 4)):
        assert float(quoted.group(1 + i)) == round(figures[f"shaped_hosts.star_over_ring_{n}ranks_ratio"], 2)
        for j, algorithm in enumerate(("naive", "ring")):
            error = figures[f"shaped_hosts.model_error_{algorithm}_{n}ranks"]
            assert int(quoted.group(3 + 2 * j + i)) == round(100 * error), (algorithm, n, error)


def test_the_lognormal_tail_the_prose_quotes_is_the_delay_models():
    """Chapter 04: 'the 99th percentile is about 11 times the mean'; chapter 11: 'about eleven times its mean'. Both
    are formulas.lognormal_quantile_over_mean(0.99) for the sigma the delay model draws with, and 20 000 of the
    model's own draws agree."""
    import numpy as np

    from dsgd_teach.syncasync.delays import DelayModel

    ratio = formulas.lognormal_quantile_over_mean(0.99)
    assert round(ratio) == 11
    assert "99th percentile is about 11 times the mean" in text(chapter("04"))
    assert "99th percentile is about eleven times its mean" in text(chapter("11"))
    model = DelayModel(kind="lognormal", severity=1.0, seed=3, world=1)
    draws = np.array([model.delay(0, step) for step in range(20_000)])
    assert np.quantile(draws, 0.99) / draws.mean() == pytest.approx(ratio, rel=0.15)


def test_chapter_07s_decoupled_bubble_and_gpipe_speedup_are_the_schedules():
    """Chapter 07: the decoupled bubble (p-1)/(m+p-1+m t_b/t_f) and GPipe's ideal speed-up over the naive schedule,
    2m/(m+1) = 1.78 at p = 2, m = 8, are the schedules' ideal_bubble, and agree with the step times they come from."""
    body = text(chapter("07"))
    assert r"(p-1)/\big(m+p-1+m\,t_b/t_f\big)" in body
    assert r"ideal speed-up $2m/(m+1) \approx 1.78$" in body
    for p, m, ratio in ((2, 8, 2.0), (4, 8, 2.0), (4, 3, 1.5), (8, 1, 3.0)):
        t_f, t_b = 1.0, ratio
        step = (m + p - 1) * t_f + m * t_b  # the forwards fill the pipe, the backwards run on every stage at once
        assert formulas.bubble_decoupled(p, m, ratio) == pytest.approx((step - m * (t_f + t_b)) / step)
        assert formulas.gpipe_over_naive_speedup(p, m) == pytest.approx(p * m * (t_f + t_b) / ((m + p - 1) * (t_f + t_b)))
    assert formulas.gpipe_over_naive_speedup(2, 8) == pytest.approx(16 / 9) and round(16 / 9, 2) == 1.78


def test_solutions_11_backups_numbers_are_the_order_statistics():
    """Solutions 11, exercise 1: μ H_100 = 5.19 μ against μ (H_104 - H_4) = 3.14 μ, '4 backups cut the expected step
    by 40 %', and ln N + γ = 5.18: formulas' expected maxima and order statistics, not hand arithmetic."""
    import math

    solution = " ".join(_plain("course/solutions/11_at_scale_solutions.md").split())
    slowest = float(re.search(r"\\mu H_\{100\} = ([\d.]+)\\,\\mu", solution).group(1))
    kth = float(re.search(r"\\mu\\,\(H_\{104\} - H_4\) = ([\d.]+)\\,\\mu", solution).group(1))
    cut = int(re.search(r"4 backups cut the expected step by (\d+) %", solution).group(1))
    approx = float(re.search(r"\\ln N \+ \\gamma\$ \(([\d.]+)\)", solution).group(1))
    assert formulas.expected_max_exponential(100) == pytest.approx(slowest, abs=0.005)
    assert formulas.expected_kth_of_exponential(100, 104) == pytest.approx(kth, abs=0.005)
    assert 1 - kth / slowest == pytest.approx(cut / 100, abs=0.01)
    assert math.log(100) + 0.5772156649 == pytest.approx(approx, abs=0.005)
    assert "X_{(k)}" not in solution and "T_{(k)}" in solution, "X is NOTATION.md's Megatron input; T_i a time"
