"""Per-sandbox kernel limits from cgroups: memory (memfd, tmpfs and page cache included, no swap), processes, CPU share.

Each sandbox runs in a cgroup of its own, made before bwrap starts (bwrap is exec'ed by a shell that has already
joined it, so every process of the sandbox is born inside) and removed once the sandbox is reaped, killing whatever
is left in it first:

- memory: `memory.max` (v2) / `memory.limit_in_bytes` (v1), with swap off (`memory.swap.max` 0 / `memsw` = the
  limit). Every page the sandbox's processes touch is charged: anonymous memory (numpy arrays), memfds and tmpfs
  files (`/tmp`), page cache. Past the limit the kernel's OOM killer ends a process of that sandbox only (the
  grading kernel first: it raises its own `oom_score_adj`), and the grader reads the OOM count afterwards.
- processes: `pids.max` (threads included); a fork bomb gets EAGAIN, and `pids.events` says it hit the limit.
- CPU: every sandbox has the same `cpu.weight` (v2) / `cpu.shares` (v1), so a submission running 100 spinning
  processes gets no more CPU than its neighbour with one; `cpu_max` (CPUs) adds a hard quota when asked for.

cgroup v2 is used where `memory`, `pids` and `cpu` can be enabled below the grader's cgroup or the root (root, or a
delegated, process-free subtree); otherwise the v1 hierarchies of those controllers where the grader may create
groups (root). Where neither works (an ordinary user without a delegated subtree, a container without cgroup
write access) `open_scope` gives a scope that enforces nothing and says why; the batch reports it.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import shlex
import signal
import time
from dataclasses import dataclass

from . import cgroup_extras as extras
from .cgroup_usage import Usage

CONTROLLERS = ("memory", "pids", "cpu")
PREFIX = "dsgd-grading-"
_names = itertools.count()


@dataclass(frozen=True)
class CgroupLimits:
    """What one sandbox may use in all: bytes of memory, processes (and threads), a CPU weight and optional quota."""

    memory_bytes: int
    pids: int = 128
    cpu_weight: int = 100  # cgroup v2 scale (1..10000); v1 cpu.shares = weight * 1024 / 100
    cpu_max: float | None = None  # CPUs; None: no quota, only the equal share
    socket_bytes: int = 0  # socket buffers (cgroup v1's TCP limit; on v2 they count against memory_bytes)


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _keyed(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file ("key value" lines) as a dict."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _mounts() -> tuple[str | None, dict[str, str]]:
    """The cgroup2 mount point and, per v1 controller, its hierarchy's mount point (from /proc/self/mountinfo)."""
    v2, v1 = None, {}
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        if rest[0] == "cgroup2" and v2 is None:
            v2 = point
        elif rest[0] == "cgroup":
            for opt in rest[2].split(","):
                if opt in CONTROLLERS + ("blkio",) and opt not in v1:
                    v1[opt] = point
    return v2, v1


def _own_paths() -> tuple[str | None, dict[str, str]]:
    """This process's cgroup: the v2 path ("0::") and the v1 path per controller (from /proc/self/cgroup)."""
    v2, v1 = None, {}
    for line in _read("/proc/self/cgroup").splitlines():
        hid, _, rest = line.partition(":")
        ctls, _, path = rest.partition(":")
        if hid == "0" and not ctls:
            v2 = path
        for ctl in ctls.split(","):
            if ctl in CONTROLLERS + ("blkio",):
                v1[ctl] = path
    return v2, v1


class Scope:
    """The cgroup(s) of one sandbox; `wrap` makes a command join them before it execs."""

    def __init__(self, limits: CgroupLimits, dirs: dict[str, str], version: int, why_not: str = "") -> None:
        self.limits, self.dirs, self.version, self.why_not = limits, dirs, version, why_not

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run by a shell that first writes its own pid into each cgroup.procs (so nothing starts outside)."""
        if not self.dirs:
            return argv
        joins = " && ".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))}" for d in self.dirs.values())
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "dsgd-cgroup-join"] + argv

    def usage(self) -> Usage:
        """Limits hit so far and peak memory."""
        if not self.dirs:
            return Usage(False, self.why_not)
        u = Usage(True, memory_limit=self.limits.memory_bytes, pids_limit=self.limits.pids)
        if self.version == 2:
            d = self.dirs[""]
            events = _keyed(_read(os.path.join(d, "memory.events")))
            u.oom_kills, u.memory_max_hits = events.get("oom_kill", 0), events.get("max", 0)
            u.memory_peak = int(_read(os.path.join(d, "memory.peak")).strip() or 0)
            u.pids_max_hits = _keyed(_read(os.path.join(d, "pids.events"))).get("max", 0)
        else:
            mem, pids = self.dirs["memory"], self.dirs["pids"]
            u.oom_kills = _keyed(_read(os.path.join(mem, "memory.oom_control"))).get("oom_kill", 0)
            u.memory_max_hits = int(_read(os.path.join(mem, "memory.failcnt")).strip() or 0)
            u.memory_peak = int(_read(os.path.join(mem, "memory.max_usage_in_bytes")).strip() or 0)
            u.pids_max_hits = _keyed(_read(os.path.join(pids, "pids.events"))).get("max", 0)
            u.socket_limit, u.socket_peak = self.limits.socket_bytes, extras.socket_peak(mem, 1)
        return u

    def close(self) -> None:
        """Kill whatever is left in the cgroups, then remove them."""
        for d in self.dirs.values():
            _remove(d)
        self.dirs = {}

    def __enter__(self) -> Scope:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has(d: str, name: str) -> bool:
    return os.path.exists(os.path.join(d, name))


def _remove(d: str, timeout_s: float = 10.0) -> None:
    """Kill every process in cgroup d (cgroup.kill where the kernel has it) and rmdir it."""
    deadline = time.monotonic() + timeout_s
    while os.path.isdir(d):
        try:
            os.rmdir(d)
            return
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                return
        if _has(d, "cgroup.kill"):
            try:
                _write(os.path.join(d, "cgroup.kill"), "1")
            except OSError:
                pass
        for pid in _read(os.path.join(d, "cgroup.procs")).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass
        time.sleep(0.02)


def _v2_parent(mount: str, own: str) -> str:
    """A cgroup under which this grader may make sandbox groups with memory, pids and cpu enabled; raises OSError."""
    want = set(CONTROLLERS)
    for base in dict.fromkeys([os.path.join(mount, own.lstrip("/")), mount]):
        if not want <= set(_read(os.path.join(base, "cgroup.controllers")).split()):
            continue
        try:
            missing = want - set(_read(os.path.join(base, "cgroup.subtree_control")).split())
            if missing:
                _write(os.path.join(base, "cgroup.subtree_control"), " ".join(f"+{c}" for c in sorted(missing)))
            return base
        except OSError:
            continue  # EBUSY: base holds processes and is not the root; EACCES: not delegated to this user
    raise OSError(errno.EACCES, f"cannot enable {', '.join(CONTROLLERS)} below {own or '/'} or the root of {mount}")


@functools.lru_cache(maxsize=1)
def _layout() -> tuple[int, dict[str, str], str]:
    """(2, {"": parent}, "") or (1, {controller: parent}, "") where sandbox groups can be made, else (0, {}, why)."""
    v2_mount, v1_mounts = _mounts()
    v2_own, v1_own = _own_paths()
    why = []
    if v2_mount and v2_own is not None:
        try:
            return 2, {"": _v2_parent(v2_mount, v2_own)}, ""
        except OSError as exc:
            why.append(f"cgroup v2: {exc.strerror}")
    missing = [c for c in CONTROLLERS if c not in v1_mounts]
    if missing:
        why.append(f"cgroup v1: no hierarchy for {', '.join(missing)}")
        return 0, {}, "; ".join(why)
    parents = {c: os.path.join(v1_mounts[c], v1_own.get(c, "/").lstrip("/")) for c in CONTROLLERS}
    for parent in parents.values():
        if not os.access(parent, os.W_OK):
            why.append(f"cgroup v1: {parent} is not writable by uid {os.geteuid()}")
            return 0, {}, "; ".join(why)
    return 1, parents, ""


def available() -> str:
    """'' when per-sandbox cgroups can be made here, else why not."""
    return _layout()[2]


@functools.lru_cache(maxsize=1)
def _io() -> tuple[str | None, str]:
    """(v1 blkio parent or None, why sandboxes get no I/O weight: '' when they get one)."""
    version, parents, _ = _layout()
    if not version:
        return None, "no cgroups"
    mounts, own = _mounts()[1], _own_paths()[1]
    return extras.io_parent(version, parents.get(""), mounts.get("blkio"), own.get("blkio", "/"))


def io_rule() -> str:
    """How I/O is shared between sandboxes here, in words (for grading.json)."""
    why = _io()[1]
    return f"equal weight {extras.IO_WEIGHT} per sandbox" if not why else f"no per-sandbox I/O weight: {why}"


def socket_rule() -> str:
    """How socket memory is bounded per sandbox here, in words (for grading.json)."""
    version, parents, _ = _layout()
    return extras.socket_rule(version, parents.get("memory", parents.get("")))


def sweep() -> None:
    """Remove the groups of graders that died without cleaning up (their pid is in the group's name)."""
    for base in [*_layout()[1].values(), *([_io()[0]] if _io()[0] else [])]:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            pid = name[len(PREFIX):].partition("-")[0]
            if name.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                _remove(os.path.join(base, name))


def open_scope(limits: CgroupLimits) -> Scope:
    """Fresh cgroup(s) for one sandbox with these limits, or a Scope enforcing nothing that says why."""
    version, parents, why = _layout()
    if not version:
        return Scope(limits, {}, 0, why)
    name = f"{PREFIX}{os.getpid()}-{next(_names)}"
    made: dict[str, str] = {}
    try:
        for ctl, base in parents.items():  # flat, beside the grader: each sandbox competes for CPU as a session does
            made[ctl] = os.path.join(base, name)
            os.mkdir(made[ctl])
            _configure(made[ctl], limits, version)
        if _io()[0]:  # v1 with a blkio weight: one more group; v2's io.weight is in the sandbox's one group
            made["blkio"] = os.path.join(_io()[0], name)
            os.mkdir(made["blkio"])
            extras.set_io_weight(made["blkio"], 1)
    except OSError as exc:
        Scope(limits, {c: d for c, d in made.items() if os.path.isdir(d)}, version).close()
        return Scope(limits, {}, 0, f"could not set up the sandbox's cgroup: {exc}")
    return Scope(limits, made, version)


def _configure(d: str, limits: CgroupLimits, version: int) -> None:
    """Write the limits into cgroup d (v2: every controller in one group; v1: the files this hierarchy has)."""
    mem = str(limits.memory_bytes)
    if version == 2:
        _write(os.path.join(d, "memory.max"), mem)
        if _has(d, "memory.swap.max"):
            _write(os.path.join(d, "memory.swap.max"), "0")
        _write(os.path.join(d, "pids.max"), str(limits.pids))
        _write(os.path.join(d, "cpu.weight"), str(limits.cpu_weight))
        if limits.cpu_max:
            _write(os.path.join(d, "cpu.max"), f"{int(limits.cpu_max * 100_000)} 100000")
        if not _io()[1]:
            extras.set_io_weight(d, 2)
        return
    if _has(d, "memory.limit_in_bytes"):
        _write(os.path.join(d, "memory.limit_in_bytes"), mem)
        if _has(d, "memory.memsw.limit_in_bytes"):
            _write(os.path.join(d, "memory.memsw.limit_in_bytes"), mem)  # memory + swap = memory: no swap
        try:
            _write(os.path.join(d, "memory.swappiness"), "0")
        except OSError:
            pass
        extras.set_socket_limit(d, 1, limits.socket_bytes)
    if _has(d, "pids.max"):
        _write(os.path.join(d, "pids.max"), str(limits.pids))
    if _has(d, "cpu.shares"):
        _write(os.path.join(d, "cpu.shares"), str(max(2, limits.cpu_weight * 1024 // 100)))
        if limits.cpu_max:
            _write(os.path.join(d, "cpu.cfs_period_us"), "100000")
            _write(os.path.join(d, "cpu.cfs_quota_us"), str(int(limits.cpu_max * 100_000)))
