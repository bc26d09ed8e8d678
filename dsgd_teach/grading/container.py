"""Container mode: a sandbox for machines where no namespace can be created (Docker's default seccomp profile).

Inside such a container (Gradescope's autograder among them) bubblewrap cannot start: `unshare` and `clone` with
namespace flags are denied. When switched on (`DSGD_GRADING_CONTAINER=1`, `--container-mode`), each submission's
worker and kernel run instead with what the container still allows: a uid of their own with no capabilities
(`setpriv`, so they can neither read the grader's 0700 folders nor signal the grader or another sandbox), the
seccomp filter of `seccomp.py` (installed here with no_new_privs, inherited by every process and never removable),
the worker's rlimits and the cgroup where one can be written, an empty private folder (0700, that uid's) as
working directory, HOME and TMPDIR, and no environment of the grader's. Verdicts are still computed in the
grader's process. What this mode does not give (no PID, mount or network namespace) is in grading/README.md.
"""

from __future__ import annotations

import functools
import itertools
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

from . import bubblewrap, cgroups, seccomp

SWITCH = "DSGD_GRADING_CONTAINER"
LABEL = ("container mode: no namespaces; an unprivileged uid of its own, seccomp, rlimits, a private working "
         "folder; no PID, mount or network isolation")
UID_BASE = 3_600_000  # one fresh uid per sandbox (bubblewrap's root mode uses 3,100,000 and up)
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # shared writable folders: what a sandbox leaves there is removed
_uids = itertools.count()
_uid_lock = threading.Lock()


def enabled() -> bool:
    """Whether the TA switched container mode on (the environment variable SWITCH is "1")."""
    return os.environ.get(SWITCH, "") == "1"


def _next_uid() -> int:
    with _uid_lock:
        return UID_BASE + (os.getpid() % 1000) * 1000 + next(_uids) % 1000


@functools.lru_cache(maxsize=1)
def probe() -> str:
    """'' when container mode can run here (root, setpriv, a seccomp filter for this machine), else why not."""
    if os.geteuid() != 0:
        return "container mode needs the grader to run as root (to switch each sandbox to a uid of its own)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if seccomp.program() is None:
        return "no seccomp filter for this machine's architecture"
    return ""


def require() -> None:
    """Raise bubblewrap.SandboxUnavailable unless container mode can run here."""
    why = probe()
    if why:
        raise bubblewrap.SandboxUnavailable(f"container mode cannot run: {why}")


def require_fenced(paths: list[str]) -> None:
    """Raise bubblewrap.SandboxUnavailable when a sandbox uid could read one of paths (no mount namespace hides
    them in this mode: the grader's sources, submissions and output must be closed to other users)."""
    open_ = readable_by_sandbox(list(paths) + package_secrets())
    if open_:
        raise bubblewrap.SandboxUnavailable(
            "in container mode a submission's uid could read " + ", ".join(open_) + "; close them to other users "
            "(chmod -R go-rwx PATH) or grade with bubblewrap")


def package_secrets() -> list[str]:
    """The assignment sources of the checkout the dsgd_teach package is imported from, if any: that checkout is
    readable from the sandbox (the package's folder is on its PYTHONPATH), so its sources must be fenced too."""
    sources = os.path.join(bubblewrap.package_parent(), "course", "assignments", "source")
    return [sources] if os.path.isdir(sources) else []


def select(unsafe: bool = False, switched_on: bool | None = None) -> bool | str:
    """The sandbox a batch uses: False (unsafe), True (bubblewrap, when it can start here), else "container" when
    container mode is switched on, else True (and bubblewrap.require() then refuses, saying why)."""
    if unsafe:
        return False
    if not bubblewrap.probe():
        return True
    return "container" if (enabled() if switched_on is None else switched_on) else True


def command(inner: list[str], uid: int) -> list[str]:
    """argv that installs the seccomp filter, drops to uid with no capabilities, then execs inner."""
    setpriv = shutil.which("setpriv") or "setpriv"
    drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]
    return [sys.executable, "-S", "-m", "dsgd_teach.grading.confine"] + drop + inner


def run(inner: list[str], stdin: bytes, timeout_s: float, env: dict[str, str] | None = None,
        limits: cgroups.CgroupLimits | None = None) -> bubblewrap.Outcome:
    """Run inner as a fresh uid under the seccomp filter; its result is what it writes to the fd appended to argv.

    Returns only once no process of that uid is left, and its private folder and its files in SCRATCH are gone.
    """
    uid = _next_uid()
    private = tempfile.mkdtemp(prefix="dsgd-box-", dir=SCRATCH[0])
    os.chown(private, uid, uid)
    os.chmod(private, 0o700)
    full_env = {**bubblewrap.base_env(), "HOME": private, "TMPDIR": private, **(env or {})}
    try:
        if limits is None:
            return _run(inner, stdin, timeout_s, full_env, uid, private, None)
        with cgroups.open_scope(limits) as scope:
            return _run(inner, stdin, timeout_s, full_env, uid, private, scope)
    finally:
        kill_uid(uid)
        shutil.rmtree(private, ignore_errors=True)
        remove_files_of(uid)


def _run(inner: list[str], stdin: bytes, timeout_s: float, env: dict[str, str], uid: int, private: str,
         scope: cgroups.Scope | None) -> bubblewrap.Outcome:
    result_r, result_w = os.pipe()
    argv = command(inner, uid) + [str(result_w)]
    data = bytearray()
    reader = threading.Thread(target=bubblewrap.drain, args=(result_r, data), daemon=True)
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(scope.wrap(argv) if scope else argv, stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=err, pass_fds=(result_w,), cwd=private,
                                    env=env, start_new_session=True)
        finally:
            os.close(result_w)
        reader.start()
        timed_out = bubblewrap.feed(proc, stdin, timeout_s)
        if timed_out or proc.poll() is None:
            kill_uid(uid)
            proc.kill()
            proc.wait(timeout=30)
        kill_uid(uid)  # what the worker left behind (setsid grandchildren) would otherwise keep the pipe open
        reader.join(timeout=30)
        tail = bubblewrap.tail_of(err)
    usage = scope.usage() if scope else None
    return bubblewrap.Outcome(data if data and not timed_out else None, proc.returncode, tail, timed_out, usage)


def _uid_pids(uid: int) -> list[int]:
    """Live processes (zombies excluded) whose uid is uid."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            pids.append(int(name))
    return pids


def kill_uid(uid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of uid until none is left (a process of that uid calls kill(-1), which no fork can
    outrun); raises RuntimeError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    code = "import os, signal; os.kill(-1, signal.SIGKILL)"
    while _uid_pids(uid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of the sandbox uid {uid} survived {timeout_s:g} s of SIGKILL")
        subprocess.run([shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        "--", sys.executable, "-S", "-c", code], timeout=30, check=False, cwd="/")
        time.sleep(0.01)


def remove_files_of(uid: int) -> None:
    """Delete what uid left at the top of the shared writable folders (SCRATCH; no link followed)."""
    for top in SCRATCH:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
                if st.st_uid != uid:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            except OSError:
                continue


def readable_by_sandbox(paths: list[str]) -> list[str]:
    """Which of paths a sandbox uid could open (read a file, list a folder): each must be fenced by permissions."""
    code = ("import os, sys\nfor p in sys.argv[1:]:\n    try:\n"
            "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').close()\n        print(p)\n"
            "    except OSError:\n        pass\n")
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        nobody = 65534
    out = subprocess.run([shutil.which("setpriv") or "setpriv", f"--reuid={nobody}", f"--regid={nobody}",
                          "--clear-groups", "--", sys.executable, "-S", "-c", code, *paths],
                         capture_output=True, text=True, timeout=60, cwd="/")
    return [line for line in out.stdout.splitlines() if line in paths]
