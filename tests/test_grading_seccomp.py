"""The sandbox's seccomp filter: no kernel keyrings, no nested user namespaces; threads and fork still work."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from dsgd_teach.grading import bubblewrap, seccomp

needs_sandbox = pytest.mark.skipif(bool(bubblewrap.probe()), reason=f"no OS sandbox here: {bubblewrap.probe()}")
INSIDE = textwrap.dedent('''\
    import ctypes, json, os, sys, threading
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    def result(name, value):
        out[name] = "ok" if value >= 0 else os.strerror(ctypes.get_errno())
    result("add_key", libc.syscall(248, b"user", b"dsgd-keyring-probe", b"answers", 7, ctypes.c_int(-4)))
    result("keyctl", libc.syscall(250, 0, ctypes.c_int(-4), 0))  # KEYCTL_GET_KEYRING_ID of the user keyring
    result("unshare_user", libc.unshare(0x10000000))
    t = threading.Thread(target=lambda: out.__setitem__("thread", "ran"))
    t.start()
    t.join()
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os.write(int(sys.argv[-1]), json.dumps(out).encode())
''')


@needs_sandbox
@pytest.mark.skipif(seccomp.program() is None, reason="no seccomp table for this machine")
def test_no_keyring_and_no_nested_user_namespace_inside():
    out = bubblewrap.run([sys.executable, "-c", INSIDE], b"", 60)
    report = json.loads(out.result)
    denied = "Operation not permitted"
    assert report == {"add_key": denied, "keyctl": denied, "unshare_user": denied, "thread": "ran", "fork": 7}
    with open("/proc/keys") as fh:
        assert "dsgd-keyring-probe" not in fh.read()


def test_the_filter_is_a_well_formed_program():
    for machine in ("x86_64", "aarch64"):
        prog = seccomp.program(machine)
        assert prog is not None and len(prog) % 8 == 0 and len(prog) // 8 == 17
    assert seccomp.program("sparc") is None
