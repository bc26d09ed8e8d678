"""A hostile class graded with --jobs 2: attacks score nothing they did not answer, honest students keep full marks.

The grader's own peak RSS over the batch (a parse bomb among the attacks) must rise by less than GRADER_PEAK_MB;
workers killed or stopped by their own students give their reasons, unflagged.

Set DSGD_HOSTILE_UNSAFE=1 to run the same batch with --unsafe-no-sandbox: the test then lists what the attacks
got away with (that is how the sandbox was shown to be what holds these properties). DSGD_HOSTILE_OFF switches off
single defences instead, e.g. "seccomp,cgroups,budget" (the seccomp filter, the per-sandbox cgroups, the notebook's
time budget): the test then fails, naming what each let through.
"""

from __future__ import annotations

import csv
import functools
import glob
import html
import json
import os
import re
import shutil
import socket
import stat
import threading
import time
from pathlib import Path

import psutil
import pytest
from grading_attacks import ATTACKS, FLAGGED, HONEST_POINTS, MARKER, REASONS, UNFLAGGED, write_submission

from dsgd_teach.grading import bubblewrap, cgroups, cli, seccomp
from dsgd_teach.grading.notebook import load_assignment
from dsgd_teach.grading.text import hidden_lines

SOURCE = Path(__file__).resolve().parents[1] / "course" / "assignments" / "source"
UNSAFE = os.environ.get("DSGD_HOSTILE_UNSAFE") == "1"
LEFT_OUT = set(os.environ.get("DSGD_HOSTILE_SKIP", "").split(","))  # for the demonstration only, e.g. "plant"
OFF = set(os.environ.get("DSGD_HOSTILE_OFF", "").split(","))  # defences switched off, for the demonstration
HONEST = ("b_honest_1", "c_honest_2", "honest_3", "zz_honest_4")  # before, among and after the attacks
NAMES = {"kill_pids": "a_kill_pids", "watch_spin": "b_watch_spin",  # sorted early: they run beside honest students
         "budget": "d_budget"}
NOTEBOOK_S = 35  # each notebook's budget: the budget attack's cells sleep 39 s in all
SPECIAL = {"linker": "symlink", "zeroes": "symlink", "fifo": "FIFO", "sock": "socket"}
SEED = 4242
BATCH_S = 330  # the whole batch, on two busy cores (about 250 s)
MB = 1 << 20
SANDBOX_MB = 1536 + 512  # a sandbox's cgroup memory limit: --memory-mb plus the worker's share
KILL_GRACE_S = 15  # the overrun attack stops its worker: the grader kills it NOTEBOOK_S + this after its start
GRADER_PEAK_MB = 256  # the grader's own peak RSS may rise this much over a batch (a parse bomb made it 2 GB)


def build_class(root: Path) -> tuple[Path, Path]:
    """A private copy of ps01's source, and a submissions folder holding the whole hostile class."""
    source = root / "source"
    shutil.copytree(SOURCE / "ps01_sgd", source / "ps01_sgd")
    nb = source / "ps01_sgd" / "ps01_sgd.ipynb"
    subs = root / "submissions"
    for name in HONEST:
        write_submission(nb, subs / name / "ps01_sgd.ipynb", "good")
    write_submission(nb, subs / "stub.ipynb", "stub")
    for attack in sorted(set(ATTACKS) - LEFT_OUT):
        write_submission(nb, subs / NAMES.get(attack, attack) / "ps01_sgd" / "ps01_sgd.ipynb", attack)
    (subs / "linker").mkdir()
    os.symlink(nb, subs / "linker" / "ps01_sgd.ipynb")  # a link to the solutions must not be graded
    os.symlink("/dev/zero", subs / "zeroes.ipynb")  # following it would read forever
    os.mkfifo(subs / "fifo.ipynb")  # opening it would block
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(subs / "sock.ipynb"))
    sock.close()
    return source, subs


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under root (never following links): (mode, size, mtime_ns)."""
    out = {}
    for here, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            st = os.lstat(os.path.join(here, name))
            out[os.path.relpath(os.path.join(here, name), root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def survivors() -> list[str]:
    """Processes left by the batch: anything carrying the attacks' marker, or a grading process under this one."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if MARKER in cmd and proc.pid != os.getpid():
            found.append(f"{proc.pid}: {cmd[:120]}")
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "dsgd_teach.grading" in cmd or "bwrap" in cmd:
            found.append(f"{proc.pid}: {cmd[:120]}")
    return found


def kill_marked() -> None:
    """Clean-up for the unsafe demonstration: end what the attacks left running (this test's marker only)."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if MARKER in " ".join(proc.info["cmdline"] or []) and proc.pid != os.getpid():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "grades.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def unsafe_text(out: Path, rows: list[dict[str, str]], source_nb: Path) -> list[str]:
    """Student-controlled text that reached the TA's files raw: too long, several lines, hidden tests, the seed."""
    problems = []
    text = (out / "grades.csv").read_bytes().decode("utf-8")  # strict: a lone surrogate cannot be in valid UTF-8
    if len(text.splitlines()) != len(rows) + 1:
        problems.append(f"grades.csv has {len(text.splitlines())} lines for {len(rows)} rows (a forged line?)")
    for r in rows:
        if len(r["reason"]) > 500 or any(not ch.isprintable() for ch in r["reason"]) or "\u202e" in r["reason"]:
            problems.append(f"{r['student']}: a raw or unbounded reason ({len(r['reason'])} characters)")
    assignment = load_assignment(source_nb)
    secrets = {_squash(ln) for q in assignment.questions for ln in hidden_lines(q.source)}
    secrets = {s for s in secrets if len(s) >= 12}
    pages = sorted((out / "feedback").rglob("*.html"))
    for path, content in [(out / "grades.csv", text)] + [(p, html.unescape(p.read_text())) for p in pages]:
        flat = _squash(content)
        quoted = sorted(s for s in secrets if s in flat)
        if quoted or re.search(rf"(?<!\d){SEED}(?!\d)", content):
            problems.append(f"{path.name} shows hidden test code {quoted[:2]} or the seed")
    return problems


def check_batch(rc: int, out: Path, subs_before: dict, subs: Path, csv_at_exit: bytes | None) -> list[str]:
    """Every property the batch must hold; returns what does not hold."""
    problems = [] if rc == 0 else [f"the grader exited {rc}"]
    if csv_at_exit is None:
        problems.append("no grades.csv was written")
    if not (out / "grading.json").is_file() or json.loads((out / "grading.json").read_text())["seed"] != SEED:
        problems.append("no grading.json recording the seed was written")
    rows = _rows(out) if csv_at_exit is not None else []
    if rows:
        problems += unsafe_text(out, rows, SOURCE / "ps01_sgd" / "ps01_sgd.ipynb")
    flagged = {r["student"] for r in rows if r["question"] == "(integrity)" and r["reason"].startswith("FLAGGED")}
    problems += [f"honest {name} was flagged" for name in HONEST if name in flagged]
    problems += [f"attack {NAMES.get(a, a)} was not flagged" for a in sorted(FLAGGED - LEFT_OUT)
                 if rows and NAMES.get(a, a) not in flagged]
    problems += [f"{a} was flagged, though the grader observed no denied action" for a in sorted(UNFLAGGED - LEFT_OUT)
                 if a in flagged]
    points: dict[str, dict[str, float]] = {}
    reasons: dict[str, str] = {}
    for r in rows:
        q = r["question"].replace("ps01_sgd_", "").replace("_tests", "")
        points.setdefault(r["student"], {})[q] = float(r["points"])
        reasons[r["student"]] = reasons.get(r["student"], "") + r["reason"]
    for name in HONEST if rows else ():
        if points.get(name) != {"q1": 2.0, "q2": 2.0, "q3": 2.0}:
            problems.append(f"honest {name} lost marks: {points.get(name)} ({reasons.get(name, '')[:300]})")
    if rows and sum(points.get("stub", {"?": 1}).values()) != 0:
        problems.append(f"the stub scored {points.get('stub')}")
    for attack in sorted(set(ATTACKS) - LEFT_OUT) if rows else ():
        name = NAMES.get(attack, attack)
        honest = HONEST_POINTS.get(attack, {})
        got = points.get(name, {})
        if not {"q1", "q2", "q3"} <= set(got) or any(got[q] != honest.get(q, 0.0) for q in got):
            problems.append(f"attack {name} scored {got}, allowed {honest or 'nothing'}")
    for name, word in REASONS.items() if rows else ():
        if name not in LEFT_OUT and word not in reasons.get(name, ""):
            problems.append(f"{name}'s row does not say {word!r}: {reasons.get(name, '')[:300]}")
    for name, word in SPECIAL.items() if rows else ():
        if sum(points.get(name, {"?": 1}).values()) != 0 or word not in reasons.get(name, ""):
            problems.append(f"{name} (a {word}) was not skipped with a reason: {reasons.get(name)}")
    if any(r["sandbox"] != "bubblewrap" for r in rows):
        problems.append("grades.csv says the batch was not sandboxed")
    feedback = out / "feedback" / "ps01_sgd"
    for student, qs in points.items():
        page = feedback / f"{student}.html"
        text = page.read_text() if page.is_file() else ""
        score = re.search(r"score <b>([\d.]+) / ([\d.]+)</b>", text)
        if not score or float(score.group(1)) != sum(qs.values()):
            problems.append(f"feedback for {student} disagrees with grades.csv ({score and score.group(0)})")
    allowed = {"grades.csv", "grading.json", "feedback", "feedback/ps01_sgd"}
    allowed |= {f"feedback/ps01_sgd/{s}.html" for s in points}
    for rel, (mode, _, _) in snapshot(out).items():
        if rel not in allowed or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            problems.append(f"--out holds {rel!r}, which the grader did not write")
    after = snapshot(subs)
    if after != subs_before:
        changed = sorted(set(after.items()) ^ set(subs_before.items()))[:6]
        problems.append(f"the submissions folder changed: {changed}")
    time.sleep(3)  # an adversary left behind would act now; the sandbox guarantees there is none
    if csv_at_exit is not None and (out / "grades.csv").read_bytes() != csv_at_exit:
        problems.append("grades.csv changed after the grader exited")
    left = survivors()
    if left:
        problems.append(f"processes of the batch survived it: {left[:5]}")
    return problems


def host_state() -> dict[str, object]:
    """What a batch must leave as it found it: the kernel's keys and key owners, shared and available memory."""
    mem = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()}
    owners = {ln.split(":")[0].strip() for ln in Path("/proc/key-users").read_text().splitlines()}
    return {"keys": Path("/proc/keys").read_text(), "key_users": owners, "shmem": mem["Shmem"],
            "available": mem["MemAvailable"]}


def _cgroup_shmem(d: str) -> int:
    """Shared memory (tmpfs pages, memfds) charged to memory cgroup d; 0 once it is gone."""
    try:
        text = Path(d, "memory.stat").read_text()
    except OSError:
        return 0
    return next((int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("shmem ")), 0)


class BatchShmem:
    """The batch's own shared memory, read from its sandboxes' cgroups: the most held at once, and what each sandbox
    still held once its processes had ended. The host's Shmem moves with everything else the machine runs (a browser,
    a chapter's workers); these do not. Where the batch has no cgroups (DSGD_HOSTILE_OFF=cgroups, the unsafe run),
    the host's figures are all there is, and the checks read those instead."""

    LEFT_MB = 8  # a sandbox's tmpfs is freed with its mount namespace; this allows for pages still being released

    def __init__(self) -> None:
        version, parents, _ = cgroups._layout()
        base = parents.get("memory", parents.get(""))
        self.pattern = (os.path.join(base, f"{cgroups.PREFIX}{os.getpid()}-*")
                        if version and base and "cgroups" not in OFF and not UNSAFE else None)
        self.peak, self.left, self.seen = 0, [], 0

    def now(self) -> int:
        """Shared memory charged to the batch's sandboxes now (the host's Shmem where they have no cgroups)."""
        if self.pattern is None:
            return int(host_state()["shmem"])
        return sum(_cgroup_shmem(d) for d in glob.glob(self.pattern))

    def watch(self, done: threading.Event) -> None:
        """Keep the highest reading until done is set."""
        while not done.wait(0.1):
            self.peak = max(self.peak, self.now())

    def record_on_close(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Before each sandbox's cgroups are removed, note what shared memory it still holds with its processes gone."""
        close = cgroups.Scope.close

        def recording_close(scope: cgroups.Scope) -> None:
            d = scope.dirs.get("memory") or scope.dirs.get("")
            if d:
                self.seen += 1
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and (Path(d, "cgroup.procs").read_text().strip()
                                                       or _cgroup_shmem(d) > self.LEFT_MB * MB):
                    time.sleep(0.05)
                self.left.append((os.path.basename(d), _cgroup_shmem(d)))
            close(scope)

        monkeypatch.setattr(cgroups.Scope, "close", recording_close)


def check_host(before: dict, after: dict, shmem: BatchShmem, host_shmem_before: int, took: float) -> list[str]:
    """Keys and key owners as before the batch; shared memory bounded by one sandbox's limit and none left; time kept."""
    problems = []
    if after["keys"] != before["keys"]:
        problems.append(f"/proc/keys changed: {sorted(set(after['keys'].splitlines()) - set(before['keys'].splitlines()))}")
    if after["key_users"] - before["key_users"]:
        problems.append(f"/proc/key-users gained owners {sorted(after['key_users'] - before['key_users'])}")
    if shmem.pattern is None:  # no cgroups: the host's figures, which only an otherwise quiet machine keeps still
        rise = shmem.peak - host_shmem_before
        if after["shmem"] > before["shmem"] + 64 * MB or after["available"] < before["available"] - 3072 * MB:
            problems.append(f"host memory not as before: Shmem {before['shmem'] // MB} -> {after['shmem'] // MB} MB, "
                            f"MemAvailable {before['available'] // MB} -> {after['available'] // MB} MB")
    else:
        rise = shmem.peak
        kept = [(name, held // MB) for name, held in shmem.left if held > BatchShmem.LEFT_MB * MB]
        if kept:
            problems.append(f"sandboxes still held shared memory (MB) after their processes ended: {kept[:5]}")
        if not shmem.seen:
            problems.append("no sandbox cgroup was closed: the shared-memory checks saw nothing")
    if rise > (SANDBOX_MB + 256) * MB:
        problems.append(f"Shmem rose by {rise // MB} MB during the batch, past one sandbox's {SANDBOX_MB} MB")
    if took > BATCH_S:
        problems.append(f"the batch took {took:.0f} s, past its {BATCH_S} s")
    return problems


def check_kernel_attacks(out: Path) -> list[str]:
    """Keyring, nested namespace, memfds, fork bomb and file watches refused; the memory limit and budget named."""
    reasons: dict[str, str] = {}
    for r in _rows(out) if (out / "grades.csv").is_file() else []:
        reasons[r["student"]] = reasons.get(r["student"], "") + " | " + r["reason"]
    problems = [f"{name} got through: {text[:300]}" for name, text in reasons.items() if "ESCAPED" in text]
    if "memory" in reasons and "memory limit of" not in reasons["memory"]:
        problems.append(f"memory's row does not name the memory limit: {reasons['memory'][:300]}")
    if "d_budget" in reasons and f"time budget of {NOTEBOOK_S} s ran out" not in reasons["d_budget"]:
        problems.append(f"d_budget's row does not say its time ran out: {reasons['d_budget'][:300]}")
    return problems


def run_measured(fn) -> tuple[int, int]:
    """fn's result, and how far this process's peak RSS (VmHWM, reset first) rose above its RSS while it ran."""
    def status(key: str) -> int:
        return int(re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) << 10

    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux 4.0+)
    before = status("VmRSS")
    result = fn()
    return result, status("VmHWM") - before


def switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSGD_HOSTILE_OFF: run the batch without the named defences (the demonstration that the test needs them)."""
    if "seccomp" in OFF:
        monkeypatch.setattr(seccomp, "program", lambda machine=None: None)
    if "cgroups" in OFF:
        monkeypatch.setattr(cgroups, "_layout", lambda: (0, {}, "switched off by DSGD_HOSTILE_OFF"))


@pytest.mark.timeout(900)
def test_hostile_class_scores_only_honest_answers(tmp_path, monkeypatch):
    if not UNSAFE and bubblewrap.probe():
        pytest.skip(f"no OS sandbox here: {bubblewrap.probe()}")
    switch_off(monkeypatch)
    monkeypatch.setattr(cli, "Limits", functools.partial(cli.Limits, kill_grace_s=KILL_GRACE_S))
    source, subs = build_class(tmp_path)
    out = tmp_path / "graded"
    before = snapshot(subs)
    budget = 100_000 if "budget" in OFF else NOTEBOOK_S
    args = [str(subs), "--assignment", "ps01_sgd", "--out", str(out), "--source", str(source), "--timeout", "20",
            "--cpu-s", "120", "--jobs", "2", "--no-progress", "--seed", str(SEED), "--notebook-s", str(budget)]
    host, shmem, done = host_state(), BatchShmem(), threading.Event()
    shmem.record_on_close(monkeypatch)
    watcher = threading.Thread(target=shmem.watch, args=(done,), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        rc, rise = run_measured(lambda: cli.main(args + (["--unsafe-no-sandbox"] if UNSAFE else [])))
        took = time.monotonic() - t0
        csv_at_exit = (out / "grades.csv").read_bytes() if (out / "grades.csv").is_file() else None
        problems = check_batch(rc, out, before, subs, csv_at_exit) + check_kernel_attacks(out)
    finally:
        done.set()
        watcher.join()
        kill_marked()
    problems += check_host(host, host_state(), shmem, int(host["shmem"]), took)
    if rise > GRADER_PEAK_MB * MB:
        problems.append(f"the grader's own peak RSS rose by {rise // MB} MB during the batch, past {GRADER_PEAK_MB} MB")
    left = max((held for _, held in shmem.left), default=0)
    print(f"grader's peak RSS: +{rise // MB} MB over the batch; the batch's Shmem peak {shmem.peak // MB} MB, at most "
          f"{left // MB} MB left in one of {shmem.seen} sandboxes; host {host['available'] // MB}/"
          f"{host_state()['available'] // MB} MB available before/after; batch {took:.0f} s")
    assert not problems, "\n".join(problems)
