"""`dsgd-teach grade --scheduler`: a class graded over a dask cluster started with dask's CLI gives the local grades.

The deployment is a `dask scheduler` on 127.0.0.1 and a port from the OS (its address read from the scheduler file)
and two single-threaded `dask worker`s, each in a session of its own so that one can be killed, with everything it
started, in the middle of a batch. The oracle is the local batch of the same class with the same seed: grades.csv
and every feedback page byte for byte, integrity flags included.
"""

from __future__ import annotations

import csv
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from distributed import Client

from dsgd_teach.grading import cli
from dsgd_teach.grading.batch import Limits, grade_batch
from dsgd_teach.grading.cluster import ClusterRun
from dsgd_teach.runtime.clusters import deployment, hosts

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "course" / "assignments" / "source"
PS01 = SOURCE / "ps01_sgd" / "ps01_sgd.ipynb"
SEED = 20261127
LIMITS = Limits(timeout_s=60, cpu_s=120, notebook_s=300)
WRONG_Q1 = "def minibatch_indices(n, batch_size, step, seed):\n    return np.arange(min(n, batch_size))\n"
DENIED = "import subprocess\ntry:\n    subprocess.run(['id'])\nexcept Exception:\n    pass\n{SOLUTION}"
CLASS = {"full": {}, "wrong_q1": {"ps01_sgd_q1_solution": WRONG_Q1},
         "flagged": {"ps01_sgd_q2_solution": DENIED}}


def _write_class(root: Path) -> None:
    for student, changes in CLASS.items():
        nb = nbformat.read(str(PS01), as_version=4)
        for cell in nb.cells:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in changes:
                cell.source = changes[gid].replace("{SOLUTION}", cell.source)
        (root / student).mkdir(parents=True)
        nbformat.write(nb, str(root / student / "ps01_sgd.ipynb"))


def _outputs(out: Path) -> dict[str, bytes]:
    """grades.csv and every feedback page, by path."""
    files = [out / "grades.csv", *sorted((out / "feedback").rglob("*.html"))]
    return {str(p.relative_to(out)): p.read_bytes() for p in files}


@pytest.fixture(scope="module")
def classroom(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    _write_class(root / "subs")
    grade_batch(root / "subs", SOURCE, root / "local", assignment="ps01_sgd", limits=LIMITS, seed=SEED, jobs=2,
                progress=False)
    local = _outputs(root / "local")
    rows = list(csv.DictReader(open(root / "local" / "grades.csv")))
    assert {r["student"] for r in rows} == set(CLASS)
    assert any("FLAGGED" in r["reason"] for r in rows if r["student"] == "flagged")  # an integrity flag to carry
    assert [float(r["points"]) for r in rows if r["student"] == "wrong_q1"][:1] == [0.0]
    return root, local


class Cluster:
    """A scheduler and two workers from dask's CLI; each worker a session leader so killpg ends all it started."""

    def __init__(self, work: Path) -> None:
        self.dep = deployment.start_scheduler(work, log=work / "scheduler.log")
        self.mark = secrets.token_hex(8)
        self.workers: dict[str, subprocess.Popen] = {}
        for name in ("wa", "wb"):
            cmd = [*deployment.DASK_WORKER, self.dep.address, "--nthreads", "1", "--host", "127.0.0.1",
                   "--no-nanny", "--no-dashboard", "--name", name, "--death-timeout", "60"]
            log = open(work / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test's tmp dir
            self.workers[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                                  env={**os.environ, "DSGD_TEST_CLUSTER": self.mark})
        deployment.wait_for_workers(self.dep.address, 2, timeout=120)
        with Client(self.dep.address, timeout="20s") as c:
            self.address_of = {w["name"]: a for a, w in c.scheduler_info(n_workers=-1)["workers"].items()}

    def kill(self, name: str) -> None:
        os.killpg(self.workers[name].pid, signal.SIGKILL)
        self.workers[name].wait(30)

    def marked(self) -> dict[int, int]:
        """{pid: parent pid} of the processes carrying this cluster's mark: workers and the bwraps they started."""
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if f"DSGD_TEST_CLUSTER={self.mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    status = Path(f"/proc/{pid}/status").read_text()
                    found[int(pid)] = int(status.split("PPid:")[1].split()[0])
            except (OSError, IndexError, ValueError):
                continue
        return found

    def stop(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.dep.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One cluster for the module: the batch test leaves it as it found it, the kill test (last) kills a worker."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.timeout(900)
def test_cluster_batch_writes_the_local_grades(classroom, cluster, tmp_path):
    """The CLI with --scheduler: same grades.csv and feedback pages as the local batch; each worker graded some."""
    root, local = classroom
    out = tmp_path / "graded"
    assert cli.main([str(root / "subs"), "--assignment", "ps01_sgd", "--out", str(out), "--source", str(SOURCE),
                     "--seed", str(SEED), "--timeout", "60", "--cpu-s", "120", "--notebook-s", "300",
                     "--scheduler", cluster.dep.address, "--no-progress"]) == 0
    assert _outputs(out) == local


@pytest.mark.timeout(900)
def test_a_worker_killed_mid_batch_loses_no_row_and_counts_none_twice(classroom, cluster, tmp_path):
    """SIGKILL one worker (and all it started) while it grades a student: that run is graded by the other worker,
    counted once, and the outputs equal the local batch's."""
    root, local = classroom
    out = tmp_path / "graded"
    runner = ClusterRun(cluster.dep.address)
    done: dict[str, object] = {}

    def batch() -> None:
        try:
            done["subs"] = grade_batch(root / "subs", SOURCE, out, assignment="ps01_sgd", limits=LIMITS, seed=SEED,
                                       jobs=runner.slots, progress=False, run=runner)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            done["error"] = exc

    thread = threading.Thread(target=batch)
    thread.start()
    victim = cluster.address_of["wa"]
    killed: list[str] = []
    with Client(cluster.dep.address, timeout="20s") as watcher:
        deadline = time.monotonic() + 240
        while not killed and thread.is_alive() and time.monotonic() < deadline:
            killed = [k for k in watcher.processing([victim]).get(victim, ()) if "dsgd-grade-student" in str(k)]
            time.sleep(0.1)
    assert killed, "worker wa never got a student to grade"
    wa = cluster.workers["wa"].pid
    deadline = time.monotonic() + 120
    while wa not in cluster.marked().values() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)  # until wa has started that submission's sandbox (bwrap, its child)
    sandboxes = [pid for pid, parent in cluster.marked().items() if parent == wa]
    assert sandboxes, "worker wa never started a sandbox"
    cluster.kill("wa")
    thread.join(600)
    assert not thread.is_alive() and "error" not in done, done.get("error")
    try:
        ran_on = dict(runner.ran_on)
        by = runner.graded_by()
    finally:
        runner.close()
    assert ran_on[str(killed[0])] == cluster.address_of["wb"]  # the killed worker's run was graded elsewhere
    assert sum(by.values()) == 1 + len(CLASS)  # the reference and each student, each counted once
    rows = list(csv.DictReader(open(out / "grades.csv")))
    assert len({(r["student"], r["question"]) for r in rows}) == len(rows)
    assert _outputs(out) == local
    assert not set(sandboxes) & set(cluster.marked())  # wa's sandbox died with it
    assert set(cluster.marked()) <= {cluster.workers["wb"].pid} | {p for p, pp in cluster.marked().items()
                                                                   if pp == cluster.workers["wb"].pid}


@pytest.mark.timeout(600)
@pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available()))
def test_a_batch_over_emulated_hosts_writes_the_local_grades(classroom, tmp_path):
    """The course's emulated hosts (network namespaces with their own /dev/shm): the scheduler on host 0, a worker
    on each of hosts 1 and 2, the grading command run on host 0: grades.csv and every feedback page byte for byte
    the local batch's, every run graded on a worker host and counted once."""
    root, local = classroom
    out = tmp_path / "graded"
    with hosts.shaped_deployment(3, None) as (h, dep):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        waited = h.run(0, sys.executable, "-m", "dsgd_teach.runtime.clusters.deployment", "wait", dep.address, "2",
                       env=env, capture_output=True, text=True, timeout=180)
        assert waited.returncode == 0, waited.stderr[-3000:]
        graded = h.run(0, sys.executable, "-m", "dsgd_teach.cli", "grade", str(root / "subs"), "--assignment",
                       "ps01_sgd", "--out", str(out), "--source", str(SOURCE), "--seed", str(SEED), "--timeout", "60",
                       "--cpu-s", "120", "--notebook-s", "300", "--scheduler", dep.address, "--no-progress",
                       env=env, capture_output=True, text=True, timeout=540, cwd=ROOT)
        assert graded.returncode == 0, f"{graded.stdout[-3000:]}\n{graded.stderr[-5000:]}"
        assert _outputs(out) == local
        line = next(x for x in graded.stdout.splitlines() if x.startswith("runs graded per worker: "))
        per_worker = dict(item.rsplit(" ", 1) for item in line.split(": ", 1)[1].split(", "))
        assert sum(int(n) for n in per_worker.values()) == 1 + len(CLASS)  # the reference and each student, once
        assert {w.split("://")[-1].rsplit(":", 1)[0] for w in per_worker} <= {h.ips[1], h.ips[2]}, per_worker
