"""A weight matrix's gradient computed straight into its place of the flat gradient.

This module owns ``DotInto``, the matrix product ``a @ b`` written into a slice of a
flat vector, and ``products_into_place``, which puts it in a training step's
gradient expression. A weight's gradient is a matrix product (``x.T @ delta``);
written by ``set_subtensor`` into its place of ``grad_shared`` (the exchange slot, see
:func:`~synkhronos.extensions.updates.flatten_gradients`) it is first a new array,
then copied: for the MLP of ``benchmarks/scaling.py`` (1.86 M float32) the copy and the
allocation took about 1 ms of a 31 ms gradient call on the Numba backend. ``DotInto``
hands BLAS the slot itself as the product's output.

In a graph ``DotInto`` returns a new vector (PyTensor takes no in-place operation in a
graph it compiles); the rewrite registered here with PyTensor's in-place ones
(``"inplace"``, as ``set_subtensor``'s) makes it write into its input, which is the
update of ``grad_shared``. Implemented for the C backend (``perform``: numpy's ``dot``
with ``out=``) and Numba (the same in a jitted function); the JAX backend never sees
it (``products_into_place`` is used only where values are updated in place).

``DotInto(..., add=True)`` adds the product into its place instead (BLAS ``gemm``
with ``beta = 1``, called on the slot itself: no product array, no second pass), and
``accumulating`` turns a step's gradient expression into that form: the gradient of
a chunk of rows added into ``grad_shared``, as a step in chunks
(``make_train_function(..., chunks=...)``) runs it once per chunk a process takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.compile import optdb
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import WalkingGraphRewriter, node_rewriter
from pytensor.graph.traversal import ancestors
from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_default_op_cache_key
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import Reshape
from pytensor.tensor.subtensor import IncSubtensor
from pytensor.tensor.variable import TensorConstant

__all__ = ["DotInto", "products_into_place", "accumulating"]


class DotInto(Op):
    """``flat`` with ``(a @ b).ravel()`` written into ``flat[start:stop]`` (``add``:
    added to what is there).

    ``inplace``: written into ``flat`` itself (the rewrite's form, never built by
    hand); otherwise into a copy of it.
    """

    __props__ = ("start", "stop", "inplace", "add")

    def __init__(self, start: int, stop: int, inplace: bool = False, add: bool = False) -> None:
        self.start, self.stop, self.inplace = int(start), int(stop), bool(inplace)
        self.add = bool(add)
        self.destroy_map = {0: [0]} if self.inplace else {}
        # (read by the check that a chunked call's updates add into their variables)
        self.adds_into = 0 if self.add else None

    def make_node(self, flat, a, b):
        return Apply(self, [flat, a, b], [flat.type()])

    def perform(self, node, inputs, output_storage):
        flat, a, b = inputs
        rows, cols = a.shape[0], b.shape[1]
        if rows * cols != self.stop - self.start:
            raise ValueError(f"DotInto: a product of {rows} x {cols} does not fill its "
                             f"place [{self.start}:{self.stop}]")
        if not self.inplace:
            flat = flat.copy()
        place = flat[self.start:self.stop].reshape(rows, cols)
        if self.add:
            _gemm_add(place, a, b)
        else:
            np.dot(a, b, out=place)
        output_storage[0][0] = flat


def _blas_operand(m: np.ndarray) -> tuple[np.ndarray, int]:
    """``m.T`` as BLAS (column-major) reads it: ``(array, transpose)``, without a copy
    where ``m`` is C- or F-contiguous."""
    if m.flags.c_contiguous:
        return m.T, 0  # m.T is F-contiguous: BLAS reads it as it is
    if m.flags.f_contiguous:
        return m, 1
    return np.ascontiguousarray(m).T, 0


def _gemm_add(place: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``place += a @ b`` in place, ``place`` C-contiguous (SciPy's BLAS ``gemm``:
    column-major, so it computes ``place.T += b.T @ a.T``)."""
    from scipy.linalg.blas import get_blas_funcs

    gemm = get_blas_funcs("gemm", (place,))
    first, trans_first = _blas_operand(b)
    second, trans_second = _blas_operand(a)
    out = gemm(1.0, first, second, beta=1.0, c=place.T, trans_a=trans_first,
               trans_b=trans_second, overwrite_c=1)
    if not np.shares_memory(out, place):  # (SciPy copied: a layout it would not take)
        place[...] = out.T


def _numba_blas(name: str, function_type: Any) -> Any:
    """A jitted function that returns SciPy's BLAS routine ``name`` (``"dgemm"``) as a
    callable of ``function_type`` (a ``numba.types.FunctionType``), for use inside
    other jitted functions.

    Through PyTensor's own cache of such pointers (its LAPACK Ops use it), a function
    that calls it can still be cached on disk by Numba, as every other part of a
    compiled graph is; where this PyTensor has no such cache, the pointer is a
    constant of the function, which then compiles in each process (Numba's warning
    that it cannot cache it is silenced: it says nothing the user can act on).
    """
    import warnings

    import numba
    from numba import types
    from numba.core.errors import NumbaWarning
    from numba.core.extending import get_cython_function_address

    address = get_cython_function_address("scipy.linalg.cython_blas", name)
    try:
        from pytensor.link.numba.cache import _call_cached_ptr
    except ImportError:
        _call_cached_ptr = None
    if _call_cached_ptr is not None:
        @numba.njit
        def pointer():
            with numba.objmode(ptr=types.intp):
                ptr = get_cython_function_address("scipy.linalg.cython_blas", name)
            return ptr

        key = f"synkhronos.scipy.blas.{name}"

        @numba.njit(cache=True)
        def routine():
            return _call_cached_ptr(get_ptr_func=pointer, func_type_ref=function_type,
                                    unique_func_name_lit=key)

        return routine
    import ctypes

    arguments = [ctypes.c_void_p] * len(function_type.signature.args)
    found = ctypes.CFUNCTYPE(None, *arguments)(address)
    warnings.filterwarnings("ignore", message="Cannot cache compiled function",
                            category=NumbaWarning)

    @numba.njit
    def constant():
        return found

    return constant


def _numba_gemm_add(dtype: np.dtype) -> Any:
    """A jitted ``place += a @ b`` for ``dtype`` (float32 or float64), through SciPy's
    BLAS ``gemm`` with ``beta = 1`` on ``place`` itself, as ``_gemm_add``."""
    from numba import types

    scalar = types.float32 if dtype == np.float32 else types.float64
    ints, floats = types.CPointer(types.int32), types.CPointer(scalar)
    routine = _numba_blas("sgemm" if dtype == np.float32 else "dgemm",
                                   types.FunctionType(types.void(
                                       ints, ints, ints, ints, ints, floats, floats, ints,
                                       floats, ints, floats, floats, ints)))
    size = np.dtype(dtype).itemsize
    one = 78  # "N"; 84: "T"

    @numba_njit
    def operand(m):  # m.T as column-major: (array, "N" or "T", leading dimension)
        if m.strides[1] == size and m.strides[0] >= m.shape[1] * size:
            return m, one, m.strides[0] // size
        if m.strides[0] == size and m.strides[1] >= m.shape[0] * size:
            return m, 84, m.strides[1] // size
        return np.ascontiguousarray(m), one, m.shape[1]

    @numba_njit
    def gemm_add(place, a, b):
        first, trans_first, ld_first = operand(b)
        second, trans_second, ld_second = operand(a)
        ints = np.empty(8, np.int32)
        ints[0], ints[1] = trans_first, trans_second
        ints[2], ints[3], ints[4] = b.shape[1], a.shape[0], a.shape[1]
        ints[5], ints[6], ints[7] = ld_first, ld_second, b.shape[1]
        scalars = np.ones(2, place.dtype)
        gemm = routine()
        gemm(ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes, ints[3:].ctypes,
             ints[4:].ctypes, scalars.ctypes, first.ctypes, ints[5:].ctypes,
             second.ctypes, ints[6:].ctypes, scalars[1:].ctypes, place.ctypes,
             ints[7:].ctypes)

    return gemm_add


@numba_njit
def _numba_dot_set(place, a, b):
    np.dot(a, b, place)


@register_funcify_default_op_cache_key(DotInto)
def _numba_dot_into(op: DotInto, node: Any = None, **kwargs: Any) -> Any:
    start, stop, inplace = op.start, op.stop, op.inplace
    if op.add:
        dtype = np.dtype(node.outputs[0].type.dtype if node is not None else "float64")
        write = _numba_gemm_add(dtype)
    else:
        write = _numba_dot_set

    @numba_njit
    def dot_into(flat, a, b):
        rows, cols = a.shape[0], b.shape[1]
        if rows * cols != stop - start:
            raise ValueError("DotInto: the product does not fill its place")
        if not inplace:
            flat = flat.copy()
        write(flat[start:stop].reshape((rows, cols)), a, b)
        return flat

    return dot_into


@node_rewriter([DotInto])
def _dot_into_inplace(fgraph: Any, node: Apply) -> list | bool:
    if node.op.inplace:
        return False
    return [DotInto(node.op.start, node.op.stop, True, node.op.add)(*node.inputs)]


# beside set_subtensor's own in-place rewrite (position 50.1), with the same fallback:
# where the graph forbids it (another reader of the vector), the copying form stays
optdb.register("synkhronos_dot_into_inplace",
               WalkingGraphRewriter(_dot_into_inplace,
                                    failure_callback=WalkingGraphRewriter.warn_inplace),
               "fast_run", "inplace", position=50.2)


def _product(value: Variable) -> tuple[Variable, Variable] | None:
    """``(a, b)`` if ``value`` is ``(a @ b).ravel()`` of two matrices, else None."""
    reshape = value.owner
    if reshape is None or not isinstance(reshape.op, Reshape):
        return None
    shape = reshape.inputs[1]
    if not (isinstance(shape, TensorConstant) and shape.data.tolist() == [-1]):
        return None
    product = reshape.inputs[0]
    node = product.owner
    if (node is None or product.ndim != 2
            or getattr(product.type, "dtype", None) != getattr(value.type, "dtype", 0)):
        return None
    op = node.op.core_op if isinstance(node.op, Blockwise) else node.op
    if not (isinstance(op, Dot) or type(op).__name__ == "Matmul"):
        return None
    if len(node.inputs) != 2 or any(var.ndim != 2 for var in node.inputs):
        return None
    return node.inputs[0], node.inputs[1]


def _bounds(node: Apply) -> list:
    """The constant bounds of a ``set_subtensor``'s slice (``[stop]`` from 0)."""
    return [getattr(var, "data", None) for var in node.inputs[2:]]


def products_into_place(flat: Variable, grad_shared: Variable,
                        pieces: list[tuple[int, int, Any]]) -> Variable:
    """``flat`` with every piece that is a matrix product written by ``DotInto``.

    ``flat`` is :func:`~synkhronos.extensions.updates.flatten_gradients`'s expression:
    ``grad_shared`` with one ``set_subtensor`` per parameter, at ``pieces``'s
    ``(start, stop, shape)`` in order. Any other expression (a rule of the user's own)
    is returned as it is.
    """
    chain: list[Apply] = []
    node = flat.owner
    while (node is not None and isinstance(node.op, IncSubtensor)
           and node.op.set_instead_of_inc and len(chain) < len(pieces)):
        chain.append(node)
        node = node.inputs[0].owner
    chain.reverse()
    if len(chain) != len(pieces) or chain[0].inputs[0] is not grad_shared:
        return flat
    out = grad_shared
    for node, (start, stop, _) in zip(chain, pieces, strict=True):
        product = _product(node.inputs[1])
        if product is None or _bounds(node) not in ([start, stop], [stop] if start == 0 else []):
            out = node.op.make_node(out, *node.inputs[1:]).outputs[0]
        else:
            out = DotInto(start, stop)(out, *product)  # type: ignore[assignment]
    return out


def accumulating(flat: Variable, grad_shared: Variable,
                 pieces: list[tuple[int, int, Any]]) -> Variable:
    """``flat`` (a step's gradient into ``grad_shared``: ``products_into_place``'s
    expression, or ``flatten_gradients``'s) with every piece added into
    ``grad_shared`` instead of set: ``grad_shared + gradient``, each product by BLAS
    with ``beta = 1``, each other piece by ``inc_subtensor``.

    An expression of another form (a rule of the user's own) becomes
    ``grad_shared + flat`` where ``flat`` does not read ``grad_shared``; one that does
    raises ``ValueError`` (its sum over chunks would not be the gradient).
    """
    chain: list[Apply] = []
    node = flat.owner
    while (node is not None and len(chain) < len(pieces)
           and ((isinstance(node.op, IncSubtensor) and node.op.set_instead_of_inc)
                or (isinstance(node.op, DotInto) and not node.op.add))):
        chain.append(node)
        node = node.inputs[0].owner
    chain.reverse()
    if len(chain) == len(pieces) and chain[0].inputs[0] is grad_shared:
        out: Any = grad_shared
        for node, (start, stop, _) in zip(chain, pieces, strict=True):
            if isinstance(node.op, DotInto):
                out = DotInto(start, stop, add=True)(out, *node.inputs[1:])
            else:
                out = pt.inc_subtensor(out[start:stop], node.inputs[1])
        return out
    if any(var is grad_shared for var in ancestors([flat])):
        raise ValueError("the update rule's gradient expression reads grad_shared other than "
                         "by setting its pieces, so it cannot be added chunk by chunk")
    return grad_shared + flat  # type: ignore[operator]

