"""A seccomp filter for the grading sandbox: no kernel keyrings, no nested user namespaces, no file watches.

bubblewrap installs it (`--seccomp FD`) on the sandbox's first process, so every process inside inherits it and
none can remove it. Denied with EPERM: `add_key`, `request_key` and `keyctl` (so a submission can neither store
keys that outlive its sandbox nor read another's), `unshare` or `clone` asking for CLONE_NEWUSER (a nested user
namespace would give the code uid 0 over private mounts, e.g. a tmpfs outside the sandbox's size cap),
`inotify_add_watch` and `fanotify_init` (a watch on the read-only mounts shared with the host and the other
sandboxes, `/usr` and the Python installation, would show when they open which file), and any other system-call ABI (i386 `int 0x80`,
x32), whose numbers this filter does not check. `clone3`, whose flags a filter cannot read, fails with ENOSYS, so
the C library falls back to `clone`."""

from __future__ import annotations

import errno
import platform
import struct

_LD_ABS, _JEQ, _JGT, _JGE, _JSET, _RET = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_X32_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000
# machine: (AUDIT_ARCH, add_key, keyctl (request_key lies between them), inotify_add_watch, fanotify_init, clone3,
#           unshare, clone)
_TABLES = {"x86_64": (0xC000003E, 248, 250, 254, 300, 435, 272, 56),
           "aarch64": (0xC00000B7, 217, 219, 27, 262, 435, 97, 220)}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter as a classic BPF program (bytes of sock_filter), or None on a machine it has no table for."""
    table = _TABLES.get(machine or platform.machine())
    if table is None:
        return None
    arch, add_key, keyctl, inotify_add_watch, fanotify_init, clone3, unshare, clone = table
    deny, nosys = 15, 16  # indices of the two refusals below
    insns = [
        _insn(_LD_ABS, 4),  # 0: seccomp_data.arch
        _insn(_JEQ, arch, 0, deny - 2),  # 1: another ABI is refused
        _insn(_LD_ABS, 0),  # 2: seccomp_data.nr
        _insn(_JGE, _X32_BIT, deny - 4, 0),  # 3
        _insn(_JGE, add_key, 0, 6 - 5),  # 4: add_key, request_key, keyctl: nr in [add_key, keyctl]
        _insn(_JGT, keyctl, 0, deny - 6),  # 5
        _insn(_JEQ, inotify_add_watch, deny - 7, 0),  # 6: no watches on the shared mounts,
        _insn(_JEQ, fanotify_init, deny - 8, 0),  # 7: neither inotify nor fanotify
        _insn(_JEQ, clone3, nosys - 9, 0),  # 8
        _insn(_JEQ, unshare, 12 - 10, 0),  # 9
        _insn(_JEQ, clone, 12 - 11, 0),  # 10
        _insn(_RET, _ALLOW),  # 11
        _insn(_LD_ABS, 16),  # 12: the low 32 bits of args[0], the flags of unshare and clone
        _insn(_JSET, CLONE_NEWUSER, deny - 14, 0),  # 13
        _insn(_RET, _ALLOW),  # 14
        _insn(_RET, _ERRNO | errno.EPERM),  # 15: deny
        _insn(_RET, _ERRNO | errno.ENOSYS),  # 16: nosys
    ]
    return b"".join(insns)
