"""The OS sandbox around one submission: a bubblewrap jail holding the grading worker and the student's kernel.

Inside: new PID, mount, network, IPC, UTS and cgroup namespaces; a root filesystem holding only the Python
installation, the virtualenv and the dsgd_teach package (read-only) plus an empty, size-capped /tmp; no network but
loopback; an unprivileged uid with no capabilities. The job goes in on stdin and the worker's result comes out on
a pipe only the worker holds (its fd number is the last argument), never on stdout/stderr. When the sandbox's init dies the kernel kills
every process of its PID namespace, and `run` returns only once the outer bwrap has reaped it.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from . import cgroups, reports, seccomp

HOW_TO_GET_ONE = (
    "no OS sandbox is available for grading kernels. Install bubblewrap (as root: `apt-get install bubblewrap`, "
    "or `make sandbox-deps`) and allow unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`, "
    "`user.max_user_namespaces` > 0; in a container: run it with a seccomp profile that permits them, or switch on "
    "container mode, weaker, with --container-mode or DSGD_GRADING_CONTAINER=1, see dsgd_teach/grading/README.md). "
    "To grade without a sandbox anyway (a hostile student can then steal solutions and tamper with other grades), "
    "pass --unsafe-no-sandbox."
)
TMP_BYTES = 256 * 1024 * 1024
MAX_RESULT_BYTES = reports.MAX_RESULT_BYTES + 1  # kept of the result pipe; more is refused unread
UID_BASE = 3_100_000  # root grader: one fresh uid per sandbox, so RLIMIT_NPROC counts that sandbox only
_uids = itertools.count()
_uid_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create the namespaces it needs."""


@dataclass(frozen=True)
class Outcome:
    """What came back from one sandbox run."""

    result: bytes | bytearray | None
    returncode: int | None
    stderr_tail: str
    timed_out: bool
    usage: cgroups.Usage | None = None  # the sandbox's cgroup: limits hit, or why none were enforced


def _visible_roots() -> list[str]:
    """Host directories bound read-only: the Python installation, the virtualenv and the dsgd_teach package."""
    import dsgd_teach

    package = os.path.dirname(os.path.realpath(dsgd_teach.__file__))
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)} | {sys.prefix, package}
    return sorted(r for r in roots if not r.startswith("/usr/") and r != "/usr")


def package_parent() -> str:
    """The folder put on PYTHONPATH inside, so the bound package is the one imported."""
    import dsgd_teach

    return os.path.dirname(os.path.dirname(os.path.realpath(dsgd_teach.__file__)))


def _next_uid() -> int:
    with _uid_lock:
        return UID_BASE + (os.getpid() % 1000) * 1000 + next(_uids) % 1000


def command(inner: list[str], env: dict[str, str], info_fd: int | None = None,
            seccomp_fd: int | None = None) -> list[str]:
    """The bwrap argv that runs `inner` (an absolute path and its arguments) in a fresh sandbox."""
    bwrap = shutil.which("bwrap") or "bwrap"
    root = os.geteuid() == 0
    argv = [bwrap] + (["--info-fd", str(info_fd)] if info_fd is not None else [])
    argv += ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "grading", "--cap-drop", "ALL"]
    if root:  # mounts made as root, then setpriv drops to a uid of its own with no capabilities
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:  # an unprivileged user: a user namespace maps the caller to the unprivileged uid 65534
        argv += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
    argv += ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
    for link in ("bin", "sbin", "lib", "lib64", "lib32"):
        target = os.path.join("/", link)
        if os.path.islink(target):
            argv += ["--symlink", os.readlink(target), target]
    if os.path.exists("/etc/ld.so.cache"):
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    roots = _visible_roots()
    parents = sorted({str(p) for r in roots for p in Path(r).parents if str(p) != "/"}, key=len)
    for d in parents:
        argv += ["--perms", "0755", "--dir", d]
    for r in roots:
        argv += ["--ro-bind", r, r]
    argv += ["--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    if root:
        uid = str(_next_uid())
        argv += ["--", shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 "--inh-caps=-all", "--no-new-privs", "--"]
    else:
        argv += ["--"]
    return argv + inner


def base_env() -> dict[str, str]:
    """The environment inside: nothing from the grader's but a locale."""
    return {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "PYTHONPATH": package_parent(),
           "PYTHONDONTWRITEBYTECODE": "1", "LANG": os.environ.get("LANG", "C.UTF-8")}


def run(inner: list[str], stdin: bytes, timeout_s: float, env: dict[str, str] | None = None,
        limits: cgroups.CgroupLimits | None = None) -> Outcome:
    """Run inner in a fresh sandbox; its result is what it writes to the fd number appended to its argv.

    With limits, the whole sandbox runs in a cgroup of its own (cgroups.py), removed before this returns.
    """
    if limits is None:
        return _run(inner, stdin, timeout_s, env, None)
    with cgroups.open_scope(limits) as scope:
        return _run(inner, stdin, timeout_s, env, scope)


def _run(inner: list[str], stdin: bytes, timeout_s: float, env: dict[str, str] | None,
         scope: cgroups.Scope | None) -> Outcome:
    result_r, result_w = os.pipe()
    info_r, info_w = os.pipe()
    filter_r = _filter_fd()
    argv = command(inner, {**base_env(), **(env or {})}, info_w, filter_r)
    data = bytearray()  # filled in place, never joined: the grader holds one copy of a result
    reader = threading.Thread(target=drain, args=(result_r, data), daemon=True)
    with tempfile.TemporaryFile() as err:
        try:
            full = argv + [str(result_w)]
            proc = subprocess.Popen(scope.wrap(full) if scope else full, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=err, pass_fds=tuple(fd for fd in (result_w, info_w, filter_r) if fd),
                                    start_new_session=True)
        finally:
            for fd in (result_w, info_w, filter_r):
                if fd is not None:
                    os.close(fd)
        reader.start()
        child = _child_pid(info_r)
        timed_out = feed(proc, stdin, timeout_s)
        if timed_out or proc.poll() is None:
            stop(proc, child)
        reader.join(timeout=30)
        tail = tail_of(err)
    usage = scope.usage() if scope else None
    return Outcome(data if data and not timed_out else None, proc.returncode, tail, timed_out, usage)


def _filter_fd() -> int | None:
    """A pipe holding the seccomp program for bwrap to read (None where this machine has no filter table)."""
    program = seccomp.program()
    if program is None:
        return None
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)  # far below a pipe's capacity
    finally:
        os.close(write_fd)
    return read_fd


def stop(proc: subprocess.Popen, child: int | None) -> None:
    """Kill the sandbox's init (the kernel then kills everything in its PID namespace) and reap bwrap."""
    for pid in (child, proc.pid):
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if pid == child:
                try:
                    proc.wait(timeout=30)
                    return
                except subprocess.TimeoutExpired:
                    continue
    proc.wait(timeout=30)


def _child_pid(info_r: int, timeout_s: float = 120.0) -> int | None:
    """The sandbox init's pid in the grader's namespace, from bwrap's --info-fd (None if bwrap failed or hung)."""
    data = b""
    with os.fdopen(info_r, "rb", buffering=0) as fh:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and select.select([fh], [], [], left)[0]:
            block = fh.read(65536)
            if not block:
                break
            data += block
    try:
        return int(json.loads(data.decode())["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def feed(proc: subprocess.Popen, stdin: bytes, timeout_s: float) -> bool:
    """Write stdin to the sandboxed process and wait for it; True when it ran past timeout_s (it is left running)."""
    try:
        proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return True
    except BrokenPipeError:  # it exited, or closed stdin, before reading all of it
        pass
    return False


def tail_of(err: IO[bytes], limit: int = 4000) -> str:
    """The last `limit` bytes of a stderr file, decoded."""
    err.seek(0, os.SEEK_END)
    err.seek(max(0, err.tell() - limit))
    return err.read().decode(errors="replace")


def drain(fd: int, data: bytearray) -> None:
    """Read the result pipe to its end, keeping at most MAX_RESULT_BYTES."""
    with os.fdopen(fd, "rb", buffering=0) as fh:
        while block := fh.read(1 << 16):
            if len(data) < MAX_RESULT_BYTES:
                data += block[:MAX_RESULT_BYTES - len(data)]


@functools.lru_cache(maxsize=1)
def probe() -> str:
    """'' when a sandbox can be built here, else why not (checked once per process by running `python -c`)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    code = "import os, sys; os.write(int(sys.argv[1]), str(os.getuid()).encode())"
    out = run([sys.executable, "-c", code], b"", 60)
    if out.result is None or out.result == b"0":
        return f"bwrap could not start a sandbox (exit {out.returncode}): {out.stderr_tail.strip()[-300:]}"
    return ""


def require() -> None:
    """Raise SandboxUnavailable with instructions unless a sandbox can be built."""
    why = probe()
    if why:
        raise SandboxUnavailable(f"{why}; {HOW_TO_GET_ONE}")
