"""Taking turns through shared memory, for the round-robin baseline: whose turn it is, passed on after each update.

In the round-robin scheme (Langford, Smola and Zinkevich 2009; a baseline in Recht et al. 2011) the workers
update the shared vector one after another in a fixed cyclic order. Here a `turn` cell in the shared block holds
the rank allowed to write; a worker waits until it reads its own rank, makes one update, and stores the next
rank. The load is an atomic acquire and the store an atomic release, so every write to `w` made before passing
the turn is visible to the worker that receives it, and the compiler can neither hoist the load out of the wait
loop nor move the writes past the store. A rank that has made its last update marks itself `done` before passing
on, and is skipped from then on. An `abort` cell, set by a worker that stops or fails (or by the driver when a
run ends), releases everyone who is waiting.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .prefetch import element_pointer

#: Spins of the wait loop before it starts giving the core away with sched_yield between looks.
SPINS_BEFORE_YIELD = 256


@intrinsic
def load_acquire(typingctx, array, index):  # noqa: ANN001, ANN201, ARG001 - numba's intrinsic signature
    """array[index] (int64), read with acquire ordering."""
    if not isinstance(array, types.Array) or array.dtype != types.int64:
        return None  # not typed for other arrays: numba reports the mismatch

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        return builder.load_atomic(element_pointer(context, builder, signature, args), "acquire", 8)

    return types.int64(array, index), codegen


@intrinsic
def store_release(typingctx, array, index, value):  # noqa: ANN001, ANN201, ARG001
    """array[index] = value (int64), written with release ordering."""
    if not isinstance(array, types.Array) or array.dtype != types.int64:
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        builder.store_atomic(args[2], element_pointer(context, builder, signature, args), "release", 8)
        return context.get_dummy_value()

    return types.void(array, index, types.int64), codegen


@intrinsic
def sched_yield(typingctx):  # noqa: ANN001, ANN201, ARG001
    """Let another runnable thread have this core (POSIX sched_yield), linked by name so kernels can be cached."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        return builder.call(fn, [])

    return types.int32(), codegen


@njit(nogil=True, cache=True, inline="always")
def wait_turn(turn, abort, rank):  # noqa: ANN001, ANN201 - numba types
    """Wait until turn[0] == rank; False if abort[0] was set meanwhile (stop, failure or the run's end)."""
    spins = 0
    while load_acquire(turn, 0) != rank:
        if load_acquire(abort, 0) != 0:
            return False
        spins += 1
        if spins > SPINS_BEFORE_YIELD:
            sched_yield()
    return True


@njit(nogil=True, cache=True, inline="always")
def pass_turn(turn, done, rank):  # noqa: ANN001, ANN201
    """Hand the turn to the next rank, in cyclic order, that has updates left (back to rank if none has)."""
    world = len(done)
    nxt = (rank + 1) % world
    while nxt != rank and load_acquire(done, nxt) != 0:
        nxt = (nxt + 1) % world
    store_release(turn, 0, nxt)


@njit(nogil=True, cache=True, inline="always")
def finish_turns(done, rank):  # noqa: ANN001, ANN201
    """Mark rank as having no updates left (called while it holds the turn, just before passing it)."""
    store_release(done, rank, 1)
