"""`python -S -m dsgd_teach.grading.confine CMD...`: install the grading seccomp filter on this process, exec CMD.

Container mode's first step (container.py): with no namespaces to build, the filter of seccomp.py is installed
here with no_new_privs (which an unprivileged process may do), so every process CMD starts inherits it and none
can remove it. Imports nothing beyond the standard library and seccomp.py, so it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

from . import seccomp

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def install_filter() -> None:
    """no_new_privs, then the seccomp program of seccomp.py on this process (inherited by all it starts)."""
    program = seccomp.program()
    if program is None:
        raise OSError("no seccomp filter for this machine's architecture")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HxxxxxxP", len(program) // 8, ctypes.addressof(buf))  # struct sock_fprog
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fbuf, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def main(argv: list[str]) -> None:
    """Install the filter, then exec argv (an absolute path and its arguments)."""
    install_filter()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
