"""Per-sandbox cgroup limits: memory (numpy, memfd, /tmp files), processes (fork bomb) and a fair CPU share.

Each sandbox of a batch runs in a cgroup of its own (dsgd_teach/grading/cgroups.py). These tests attack each limit
directly in a bare sandbox (about a second each), then grade a small class with --jobs 2 in which a CPU spinner
and a memfd hog sit next to an honest student. Set DSGD_LIMITS_OFF=1 to run them with the cgroups switched off:
every test then fails, showing what the cgroups hold.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import psutil
import pytest
from grading_attacks import PRELUDE

from dsgd_teach.grading import batch, bubblewrap, cgroups

OFF = os.environ.get("DSGD_LIMITS_OFF") == "1"
MB = 1 << 20
LIMITS = cgroups.CgroupLimits(memory_bytes=128 * MB, pids=32)
needs_cgroups = pytest.mark.skipif(
    bool(bubblewrap.probe() or (cgroups.available() and not OFF)),
    reason=f"no sandbox or no cgroups here: {bubblewrap.probe() or cgroups.available()}")


@pytest.fixture(autouse=True)
def _switch(monkeypatch):
    """DSGD_LIMITS_OFF=1: every sandbox runs without its cgroup (the demonstration that the tests need them)."""
    if OFF:
        monkeypatch.setattr(cgroups, "_layout", lambda: (0, {}, "switched off by DSGD_LIMITS_OFF"))
    yield
    left = [d for base in cgroups._layout()[1].values() for d in os.listdir(base)
            if d.startswith(f"{cgroups.PREFIX}{os.getpid()}-")]
    assert not left, f"cgroups left behind: {left}"


def _inside(code: str, timeout_s: float = 60) -> bubblewrap.Outcome:
    """Run python code in a bare sandbox under LIMITS; it writes its result to the fd number in sys.argv[-1]."""
    return bubblewrap.run([sys.executable, "-c", code], b"", timeout_s, limits=LIMITS)


def _killed_for_memory(out: bubblewrap.Outcome) -> list[str]:
    problems = []
    if out.result is not None:
        problems.append(f"the allocation survived: {out.result!r}")
    if out.usage is None or not out.usage.oom_kills:
        problems.append(f"no OOM kill in the sandbox's cgroup: {out.usage}")
    elif "memory limit of 128 MB" not in " ".join(out.usage.hit()):
        problems.append(f"the limit hit is not named: {out.usage.hit()}")
    return problems


NUMPY = "import numpy as np, os, sys\na = np.ones(400 << 20, dtype=np.uint8)\nos.write(int(sys.argv[-1]), b'kept')\n"
MEMFD = ("import os, sys\nfd = os.memfd_create('hoard')\nblock = b'x' * (1 << 20)\n"
         "for _ in range(400):\n    os.write(fd, block)\nos.write(int(sys.argv[-1]), b'kept')\n")
TMPFS = ("import os, sys\nblock = b'x' * (1 << 20)\nwith open('/tmp/hoard', 'wb') as fh:\n"
         "    for _ in range(200):\n        fh.write(block)\nos.write(int(sys.argv[-1]), b'kept')\n")


@needs_cgroups
@pytest.mark.parametrize("code", [NUMPY, MEMFD, TMPFS], ids=["numpy", "memfd", "tmp_file"])
def test_memory_past_the_sandbox_limit_is_killed_and_named(code):
    # 400 MB of numpy or memfd pages, or a 200 MB file in /tmp (under /tmp's own 256 MB cap), against 128 MB
    out = _inside(code)
    assert not _killed_for_memory(out), _killed_for_memory(out)


FORK_BOMB = '''
import os, sys, time
n = 0
for _ in range(300):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError:
        break
os.write(int(sys.argv[-1]), str(n).encode())
'''


@needs_cgroups
def test_fork_bomb_stops_at_the_process_limit():
    t0 = time.monotonic()
    out = _inside(FORK_BOMB)
    assert out.result is not None and int(out.result) < LIMITS.pids, out
    assert out.usage and out.usage.pids_max_hits and "limit of 32 processes" in " ".join(out.usage.hit())
    assert time.monotonic() - t0 < 20  # its sleeping children died with the sandbox


SPIN = '''
import os, sys, time, resource
n, end = int(sys.argv[1]), time.time() + float(sys.argv[2])
kids = []
for _ in range(n - 1):
    pid = os.fork()
    if pid == 0:
        os.setsid()  # a session of its own: without cgroups the scheduler's autogroups treat it as a new user
        while time.time() < end:
            pass
        os._exit(0)
    kids.append(pid)
while time.time() < end:
    pass
for kid in kids:
    os.waitpid(kid, 0)
used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
os.write(int(sys.argv[-1]), str(sum(u.ru_utime + u.ru_stime for u in used)).encode())
'''


@needs_cgroups
def test_a_spinner_gets_no_more_cpu_than_its_one_process_neighbour():
    cpu: dict[str, float] = {}

    def run(name: str, processes: int) -> None:
        out = bubblewrap.run([sys.executable, "-c", SPIN, str(processes), "2.5"], b"", 60,
                             limits=cgroups.CgroupLimits(256 * MB))
        cpu[name] = float(out.result or 0)

    threads = [threading.Thread(target=run, args=a) for a in (("spinner", 16), ("neighbour", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # equal weights: each sandbox gets the same share (about a core each on two cores); without them the
    # neighbour gets about 1/16 of what the spinner's 16 sessions take
    assert cpu["neighbour"] > 0.5 * cpu["spinner"] > 0, cpu


@needs_cgroups
def test_cgroups_are_removed_after_a_timeout_and_stale_ones_swept():
    out = _inside("import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)\n", timeout_s=2)
    assert out.timed_out
    # the autouse fixture checks no cgroup of this process is left; a dead grader's are swept
    if OFF:
        return
    version, parents, _ = cgroups._layout()
    stale = [os.path.join(base, f"{cgroups.PREFIX}999999999-0") for base in parents.values()]
    for d in stale:
        os.mkdir(d)
    cgroups.sweep()
    assert not [d for d in stale if os.path.exists(d)]


def test_without_cgroups_the_batch_says_what_is_not_enforced(monkeypatch):
    monkeypatch.setattr(cgroups, "_layout", lambda: (0, {}, "cgroup v1: /sys/fs/cgroup/memory is not writable"))
    scope = cgroups.open_scope(LIMITS)
    assert scope.wrap(["/bin/true"]) == ["/bin/true"]
    usage = scope.usage()
    assert not usage.enforced and "not writable" in usage.unenforced
    result = batch._with_limits({"tests": {}, "stopped": ""}, usage)
    summary = batch._cgroup_summary(batch.Limits(), True)
    assert not summary["enforced"] and "not writable" in summary["why"], summary
    assert "NOT enforced" in batch.cgroups_missing(usage.unenforced)
    assert result["stopped"] == ""


# A small class: one question whose honest answer costs a fraction of a second.
SETUP = "import numpy as np\nfrom dsgd_teach.grading.checks import check\n"
SOLUTION = "def work(n):\n    ### BEGIN SOLUTION\n    return sum(i % 7 for i in range(n))\n    ### END SOLUTION\n"
TEST = "check('work(200000)', work(200_000), sum(i % 7 for i in range(200_000)))\n"
SPIN_S = 45  # the spinners' life; the honest notebook must be done before it ends
SPINNER = PRELUDE + r'''
_run(["/bin/sh", "-c", "for i in $(seq 60); do setsid /usr/bin/timeout SPIN_S /bin/sh -c 'while :; do :; done' "
      "</dev/null >/dev/null 2>&1 & done"])
import time
time.sleep(SPIN_S)
def work(n):
    raise NotImplementedError()
'''.replace("SPIN_S", str(SPIN_S))
MEMFD_HOG = '''
import os
hoard = [os.memfd_create("hoard") for _ in range(8)]  # 8 x 200 MB: each under the 256 MB file-size rlimit
block = b"x" * (1 << 20)
for fd in hoard:
    for _ in range(200):
        os.write(fd, block)
def work(n):
    raise NotImplementedError()
'''


def _spinning() -> int:
    """How many of the spinner's busy loops are running on this machine."""
    return sum("while :; do :; done" in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


def _stop_spinners() -> None:
    """Kill the busy loops this test's spinner started (its descendants only, never another test's)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if "while :; do :; done" in " ".join(proc.cmdline()):
                proc.kill()
        except psutil.Error:
            pass


def _cells(solution: str) -> list[dict[str, str]]:
    return [{"source": SETUP}, {"source": solution}, {"source": TEST, "grade_id": "lim_q1_tests"}]


@needs_cgroups
@pytest.mark.timeout(300)
def test_a_spinner_and_a_memfd_hog_graded_beside_an_honest_student():
    """Three sandboxes at once, as `--jobs 3` runs them: the honest one must finish while the spinner still spins."""
    limits = batch.Limits(timeout_s=SPIN_S + 20, notebook_s=SPIN_S + 20, sandbox_memory_mb=768)
    results: dict[str, dict] = {}
    took: dict[str, float] = {}

    def grade(name: str, code: str) -> None:
        t0 = time.monotonic()
        results[name] = batch.run_worker(_cells(code), "student", limits, 7, [])
        took[name] = time.monotonic() - t0

    threads = [threading.Thread(target=grade, args=a)
               for a in (("spinner", SPINNER), ("honest", SOLUTION), ("memfd", MEMFD_HOG))]
    threads[0].start()
    deadline = time.monotonic() + 120
    while _spinning() < 20 and time.monotonic() < deadline and threads[0].is_alive():
        time.sleep(0.5)  # the honest notebook starts once the spinners spin, and must end before they do
    for t in threads[1:]:
        t.start()
    for t in threads[1:]:
        t.join()
    _stop_spinners()  # its neighbours are graded: the rest of the spinners' life would only burn the suite's CPU
    threads[0].join()
    honest, hog = results["honest"], results["memfd"]
    problems = []
    test = honest.get("tests", {}).get("lim_q1_tests", {})
    if test.get("status") != "ok" or len(test.get("records", [])) != 1 or honest.get("stopped"):
        problems.append(f"the honest notebook did not run cleanly: {honest}")
    if took["honest"] >= SPIN_S:
        problems.append(f"the honest notebook took {took['honest']:.0f} s: it waited for the spinner to stop")
    if "memory limit of 768 MB" not in hog.get("stopped", "") + hog.get("error", ""):
        problems.append(f"the memfd hog's result does not name the memory limit: {hog}")
    if hog.get("tests", {}).get("lim_q1_tests", {}).get("status") == "ok":
        problems.append("the memfd hog's test ran cleanly")
    assert not problems, "\n".join(problems) + f"\n(times: {took})"


SOCKETS = """
import os, socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(64)
sent, kept = 0, []
for _ in range(20):  # never read: each connection pins its sender's and its receiver's buffers (about 10 MB)
    client = socket.create_connection(server.getsockname())
    kept += [client, server.accept()[0]]
    client.setblocking(False)
    try:
        while True:
            sent += client.send(b"x" * 65536)
    except OSError:
        pass
os.write(int(sys.argv[-1]), str(sent).encode())
"""


@needs_cgroups
def test_socket_buffers_stop_at_the_sandbox_share_of_the_hosts_tcp_memory():
    """Each of --jobs sandboxes may pin at most its share of the host's TCP pressure threshold in socket buffers."""
    from dsgd_teach.grading import cgroup_extras

    share = batch.Limits(jobs=4).cgroup().socket_bytes
    pressure = cgroup_extras.tcp_pressure_bytes()
    assert 0 < share <= pressure // 4, (share, pressure)
    if cgroups._layout()[0] != 1:
        pytest.skip(f"cgroup v{cgroups._layout()[0]}: socket buffers count against memory.max, no separate limit")
    limits = cgroups.CgroupLimits(memory_bytes=512 * MB, pids=32, socket_bytes=32 * MB)
    out = bubblewrap.run([sys.executable, "-c", SOCKETS], b"", 60, limits=limits)
    sent = int(out.result or 0)
    assert 0 < sent < 48 * MB, f"the sandbox pinned {sent // MB} MB in socket buffers past its 32 MB ({out.stderr_tail})"
    assert "buffer limit of 32 MB" in " ".join(out.usage.hit()), out.usage
