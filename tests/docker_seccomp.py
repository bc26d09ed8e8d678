"""`python tests/docker_seccomp.py CMD...`: run CMD with namespaces denied as Docker's default seccomp profile
denies them to a container without CAP_SYS_ADMIN (unshare, setns, mount, clone with a CLONE_NEW* flag; clone3
answers ENOSYS so the C library falls back to clone). x86-64 only; elsewhere CMD runs unfiltered."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
UNSHARE, SETNS, MOUNT, CLONE3, CLONE = 272, 308, 165, 435, 56


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes:
    """The classic-BPF filter: deny (EPERM) namespace creation and mounts, clone3 ENOSYS, allow the rest."""
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, deny, nosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    return b"".join([
        _insn(ld, 4), _insn(jeq, 0xC000003E, 0, 7),  # 0-1: another ABI: allow (at 9)
        _insn(ld, 0),  # 2
        _insn(jeq, UNSHARE, 9, 0), _insn(jeq, SETNS, 8, 0), _insn(jeq, MOUNT, 7, 0),  # 3-5: deny (at 13)
        _insn(jeq, CLONE3, 7, 0),  # 6: nosys (at 14)
        _insn(jeq, CLONE, 2, 0),  # 7: flags check (at 10)
        _insn(ret, allow),  # 8
        _insn(ret, allow),  # 9
        _insn(ld, 16), _insn(jset, NAMESPACE_FLAGS, 1, 0),  # 10-11
        _insn(ret, allow),  # 12
        _insn(ret, deny),  # 13
        _insn(ret, nosys),  # 14
    ])


def install() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    prog = program()
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxP", len(prog) // 8, ctypes.addressof(buf)), 16)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, fprog, 0, 0):
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter")


if __name__ == "__main__":
    if platform.machine() == "x86_64":
        install()
    os.execvp(sys.argv[1], sys.argv[1:])
