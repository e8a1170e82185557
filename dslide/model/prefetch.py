"""A cache hint for the kernels: `prefetch_row` asks the CPU to start loading a row of a 2-D
array that a loop will read a few iterations later.

The lazy Adam updates (dslide.model.kernels `rows_grad_adam`, `adam_rows`, `adam_rows_nobias`)
read and write rows of the weights and both moments scattered over arrays far larger than the
caches, and `take_rows` (a step's block of output rows) and `csr_times_rows` (the first layer's
rows of a batch's features) read such rows: each row's first load waits for memory, one row
after another. Asking for the rows a few iterations ahead lets those waits overlap. A hint
changes no value: the kernels compute the same bits with or without it.

It is LLVM's `llvm.prefetch` (read-write, high locality, data cache), which every target numba
supports lowers to its prefetch instruction (or to nothing).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: bytes a prefetch covers (a cache line on every CPU numba targets here)
LINE = 64


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Hint: the cache line holding arr[i, j] (a C-contiguous 2-D array; i, j in bounds)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(i, types.Integer)
            and isinstance(j, types.Integer)):
        return None
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        idx = [context.cast(builder, args[1], signature.args[1], types.intp),
               context.cast(builder, args[2], signature.args[2], types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, idx, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        # rw = 1 (the row is written back), locality = 3 (keep it), cache type = 1 (data)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always")
def prefetch_row(a, r):
    """Hint: every cache line of row r of the C-contiguous 2-D array a (0 <= r < a.shape[0])."""
    step = max(1, LINE // a.itemsize)
    for j in range(0, a.shape[1], step):
        _prefetch(a, r, j)
