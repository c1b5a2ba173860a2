"""DotInto: a weight's gradient written straight into its place of the flat gradient.

``products_into_place`` against ``flatten_gradients``'s own expression, compiled in the
same mode: bit for bit the same vector, the weights' pieces written by ``DotInto``
(in place where the mode updates in place, copying where it does not), the biases'
and anything else left to ``set_subtensor``; an expression of another form returned
as it is.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions._dot_into import DotInto, products_into_place
from synkhronos.extensions._sharded import in_place
from synkhronos.extensions.updates import _offsets, flatten_gradients

rng = np.random.default_rng(5)


def _model():
    x = pt.matrix("x")
    w1 = pytensor.shared(rng.standard_normal((6, 5)), name="w1")
    b1 = pytensor.shared(rng.standard_normal(5), name="b1")
    w2 = pytensor.shared(rng.standard_normal((5, 3)), name="w2")
    loss = (pt.tanh(x @ w1 + b1) @ w2).sum() ** 2 / 10.0
    return x, [w1, b1, w2], loss


def _dot_intos(fn) -> list[DotInto]:
    return [node.op for node in fn.maker.fgraph.toposort() if isinstance(node.op, DotInto)]


@pytest.mark.parametrize("inplace", [True, False], ids=["in-place", "copying"])
def test_products_are_written_into_their_places_bit_for_bit(inplace):
    x, params, loss = _model()
    flat, grad_shared = flatten_gradients(loss, params)
    into = products_into_place(flat, grad_shared, _offsets(params))
    assert into is not flat
    mode = pytensor.compile.mode.get_default_mode()
    if not inplace:
        mode = mode.excluding("inplace")
    want_fn = pytensor.function([x], [], updates=[(grad_shared, flat)], mode=mode)
    got_fn = pytensor.function([x], [], updates=[(grad_shared, into)], mode=mode)
    ops = _dot_intos(got_fn)
    assert [(op.start, op.stop) for op in ops] == [(0, 30), (35, 50)]  # w1 and w2, not b1
    assert all(op.inplace == inplace for op in ops)
    data = rng.standard_normal((7, 6))
    want_fn(data)
    want = grad_shared.get_value().copy()
    grad_shared.set_value(np.full_like(want, np.nan))
    got_fn(data)
    np.testing.assert_array_equal(grad_shared.get_value(), want)


def test_other_expressions_are_left_as_they_are():
    x, params, loss = _model()
    flat, grad_shared = flatten_gradients(loss, params)
    assert products_into_place(flat, grad_shared, _offsets(params[:2])) is flat
    other = pytensor.shared(np.zeros(50), name="other")
    assert products_into_place(flat, other, _offsets(params)) is flat
    summed = pt.concatenate([g.ravel() for g in pytensor.grad(loss, params)])
    assert products_into_place(summed, grad_shared, _offsets(params)) is summed


def test_a_product_that_does_not_fill_its_place_raises():
    flat, a, b = pt.vector("flat"), pt.matrix("a"), pt.matrix("b")
    fn = pytensor.function([flat, a, b], DotInto(2, 8)(flat, a, b))
    np.testing.assert_array_equal(fn(np.zeros(10), np.ones((2, 1)), np.ones((1, 3))),
                                  [0, 0, 1, 1, 1, 1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="does not fill its place"):
        fn(np.zeros(10), np.ones((2, 1)), np.ones((1, 2)))


def test_used_only_where_values_are_updated_in_place():
    """make_train_function puts DotInto in the gradient where ``in_place``: on the CPU,
    outside the JAX backend, seen in the mode given or in PyTensor's default one
    (nothing is compiled here)."""
    synk.fork(1)
    try:
        assert in_place({}) == (pytensor.config.mode != "JAX")
        assert in_place({"mode": "NUMBA"})
        assert not in_place({"mode": "JAX"})
        assert not in_place({"mode": pytensor.compile.mode.get_mode("JAX")})
    finally:
        synk.close()
