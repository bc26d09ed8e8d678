"""A process-shared, robust pthread mutex living inside a shared-memory block, callable from numba kernels.

The locked baseline takes this mutex around every single update. A POSIX mutex initialised with
PTHREAD_PROCESS_SHARED works across the dask worker processes that map the block, sleeps in the kernel when
contended (no spinning on an oversubscribed machine), and, being robust, is recovered when its holder dies.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: Bytes reserved for the mutex at the start of a block (glibc needs 40, macOS 64).
MUTEX_BYTES = 128
PTHREAD_PROCESS_SHARED = 1
PTHREAD_MUTEX_ROBUST = 1
EOWNERDEAD = getattr(errno, "EOWNERDEAD", 130)


def _load_libc() -> ctypes.CDLL | None:
    """The C library, or None where it has no pthread mutexes (Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        libc.pthread_mutex_lock  # noqa: B018 - probe that the symbol exists
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_libc = _load_libc()
HAVE_MUTEX = _libc is not None


def _extern_call(symbol: str):  # noqa: ANN202 - returns a numba intrinsic
    """A numba intrinsic calling the C function `int symbol(void *)` by name.

    The call is linked by symbol name, not through a ctypes pointer baked into the code, so kernels using it can
    be cached by numba (a ctypes pointer is a "dynamic global" and would force recompiling in every process).
    """

    @intrinsic
    def call(typingctx, address):  # noqa: ANN001, ANN202, ARG001 - numba's intrinsic signature
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
            voidp = ir.IntType(8).as_pointer()
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [voidp]), symbol)
            return builder.call(fn, [builder.inttoptr(args[0], voidp)])

        return types.int32(types.uint64), codegen

    return call


mutex_lock = _extern_call("pthread_mutex_lock")
mutex_unlock = _extern_call("pthread_mutex_unlock")
mutex_consistent = _extern_call("pthread_mutex_consistent")
#: Robust mutexes (Linux): a lock whose holder died is handed on with EOWNERDEAD instead of blocking forever.
ROBUST = _libc is not None and hasattr(_libc, "pthread_mutexattr_setrobust") and hasattr(_libc, "pthread_mutex_consistent")


if ROBUST:

    @njit(nogil=True, cache=True)
    def acquire(address):  # noqa: ANN001, ANN201
        """Lock; if the previous holder died mid-update, mark the mutex consistent and carry on."""
        if mutex_lock(address) == EOWNERDEAD:
            mutex_consistent(address)

else:

    @njit(nogil=True, cache=True)
    def acquire(address):  # noqa: ANN001, ANN201
        """Lock."""
        mutex_lock(address)


def init_mutex(address: int) -> None:
    """Initialise a process-shared (and, where supported, robust) mutex at address (zeroed memory)."""
    if _libc is None:
        raise RuntimeError("the locked variant needs POSIX pthread mutexes, which this platform lacks")
    attr = ctypes.create_string_buffer(64)
    check = [
        _libc.pthread_mutexattr_init(attr),
        _libc.pthread_mutexattr_setpshared(attr, PTHREAD_PROCESS_SHARED),
    ]
    if ROBUST:
        check.append(_libc.pthread_mutexattr_setrobust(attr, PTHREAD_MUTEX_ROBUST))
    check.append(_libc.pthread_mutex_init(ctypes.c_void_p(address), attr))
    _libc.pthread_mutexattr_destroy(attr)
    if any(check):
        raise OSError(f"pthread mutex initialisation failed (return codes {check})")


def destroy_mutex(address: int) -> None:
    """Release the mutex's resources (before the block is unmapped)."""
    if _libc is not None:
        _libc.pthread_mutex_destroy(ctypes.c_void_p(address))
