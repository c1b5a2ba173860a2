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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pytensor.compile import optdb
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import WalkingGraphRewriter, node_rewriter
from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_default_op_cache_key
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import Reshape
from pytensor.tensor.subtensor import IncSubtensor
from pytensor.tensor.variable import TensorConstant

__all__ = ["DotInto", "products_into_place"]


class DotInto(Op):
    """``flat`` with ``(a @ b).ravel()`` written into ``flat[start:stop]``.

    ``inplace``: written into ``flat`` itself (the rewrite's form, never built by
    hand); otherwise into a copy of it.
    """

    __props__ = ("start", "stop", "inplace")

    def __init__(self, start: int, stop: int, inplace: bool = False) -> None:
        self.start, self.stop, self.inplace = int(start), int(stop), bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

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
        np.dot(a, b, out=flat[self.start:self.stop].reshape(rows, cols))
        output_storage[0][0] = flat


@register_funcify_default_op_cache_key(DotInto)
def _numba_dot_into(op: DotInto, node: Any = None, **kwargs: Any) -> Any:
    start, stop, inplace = op.start, op.stop, op.inplace

    @numba_njit
    def dot_into(flat, a, b):
        rows, cols = a.shape[0], b.shape[1]
        if rows * cols != stop - start:
            raise ValueError("DotInto: the product does not fill its place")
        if not inplace:
            flat = flat.copy()
        np.dot(a, b, flat[start:stop].reshape((rows, cols)))
        return flat

    return dot_into


@node_rewriter([DotInto])
def _dot_into_inplace(fgraph: Any, node: Apply) -> list | bool:
    if node.op.inplace:
        return False
    return [DotInto(node.op.start, node.op.stop, True)(*node.inputs)]


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
