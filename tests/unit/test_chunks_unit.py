"""Unit tests of what a call in chunks rests on (no fork): the check that its updates
add into their variables (``_signature.check_chunked``), ``DotInto``'s adding form (BLAS
``gemm`` with beta = 1, in Python and in Numba), and ``accumulating``, which turns a
training step's gradient into that form."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos._reducers import ReduceOp
from synkhronos._signature import check_chunked
from synkhronos.extensions._dot_into import DotInto, accumulating, products_into_place
from synkhronos.extensions.updates import _offsets, flatten_gradients

AVG = [ReduceOp.AVG]


def test_chunks_is_none_or_a_positive_int():
    assert check_chunked(None, AVG, None, []) == 0
    assert check_chunked(3, AVG, None, []) == 3
    for bad in (0, -1, True, 2.0, "4"):
        with pytest.raises(ValueError, match="an int >= 1"):
            check_chunked(bad, AVG, None, [])


def test_outputs_whose_rows_come_back_in_order_are_refused():
    for op in (ReduceOp.GATHER, ReduceOp.NONE):
        with pytest.raises(ValueError, match="output 1 has op"):
            check_chunked(2, [ReduceOp.SUM, op], None, [])
        check_chunked(2, [ReduceOp.SUM, op], (0,), [])  # left out by output_subset


def test_updates_must_add_into_their_variables():
    acc = pytensor.shared(np.zeros(6), name="acc")
    x = pt.dvector("x")
    adding = [acc + x, x + acc, pt.inc_subtensor(acc[1:3], x[:2]),
              pt.inc_subtensor(pt.inc_subtensor(acc[:2], x[:2])[4:], x[:2]),
              DotInto(0, 6, add=True)(acc, x.reshape((2, 3)).T, pt.eye(2))]
    for value in adding:
        check_chunked(2, AVG, None, [(acc, value)])
    other = pytensor.shared(np.zeros(6), name="other")
    setting = [x, acc * x, other + x, pt.set_subtensor(acc[1:3], x[:2]),
               pt.inc_subtensor(other[1:3], x[:2]), DotInto(0, 6)(acc, x.reshape((2, 3)).T,
                                                                  pt.eye(2))]
    for value in setting:
        with pytest.raises(ValueError, match="does not add into it"):
            check_chunked(2, AVG, None, [(acc, value)])


@pytest.mark.parametrize("mode", ["FAST_RUN", "NUMBA"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dot_into_adds_in_place_whatever_the_operands_layout(mode, dtype):
    """``flat[3:15] += a @ b`` for a 3 x 5 and a 5 x 4 operand, each given as it is
    (C order) or as the transpose of an input (F order)."""
    rng = np.random.default_rng(0)
    start = np.arange(20, dtype=dtype)
    flat = pytensor.shared(start.copy())
    tol = 1e-5 if dtype == "float32" else 1e-12
    for a_t in (False, True):
        for b_t in (False, True):
            a, b = pt.matrix("a", dtype=dtype), pt.matrix("b", dtype=dtype)
            av = rng.normal(size=(5, 3) if a_t else (3, 5)).astype(dtype)
            bv = rng.normal(size=(4, 5) if b_t else (5, 4)).astype(dtype)
            f = pytensor.function([a, b], [], mode=mode, updates=[(flat, DotInto(3, 15, add=True)(
                flat, a.T if a_t else a, b.T if b_t else b))])
            flat.set_value(start.copy())
            f(av, bv)
            want = start.copy()
            want[3:15] += ((av.T if a_t else av) @ (bv.T if b_t else bv)).ravel()
            np.testing.assert_allclose(flat.get_value(), want, rtol=tol, atol=tol,
                                       err_msg=f"a.T {a_t}, b.T {b_t}")
            assert any(isinstance(node.op, DotInto) and node.op.inplace
                       for node in f.maker.fgraph.toposort())


def test_accumulating_adds_every_piece_of_a_step_gradient():
    rng = np.random.default_rng(1)
    params = [pytensor.shared(rng.normal(size=(4, 3)), name="W"),
              pytensor.shared(rng.normal(size=3), name="b")]
    x = pt.dmatrix("x")
    loss = (pt.tanh(x @ params[0] + params[1]) ** 2).mean()
    flat, grad_shared = flatten_gradients(loss, params)
    into_place = products_into_place(flat, grad_shared, _offsets(params))
    for expression in (flat, into_place):
        added = accumulating(expression, grad_shared, _offsets(params))
        f = pytensor.function([x], [], updates=[(grad_shared, added)])
        plain = pytensor.function([x], flat)
        grad_shared.set_value(np.zeros(15))
        xs = rng.normal(size=(6, 4))
        f(xs[:2])
        f(xs[2:])
        np.testing.assert_allclose(grad_shared.get_value(),
                                   plain(xs[:2]) + plain(xs[2:]), rtol=1e-12)
    added = accumulating(into_place, grad_shared, _offsets(params))
    assert isinstance(added.owner.op, DotInto) or any(
        isinstance(var.owner.op, DotInto) and var.owner.op.add
        for var in pytensor.graph.traversal.ancestors([added]) if var.owner is not None)


def test_accumulating_a_rule_of_another_form():
    grad_shared = pytensor.shared(np.zeros(3), name="grad_shared")
    x = pt.dvector("x")
    added = accumulating(x * 2, grad_shared, [(0, 3, (3,))])
    f = pytensor.function([x], [], updates=[(grad_shared, added)])
    f(np.ones(3))
    f(np.ones(3))
    np.testing.assert_allclose(grad_shared.get_value(), 4.0)
    with pytest.raises(ValueError, match="reads grad_shared"):
        accumulating(grad_shared * x, grad_shared, [(0, 3, (3,))])
