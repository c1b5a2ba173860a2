"""Invalid calls raise TypeError/ValueError in the master before any worker moves.

Each case checks the message, then that every process's shared state is unchanged
and that a valid call afterwards still gives the serial answer.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

from ..conftest import session_fixture
from .test_function import rank_values, set_rank_values


class Model:
    def __init__(self):
        self.W = pytensor.shared(np.ones((4, 3)), name="W")
        self.rows = pytensor.shared(np.zeros((0, 4)), name="rows")
        x, y = pt.dmatrix("x"), pt.dmatrix("y")
        self.f = synk.function(
            [x], [x.dot(self.W).mean(axis=0), (x.sum(axis=1), "gather")], bcast_inputs=[y],
            updates=[(self.W, self.W + y.sum())],
        )
        self.g = synk.function([], (self.rows.sum(), "sum"), sliceable_shareds=[self.rows])
        fixed = pt.tensor("fixed", shape=(2, 2), dtype="float64")
        self.h = synk.function([x], (x.sum() * fixed.sum(), "sum"), bcast_inputs=[fixed])
        synk.distribute()


model = session_fixture(Model, (1, 3))


X = np.arange(40.0).reshape(10, 4)
Y = np.zeros((2, 2))


def bad_calls(m):
    xd = synk.data(X)
    return [
        (TypeError, "takes 2 inputs", lambda: m.f(X, Y, Y)),
        (TypeError, "missing a value for input 1", lambda: m.f(X)),
        (TypeError, "unexpected keyword argument 'z'", lambda: m.f(X, Y, z=1)),
        (TypeError, "multiple values for input 'x'", lambda: m.f(X, Y, x=X)),
        (TypeError, "input 0 \\('x'\\).*dimensions", lambda: m.f(X[0], Y)),
        (TypeError, "input 0 \\('x'\\)", lambda: m.f(X.astype(np.complex128), Y)),
        (TypeError, "expects dtype float64; got a Data of dtype complex",
         lambda: m.f(synk.data(X.astype(np.complex64)), Y)),
        (TypeError, "expects 2 dimensions; got a Data with 1", lambda: m.f(synk.data(X[0]), Y)),
        (ValueError, "batch index 10 is out of range", lambda: m.f(xd, Y, batch=[0, 10])),
        (ValueError, "batch index -11 is out of range", lambda: m.f(xd, Y, batch=[-11])),
        (ValueError, "only step 1", lambda: m.f(xd, Y, batch=slice(0, 4, 2))),
        (ValueError, "batch row count 11 is out of range for 10 rows",
         lambda: m.f(xd, Y, batch=11)),
        (TypeError, "batch", lambda: m.f(xd, Y, batch=2.5)),
        (ValueError, "num_slices must be an integer >= 1; got 0", lambda: m.f(X, Y, num_slices=0)),
        (TypeError, "num_slices must be an integer", lambda: m.f(X, Y, num_slices=1.5)),
        (ValueError, "output_subset index 2 is out of range for 2 outputs",
         lambda: m.f(X, Y, output_subset=[2])),
        (ValueError, "repeated", lambda: m.f(X, Y, output_subset=[0, 0])),
        (ValueError, "batch_s selects rows of sliceable_shareds",
         lambda: m.f(X, Y, batch_s=slice(0, 1))),
        (ValueError, "batch selects rows of scattered inputs", lambda: m.g(batch=3)),
        (ValueError, f"batch_s has 7 selections but there are {synk.n_parallel()} processes",
         lambda: m.g(batch_s=[slice(0, 1)] * 7)),
        (ValueError, "out of range", lambda: m.g(batch_s=[100])),
        (ValueError, "input 1 \\('fixed'\\) has static shape \\(2, 2\\); got a Data of shape "
         "\\(3, 2\\)", lambda: m.h(xd, synk.data(np.zeros((3, 2))))),
        (TypeError, "input 1 \\('fixed'\\)", lambda: m.h(X, np.zeros((3, 2)))),
    ]


def test_invalid_calls_change_nothing(model):
    n = synk.n_parallel()
    set_rank_values(model.rows, [np.ones((2, 4)) * (r + 1) for r in range(n)])
    before = rank_values(model.W)
    for kind, pattern, call in bad_calls(model):
        with pytest.raises(kind, match=pattern):
            call()
    for got in rank_values(model.W):
        np.testing.assert_array_equal(got, before[0])
    want = model.f.as_pytensor(X, Y)
    got = model.f(X, Y)
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1])
    assert model.g() == sum(8.0 * (r + 1) for r in range(n))
    assert model.h(X, np.ones((2, 2))) == model.h.as_pytensor(X, np.ones((2, 2))) == X.sum() * 4


def test_invalid_call_after_a_repeated_one_is_still_caught(model):
    """The shortcut for repeated calls never skips the checks of a different call."""
    xd = synk.data(X)
    fixed = synk.data(np.ones((2, 2)))
    for _ in range(3):
        assert model.h(xd, fixed) == X.sum() * 4
    fixed.set_value(np.ones((3, 2)))
    with pytest.raises(ValueError, match="static shape"):
        model.h(xd, fixed)
    with pytest.raises(TypeError, match="dimensions"):
        model.h(X[0], np.ones((2, 2)))
    fixed.set_value(np.ones((2, 2)))
    assert model.h(xd, fixed) == X.sum() * 4


def test_unequal_scattered_lengths_name_both_inputs(model):
    a, b = pt.dvector("a"), pt.dvector("b")
    h = synk.function([a, b], (a + b).sum())
    with pytest.raises(ValueError, match="got 5 for input 0 \\('a'\\) and 4 for input 1 \\('b'\\)"):
        h(np.ones(5), np.ones(4))


def test_build_errors(model):
    x = pt.dvector("x")
    with pytest.raises(ValueError, match="avg"):
        synk.function([x], (x.sum(), "median"))
    with pytest.raises(ValueError, match="gather"):
        synk.function([x], x.sum(), updates=[(model.W, model.W, "gather")])
    with pytest.raises(TypeError, match="must be a shared variable"):
        synk.function([x], x.sum(), sliceable_shareds=[x])
    with pytest.raises(TypeError, match="inputs\\[0\\] must be a PyTensor variable"):
        synk.function([np.ones(3)], x.sum())
