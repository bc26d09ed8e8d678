"""The grading sandbox and the grader's file handling, piece by piece, plus a batch graded by an ordinary user."""

from __future__ import annotations

import csv
import json
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from grading_attacks import write_submission

from dsgd_teach.grading import bubblewrap, cli, safeio, sandbox
from dsgd_teach.grading.batch import Submission, _csv_text, find_submissions
from dsgd_teach.grading.feedback import write_feedback
from dsgd_teach.grading.notebook import find_assignments, load_assignment
from dsgd_teach.grading.verdict import Grade

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "course" / "assignments" / "source"
needs_sandbox = pytest.mark.skipif(bool(bubblewrap.probe()), reason=f"no OS sandbox here: {bubblewrap.probe()}")

INSIDE = textwrap.dedent('''\
    import json, os, socket, subprocess, sys
    secret, source = sys.argv[1], sys.argv[2]
    subprocess.Popen(["/bin/sh", "-c", "setsid sleep TOKEN & sleep TOKEN"], start_new_session=True)
    report = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "uid": os.getuid(),
              "caps": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
              "secret": os.path.exists(secret), "source": os.path.exists(source),
              "grader_cwd": os.path.exists(os.environ.get("GRADER_CWD", "/nonexistent")),
              "interfaces": [name for _, name in socket.if_nameindex()], "env": sorted(os.environ)}
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2)
        report["network"] = True
    except OSError:
        report["network"] = False
    try:
        open(os.path.join(os.path.dirname(os.__file__), "planted.py"), "w")
        report["wrote_python"] = True
    except OSError:
        report["wrote_python"] = False
    os.write(1, b"x" * (1 << 20))
    os.write(int(sys.argv[-1]), json.dumps(report).encode())
''')


def _token() -> str:
    """A sleep duration no other process on the machine uses, to find what a sandbox left behind."""
    return f"{300 + secrets.randbelow(100)}.{secrets.randbelow(10**9):09d}"


def _left_behind(token: str, grace_s: float = 10.0) -> list[int]:
    """Pids of processes whose command line holds token and that are still alive grace_s after the sandbox ended
    (killing them, so a failed test leaks nothing). The kernel kills what is left in a PID namespace once its init
    is gone, but on a loaded machine a killed process can still be seen exiting for a moment."""

    def alive() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            if token in " ".join(proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found

    deadline = time.monotonic() + grace_s
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in left:
        proc.kill()
    return [proc.pid for proc in left]


@needs_sandbox
def test_sandbox_sees_only_itself_and_takes_everything_with_it(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("reference answers")
    token = _token()
    code = f"exec({INSIDE.replace('TOKEN', token)!r})"
    out = bubblewrap.run([sys.executable, "-c", code, str(secret), str(SOURCE)], b"", 120,
                         env={"GRADER_CWD": str(Path(__file__).parent)})
    report = json.loads(out.result)
    assert len(report["pids"]) <= 6 and max(report["pids"]) < 50, report["pids"]  # its own PID namespace
    assert report["uid"] != 0 and int(report["caps"], 16) == 0
    assert not report["secret"] and not report["source"] and not report["grader_cwd"]
    assert report["interfaces"] == ["lo"] and not report["network"]
    assert not report["wrote_python"]
    assert "GRADER_CWD" in report["env"] and not any(k.startswith(("PYTEST", "DSGD_HOSTILE")) for k in report["env"])
    assert not _left_behind(token), "a detached process of the sandbox outlived it"


@needs_sandbox
def test_a_sandbox_that_overruns_is_killed_whole():
    token = _token()
    code = f"import os, time; os.system('setsid sleep {token} &'); time.sleep(300)"
    out = bubblewrap.run([sys.executable, "-c", code], b"", 3)
    assert out.timed_out and out.result is None
    assert not _left_behind(token)


def test_grade_refuses_without_a_sandbox_and_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on the PATH
    bubblewrap.probe.cache_clear()
    try:
        assert cli.main([str(tmp_path), "--source", str(SOURCE), "--out", str(tmp_path / "out")]) == 2
    finally:
        monkeypatch.undo()
        bubblewrap.probe.cache_clear()
    err = capsys.readouterr().err
    assert "bubblewrap" in err and "apt-get install bubblewrap" in err and "--unsafe-no-sandbox" in err
    assert not (tmp_path / "out" / "grades.csv").exists()


def test_outputs_are_atomic_and_never_follow_links_or_open_fifos(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    safeio.write_atomic(out, "feedback/a/x.html", b"one")
    safeio.write_atomic(out, "feedback/a/x.html", b"two")
    assert (out / "feedback/a/x.html").read_bytes() == b"two"
    os.mkfifo(out / "grades.csv")
    with pytest.raises(safeio.UnsafeOutput, match="FIFO"):
        safeio.write_atomic(out, "grades.csv", b"rows")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, out / "grading.json")
    with pytest.raises(safeio.UnsafeOutput, match="symlink"):
        safeio.write_atomic(out, "grading.json", b"{}")
    os.symlink(tmp_path, out / "feedback" / "b")
    with pytest.raises(safeio.UnsafeOutput, match="not a folder"):
        safeio.write_atomic(out, "feedback/b/victim.txt", b"overwritten")
    assert victim.read_text() == "keep"
    assert sorted(p.name for p in (out / "feedback" / "a").iterdir()) == ["x.html"]  # no temp file left


def test_a_planted_fifo_stops_the_batch_before_any_kernel(tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(SOURCE / "ps01_sgd", source / "ps01_sgd")
    nb = source / "ps01_sgd" / "ps01_sgd.ipynb"
    nb.write_text(nb.read_text().replace("def minibatch_indices(", "raise SystemError()\\n", 1))  # a kernel would say so
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "grades.csv")
    rc = cli.main([str(tmp_path / "subs"), "--assignment", "ps01_sgd", "--source", str(source), "--out", str(out),
                   "--unsafe-no-sandbox", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "FIFO" in err and "reference" not in err and "solution fails" not in err, err


def test_listing_skips_what_is_not_a_regular_file_or_folder_without_blocking(tmp_path):
    assignments = {n: load_assignment(p) for n, p in find_assignments(SOURCE).items() if n == "ps01_sgd"}
    subs = tmp_path / "subs"
    nb = SOURCE / "ps01_sgd" / "ps01_sgd.ipynb"
    (subs / "ann").mkdir(parents=True)
    shutil.copy(nb, subs / "ann" / "ps01_sgd.ipynb")
    (subs / "bob").mkdir()
    os.symlink(nb, subs / "bob" / "ps01_sgd.ipynb")
    os.mkfifo(subs / "bob" / "extra.ipynb")
    os.mkfifo(subs / "carl.ipynb")
    os.symlink(subs / "ann", subs / "dan")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(subs / "eve.ipynb"))
    sock.close()
    found = {s.student: s for s in find_submissions(subs, assignments, "ps01_sgd")}
    assert found["ann"].path == subs / "ann" / "ps01_sgd.ipynb"
    assert found["bob"].path is None and "symlink" in found["bob"].note and "FIFO" in found["bob"].note
    assert found["carl"].path is None and "FIFO" in found["carl"].note
    assert found["dan"].path is None and "symlink" in found["dan"].note
    assert found["eve"].path is None and "socket" in found["eve"].note
    unassigned = find_submissions(subs, assignments, None)
    assert {s.student for s in unassigned if s.assignment == "(skipped)"} == {"bob", "carl", "dan", "eve"}


def test_unsafe_grades_say_so_in_the_csv_and_on_every_page(tmp_path):
    sub = Submission("ann", "ps01_sgd", None, [Grade("q1", 1.0, 2.0, "passed")])
    rows = list(csv.DictReader(_csv_text([sub], sandbox=False).splitlines()))
    assert rows[0]["sandbox"].startswith("NONE") and "unsafe" in rows[0]["sandbox"]
    assert list(csv.DictReader(_csv_text([sub], sandbox=True).splitlines()))[0]["sandbox"] == "bubblewrap"
    write_feedback(tmp_path / "a.html", "ann", "ps01_sgd", sub.grades, unsafe=True)
    write_feedback(tmp_path / "b.html", "ann", "ps01_sgd", sub.grades)
    assert "without an OS sandbox" in (tmp_path / "a.html").read_text()
    assert "without an OS sandbox" not in (tmp_path / "b.html").read_text()


def _blocked_ancestor(path: str) -> str | None:
    """The first folder above path that other users cannot enter (e.g. /root holding a pyenv Python), if any."""
    for parent in reversed(Path(path).parents):
        if str(parent) != "/" and not os.stat(parent).st_mode & stat.S_IXOTH:
            return str(parent)
    return None


@needs_sandbox
@pytest.mark.timeout(600)
def test_an_ordinary_user_grades_a_hostile_class_in_the_sandbox():
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("unshare"):
        pytest.skip("needs root (to create a test user with useradd) and util-linux unshare")
    for folder in (Path(sys.executable).parent, Path(REPO)):
        closed = [p for p in (folder, *folder.parents) if not p.stat().st_mode & stat.S_IXOTH]
        if closed:
            pytest.skip(f"an ordinary user cannot reach {folder}: {closed[0]} is closed to others (mode "
                        f"{oct(closed[0].stat().st_mode & 0o777)}); clone the course where other users can read it")
    user = f"dsgdt{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True)
    work = Path(tempfile.mkdtemp(prefix="dsgd-user-test-", dir="/tmp"))
    try:
        entry = pwd.getpwnam(user)
        source = work / "source"
        shutil.copytree(SOURCE / "ps01_sgd", source / "ps01_sgd")
        nb = source / "ps01_sgd" / "ps01_sgd.ipynb"
        subs = work / "subs"
        for name, kind in (("honest_1", "good"), ("honest_2", "good"), ("stub", "stub"),
                           ("theft_child", "theft_child"), ("read_proc", "read_proc"), ("detached", "detached"),
                           ("malformed_reports", "malformed_reports"), ("echo_hidden", "echo_hidden"),
                           ("flood_after_denial", "flood_after_denial"), ("keyring", "keyring")):
            write_submission(nb, subs / name / "ps01_sgd.ipynb", kind)
        for here, dirs, files in os.walk(work):
            for name in [here] + [os.path.join(here, n) for n in dirs + files]:
                os.chown(name, entry.pw_uid, entry.pw_gid)
        grade = [sys.executable, "-m", "dsgd_teach.grading.cli", str(subs), "--assignment", "ps01_sgd",
                 "--source", str(source), "--out", str(work / "out"), "--jobs", "2", "--timeout", "20",
                 "--cpu-s", "120", "--no-progress"]
        as_user = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--",
                   "env", f"HOME={work}", f"PYTHONPATH={REPO}", "PATH=/usr/bin:/bin"] + grade
        blocked = _blocked_ancestor(sys.base_prefix)
        if blocked:  # this machine's Python sits under a private folder: show the user only the Python in it
            hold = work / ".python"
            script = (f'mkdir -p "{hold}" && mount --bind "{sys.base_prefix}" "{hold}" && '
                      f'mount -t tmpfs -o mode=755 tmpfs "{blocked}" && mkdir -p "{sys.base_prefix}" && '
                      f'mount --move "{hold}" "{sys.base_prefix}" && exec "$@"')
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"] + as_user
        else:
            cmd = as_user
        keys = Path("/proc/keys").read_text()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=560, cwd=work)
        assert done.returncode == 0, done.stderr[-2000:]
        limits = json.loads((work / "out" / "grading.json").read_text())["cgroup_limits"]
        if not limits["enforced"]:  # no delegated cgroup for this user: said, never silently skipped
            assert limits["why"] and "cgroup limits are NOT enforced" in done.stderr, (limits, done.stderr[-500:])
        with open(work / "out" / "grades.csv", newline="") as fh:
            every = list(csv.DictReader(fh))
        rows = [r for r in every if r["question"] != "(integrity)"]
        flagged = {r["student"] for r in every if r["question"] == "(integrity)"}
        assert {"malformed_reports", "echo_hidden", "flood_after_denial"} <= flagged, flagged
        assert not flagged & {"honest_1", "honest_2", "stub"}, flagged
        totals: dict[str, float] = {}
        for r in rows:
            totals[r["student"]] = totals.get(r["student"], 0.0) + float(r["points"])
        assert totals == {"honest_1": 6.0, "honest_2": 6.0, "stub": 0.0, "theft_child": 0.0, "read_proc": 0.0,
                          "detached": 0.0, "malformed_reports": 0.0, "echo_hidden": 0.0,
                          "flood_after_denial": 0.0, "keyring": 0.0}, totals
        escaped = [r for r in rows if "ESCAPED" in r["reason"]]  # a key stored, for a later sandbox to read
        assert not escaped, escaped
        owners = [ln.split(":")[0].strip() for ln in Path("/proc/key-users").read_text().splitlines()]
        assert Path("/proc/keys").read_text() == keys and str(entry.pw_uid) not in owners, owners
        assert {r["sandbox"] for r in rows} == {"bubblewrap"}
        assert all(os.stat(p).st_uid == entry.pw_uid for p in (work / "out").rglob("*"))
        alive = [p for p in psutil.process_iter(["username", "status"])  # a zombie left to init is dead already
                 if p.info["username"] == user and p.info["status"] != psutil.STATUS_ZOMBIE]
        assert not alive, alive
    finally:
        for proc in psutil.process_iter(["username"]):
            if proc.info["username"] == user:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["userdel", user], check=False, capture_output=True)


def test_the_worker_keeps_reports_only_and_nothing_erases_them():
    import nbformat
    from nbclient.exceptions import CellExecutionComplete

    from dsgd_teach.grading.probe import MIME
    from dsgd_teach.grading.worker import _Client

    cell = nbformat.v4.new_code_cell("pass")
    client = _Client(nbformat.v4.new_notebook(cells=[cell]), km=None)
    client.reset_execution_trackers()
    client.clear_before_next_output = False  # as nbclient sets it when a cell starts
    report = {"label": "a", "value": {"t": "num", "v": 1.0}}
    for msg_type, content in (("display_data", {"data": {MIME: report}, "transient": {"display_id": "d"}}),
                              ("stream", {"name": "stdout", "text": "x" * 100_000}),
                              ("clear_output", {"wait": False}),
                              ("update_display_data", {"data": {MIME: {"label": "b"}}, "transient": {"display_id": "d"}}),
                              ("display_data", {"data": {"text/plain": "forged"}})):
        client.process_message({"msg_type": msg_type, "content": {"metadata": {}, **content}, "parent_header": {"msg_id": "m"},
                                "header": {"msg_type": msg_type}, "metadata": {}}, cell, 0)
    assert [o["data"] for o in cell.outputs] == [{MIME: report}]
    with pytest.raises(CellExecutionComplete):
        client.process_message({"msg_type": "status", "content": {"execution_state": "idle"},
                                "parent_header": {}, "header": {}, "metadata": {}}, cell, 0)


WATCH = textwrap.dedent('''\
    import ctypes, os, select, sys
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    wd = libc.inotify_add_watch(fd, sys.argv[1].encode(), 0x20 | 0x01)  # IN_OPEN | IN_ACCESS
    if wd < 0:
        os.write(int(sys.argv[-1]), os.strerror(ctypes.get_errno()).encode())
    else:
        seen = os.read(fd, 65536) if select.select([fd], [], [], 10)[0] else b""
        os.write(int(sys.argv[-1]), f"{len(seen)} bytes of events".encode())
''')


FANOTIFY = textwrap.dedent('''\
    import ctypes, os, select, sys
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": (300, 301), "aarch64": (262, 263)}[os.uname().machine]
    fd = libc.syscall(nr[0], 0x200, os.O_RDONLY)  # FAN_CLASS_NOTIF | FAN_REPORT_FID: allowed unprivileged
    if fd < 0 or libc.syscall(nr[1], fd, 1, ctypes.c_uint64(0x08000021), -100, sys.argv[1].encode()) < 0:
        os.write(int(sys.argv[-1]), os.strerror(ctypes.get_errno()).encode())  # FAN_OPEN|FAN_ACCESS|ON_CHILD
    else:
        seen = os.read(fd, 65536) if select.select([fd], [], [], 10)[0] else b""
        os.write(int(sys.argv[-1]), f"{len(seen)} bytes of events".encode())
''')


@needs_sandbox
@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="no seccomp table for this machine")
@pytest.mark.parametrize("code", [WATCH, FANOTIFY], ids=["inotify", "fanotify"])
def test_no_file_watch_on_the_mounts_shared_with_the_host(code):
    """A watch on the shared Python installation would show the sandbox when the host or a neighbour opens a file."""
    watched = os.path.dirname(os.__file__)
    opener = threading.Timer(1.5, lambda: open(os.__file__, "rb").read(1))
    opener.start()
    try:
        out = bubblewrap.run([sys.executable, "-c", code, watched], b"", 60)
    finally:
        opener.cancel()
    assert out.result == b"Operation not permitted", out


REPLACE_CHANNEL = textwrap.dedent('''\
    import fcntl, os, subprocess, sys
    from dsgd_teach.grading import sandbox
    r, w = os.pipe()
    sandbox.install(sys.argv[1], sandbox.default_read_roots(), [], w)
    ino = os.fstat(r).st_ino
    report = None
    for fd in range(3, 256):
        try:
            if fd != r and os.fstat(fd).st_ino == ino:
                report = fd
        except OSError:
            pass
    keep = os.dup(report)  # the attack: keep a copy, point the hook's fd at /dev/null, then do what is denied
    os.dup2(os.open("/dev/null", os.O_WRONLY), report)
    if sys.argv[2] == "no copy":
        os.close(keep)
    try:
        subprocess.run(["/bin/true"])
    except PermissionError:
        pass
    fcntl.fcntl(r, fcntl.F_SETFL, os.O_NONBLOCK)
    try:
        print(os.read(r, 65536).decode())
    except BlockingIOError:
        print("nothing on the channel")
''')


@pytest.mark.parametrize("variant", ["copy kept", "no copy"])
def test_a_replaced_denial_channel_is_reported_or_ends_the_kernel(tmp_path, variant):
    """dup the hook's channel, dup2 /dev/null over it, then do something denied: never a silent denial."""
    out = subprocess.run([sys.executable, "-c", REPLACE_CHANNEL, str(tmp_path), variant], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    if variant == "copy kept":
        assert sandbox.CHANNEL_REPLACED in out.stdout and "subprocess.Popen" in out.stdout, (out.stdout, out.stderr)
    else:
        assert out.returncode == -9, (out.returncode, out.stdout, out.stderr)



@pytest.mark.parametrize("entry", ["dsgd_teach.grading.worker", "dsgd_teach.grading.gradescope"])
def test_per_notebook_processes_skip_the_slow_optional_imports(entry):
    """The worker (one per notebook) and the autograder's run import nbformat without what lean.py names."""
    from dsgd_teach.grading.lean import SLOW_OPTIONAL

    code = textwrap.dedent(f"""\
        import runpy, sys
        sys.argv = ["x", "/nonexistent"]
        try:  # no job on stdin, no autograder root: it stops, after its imports
            runpy.run_module({entry!r}, run_name="__main__", alter_sys=True)
        except BaseException:
            pass
        print("nbformat" in sys.modules, sorted(m for m in sys.modules if m.split(".")[0] in {SLOW_OPTIONAL!r}
                                                 and sys.modules[m] is not None))
    """)
    out = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["True []"], (out.stdout, out.stderr[-500:])
