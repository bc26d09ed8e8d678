"""Resource limits and an audit-hook fence for a grading kernel (defence in depth, not an OS sandbox).

The OS sandbox is bubblewrap.py; this fence runs inside it, and is all there is with --unsafe-no-sandbox.

Installed by the kernel wrapper before ipykernel starts, so before any student code. It denies, and reports on
stderr (which only the grading worker reads): reading files outside the Python installation, the dsgd_teach
package and the kernel's own empty work directory; writing outside the work directory; starting processes;
loading native code via ctypes; walking the garbage collector (to reach this hook's state); and signalling any
process but the kernel itself. Python's audit hooks cannot be removed once added. They are not a security
boundary against an attacker who studies them; see the threat model in dsgd_teach/grading/README.md.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterable

FLAG = "DSGD-SANDBOX-DENIED"
CHANNEL_REPLACED = "replacing the denial channel's fd (a copy of it was kept)"
_DENY_ALWAYS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer",
    "ctypes.create_string_buffer", "ctypes.call_function", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "os.killpg", "signal.pthread_kill",
})
_WRITE_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.link", "os.chmod", "os.chown", "os.truncate",
    "os.utime", "shutil.rmtree", "shutil.move", "os.chflags", "os.setxattr", "os.removexattr",
})
_COPY_EVENTS = frozenset({"shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "os.symlink"})
_LIST_EVENTS = frozenset({"os.listdir", "os.scandir", "glob.glob", "glob.glob/2", "os.chdir"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def set_limits(memory_mb: int, cpu_s: int) -> None:
    """Cap this process's address space (RLIMIT_AS) and CPU seconds (RLIMIT_CPU); no core dumps."""
    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 2))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024 * 1024, 256 * 1024 * 1024))


def install(workdir: str, read_roots: Iterable[str], protected: Iterable[str], denial_fd: int = -1) -> None:
    """Add the audit hook: reads only under read_roots or workdir (never under protected), writes only in workdir.

    Denials are written to denial_fd (moved to a close-on-exec fd of the hook's own), else to a copy of stderr.
    Should that fd be replaced (dup2 over it, once a copy was kept), they go to a copy with a line saying so, and
    with no copy left in this process the process kills itself rather than deny in silence.
    """
    realpath, isinstance_, str_, bytes_ = os.path.realpath, isinstance, str, bytes
    fsdecode, fspath, getpid, write = os.fsdecode, os.fspath, os.getpid, os.write
    lstat, readlink, getcwd = os.lstat, os.readlink, os.getcwd
    work = realpath(workdir)
    readable = tuple(sorted({realpath(r) for r in read_roots} | {work, "/dev/null", "/dev/urandom", "/proc/self"}))
    fenced = tuple(sorted(realpath(p) for p in protected))
    writable = (work, "/dev/null")
    own_pid = getpid()
    report_fd = os.dup(denial_fd if denial_fd >= 0 else 2)  # os.dup's copy is not inherited by children
    if denial_fd >= 0:
        os.close(denial_fd)
    fstat, kill = os.fstat, os.kill
    channel = (fstat(report_fd).st_dev, fstat(report_fd).st_ino)

    def on_channel(fd: int) -> bool:
        try:
            st = fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == channel

    def under(path: str, roots: tuple[str, ...]) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def resolve(arg: object) -> str | None:
        if isinstance_(arg, int):
            return None
        if os.lstat is not lstat or os.readlink is not readlink or os.getcwd is not getcwd:
            return "/<os functions were replaced>"
        try:
            text = fsdecode(fspath(arg)) if isinstance_(arg, (str_, bytes_, os.PathLike)) else None
        except TypeError:
            return "/<unreadable path>"
        if text is None:
            return None
        if text.startswith("/proc/self/"):
            text = f"/proc/{own_pid}/" + text[len("/proc/self/"):]
        resolved = realpath(text)
        if resolved.startswith(f"/proc/{own_pid}/") and not resolved.startswith(f"/proc/{own_pid}/cwd"):
            return "/proc/self/" + resolved[len(f"/proc/{own_pid}/"):]
        return resolved

    def deny(event: str, detail: object) -> None:
        line, targets = f"{FLAG} {event} {detail!r}\n".encode()[:2000], [report_fd]
        if not on_channel(report_fd):  # replaced (dup2) after a copy was kept: report on that copy
            targets = [fd for fd in range(4096) if on_channel(fd)]
            line = f"{FLAG} {CHANNEL_REPLACED}\n".encode() + line
        for fd in targets:
            try:
                write(fd, line)
                break
            except OSError:
                continue
        else:  # no copy in this process to write on (closed, or kept only by a child): this kernel ends here
            if targets != [report_fd]:
                kill(own_pid, 9)
        raise PermissionError(f"not allowed while grading: {event} {detail!r}")

    def may_read(path: str) -> bool:
        return under(path, readable) and not under(path, fenced)

    def hook(event: str, args: tuple) -> None:
        if event in _DENY_ALWAYS:
            deny(event, args[:1])
        elif event == "open":
            path = resolve(args[0])
            if path is None:
                return
            mode, flags = args[1] if len(args) > 1 else "r", args[2] if len(args) > 2 else 0
            writing = (isinstance_(mode, str_) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if (writing and not under(path, writable)) or not may_read(path):
                deny(event, path)
        elif event in _LIST_EVENTS:
            path = resolve(args[0] if args else ".")
            if path is not None and not may_read(path):
                deny(event, path)
        elif event in _WRITE_EVENTS:
            for arg in args[:2]:
                path = resolve(arg)
                if path is not None and not under(path, writable):
                    deny(event, path)
        elif event in _COPY_EVENTS and len(args) >= 2:
            src, dst = resolve(args[0]), resolve(args[1])
            if (src is not None and not may_read(src)) or (dst is not None and not under(dst, writable)):
                deny(event, (src, dst))
        elif event == "os.kill" and args and args[0] != own_pid:
            deny(event, args[:2])

    sys.addaudithook(hook)


def default_read_roots() -> list[str]:
    """Where a grading kernel may read: the Python installation (its site directories, also those a .pth file
    adds) and the dsgd_teach package (not its checkout)."""
    import sysconfig

    import dsgd_teach

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(dsgd_teach.__file__)}
    roots.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    roots.update(p for p in sys.path if os.path.isabs(p) and os.path.basename(p) in ("site-packages", "dist-packages"))
    roots.update(("/usr", "/lib", "/lib64", "/etc", "/sys", "/dev/shm"))
    return sorted(roots)
