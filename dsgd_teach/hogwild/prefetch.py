"""A cache prefetch hint callable from numba kernels: ask for memory a few updates before it is used.

Hogwild's sparse update waits on memory twice: for the next row, which is at a random place in the data (the
rows are shuffled), and for the few coordinates of `w` it touches, which the other core may have just written
(the cache line must then travel between cores). Asking for both a few rows ahead lets that waiting overlap
with the current update. A prefetch is only a hint: the values used are still read at update time, so results
are bit for bit the same as without it.
"""

from __future__ import annotations

from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: LLVM 15 and later name the intrinsic by an opaque pointer type; older LLVM by the i8* pointee.
_NAME = "llvm.prefetch.p0" if binding.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"
_LOCALITY = 3  # keep in every cache level


def element_pointer(context, builder, signature, args):  # noqa: ANN001, ANN201 - numba codegen arguments
    """LLVM pointer to array[index] for an intrinsic whose first two arguments are (array, index)."""
    array_type = signature.args[0]
    array_struct = context.make_array(array_type)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, array_type, array_struct, [args[1]], wraparound=False)


def _prefetcher(for_write: bool):  # noqa: ANN202 - returns a numba intrinsic
    """An intrinsic `prefetch(array, index)` for reading (for_write=False) or for writing the element."""

    @intrinsic
    def prefetch(typingctx, array, index):  # noqa: ANN001, ANN202 - numba's intrinsic signature
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            address = element_pointer(context, builder, signature, args)
            byte_ptr = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]), _NAME
            )
            # arguments: address, 0 = read / 1 = write, locality 0..3, 1 = data cache
            builder.call(fn, [builder.bitcast(address, byte_ptr), i32(int(for_write)), i32(_LOCALITY), i32(1)])
            return context.get_dummy_value()

        return types.void(array, index), codegen

    return prefetch


prefetch_read = _prefetcher(for_write=False)
prefetch_write = _prefetcher(for_write=True)
