"""The package-level name of the reduction kernels (``_runtime/reducers.py``).

The kernels live in ``_runtime`` so that the MPI layer (``_machines/mpi/exchange.py``)
folds values between machines with the same ufunc table as one machine does, without
importing from the package above it. The layers above import them from here.
"""

from ._runtime.reducers import (
    Accumulator,
    ReduceOp,
    combine_into,
    combined,
    parse_op,
    reduce_one,
    reduce_pairs,
    reduce_values,
    ufunc_of,
)

__all__ = ["Accumulator", "ReduceOp", "combine_into", "combined", "parse_op",
           "reduce_one", "reduce_pairs", "reduce_values", "ufunc_of"]
