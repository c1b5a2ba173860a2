"""Property-based fuzzing of function calls.

Invalid calls: each must raise TypeError or ValueError in the master without waking
any worker (the control block's command counter does not move) and without
changing any process's shared state. Valid calls with random shapes, batches and
slice counts must equal the plain PyTensor function on the selected rows.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import synkhronos as synk
from synkhronos import session as synk_session

from ..conftest import session_fixture
from ..integration.test_function import rank_values

ROWS = 12


class Model:
    def __init__(self):
        self.counter = pytensor.shared(np.zeros(3), name="counter")
        self.rows = pytensor.shared(np.zeros((0, 3)), name="rows")
        x, t, y = pt.dmatrix("x"), pt.dmatrix("t"), pt.dmatrix("y")
        z = (x + t).dot(y)
        self.f = synk.function(
            [x, t],
            [z.mean(axis=0), (z.sum(axis=0), "sum"), (z.max(), "max"), (z.sum(axis=1), None)],
            bcast_inputs=[y],
            updates=[(self.counter, self.counter + 1)],
        )
        self.g = synk.function([], (self.rows.sum(), "sum"), sliceable_shareds=[self.rows])
        synk.distribute()
        rng = np.random.default_rng(3)
        self.x = synk.data(rng.normal(size=(ROWS, 3)))
        self.t = synk.data(rng.normal(size=(ROWS, 3)))
        self.y = rng.normal(size=(3, 2))


model = session_fixture(Model, (1, 3))


def _arrays(shape, dtype="float64"):
    return np.ones(shape, dtype=dtype)


bad_batch = st.one_of(
    st.integers(min_value=ROWS + 1, max_value=10**6),
    st.integers(max_value=-1),
    st.floats(allow_nan=True),
    st.booleans().map(lambda b: [b]),
    st.lists(st.integers(min_value=ROWS, max_value=10**6), min_size=1, max_size=5),
    st.lists(st.integers(max_value=-ROWS - 1), min_size=1, max_size=5),
    st.integers(min_value=2, max_value=9).map(lambda step: slice(0, ROWS, step)),
    st.just(np.zeros((2, 2), dtype=np.int64)),
    st.just(np.array([0.5, 1.5])),
    st.text(max_size=3),
)
bad_slices = st.one_of(
    st.integers(max_value=0), st.floats(allow_nan=True), st.just(None), st.just("2")
)
bad_subset = st.one_of(
    st.lists(st.integers(min_value=4, max_value=100), min_size=1, max_size=3),
    st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
    st.just([0, 0]),
    st.just([1.0]),
    st.just(3),
)


@st.composite
def invalid_calls(draw):
    kind = draw(st.sampled_from(
        ["count", "ndim", "dtype", "lengths", "batch", "slices", "subset", "keyword",
         "batch_s_without_sliceable", "batch_s_length", "batch_without_scattered"]
    ))
    return kind, draw(st.data())


def _make_call(model, kind, data):
    f, x, t, y = model.f, model.x, model.t, model.y
    n = synk.n_parallel()
    if kind == "count":
        extra = data.draw(st.integers(min_value=1, max_value=3))
        return lambda: f(x, t, y, *([y] * extra))
    if kind == "ndim":
        ndim = data.draw(st.sampled_from([0, 1, 3]))
        return lambda: f(_arrays((ROWS,) * ndim), t, y)
    if kind == "dtype":
        dtype = data.draw(st.sampled_from(["complex128", "complex64", "U3"]))
        return lambda: f(_arrays((ROWS, 3), dtype), t, y)
    if kind == "lengths":
        other = data.draw(st.integers(min_value=0, max_value=40).filter(lambda v: v != ROWS))
        return lambda: f(x, _arrays((other, 3)), y)
    if kind == "batch":
        batch = data.draw(bad_batch)
        return lambda: f(x, t, y, batch=batch)
    if kind == "slices":
        num_slices = data.draw(bad_slices)
        return lambda: f(x, t, y, num_slices=num_slices)
    if kind == "subset":
        subset = data.draw(bad_subset)
        return lambda: f(x, t, y, output_subset=subset)
    if kind == "keyword":
        name = data.draw(st.sampled_from(["z", "X", "batch_size"]))
        return lambda: f(x, t, y, **{name: 1})
    if kind == "batch_s_without_sliceable":
        return lambda: f(x, t, y, batch_s=slice(0, 1))
    if kind == "batch_s_length":
        count = data.draw(st.integers(min_value=0, max_value=8).filter(lambda v: v not in (0, n)))
        return lambda: model.g(batch_s=[slice(0, 1)] * count)
    return lambda: model.g(batch=1)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(call=invalid_calls())
def test_invalid_calls_raise_before_any_worker_moves(model, call):
    kind, data = call
    session = synk_session.current()
    seq_before = session.control.seq if session.control is not None else 0
    counter_before = model.counter.get_value().copy()
    with pytest.raises((TypeError, ValueError)):
        _make_call(model, kind, data)()
    if session.control is not None and kind != "batch_s_length":  # that one queries shapes
        assert session.control.seq == seq_before
    np.testing.assert_array_equal(model.counter.get_value(), counter_before)


def test_valid_call_after_fuzzing_is_right(model):
    before = rank_values(model.counter)
    got = model.f(model.x, model.t, model.y)
    want_rows = model.x.data + model.t.data
    want = (want_rows.dot(model.y)).mean(axis=0)
    np.testing.assert_allclose(got[0], want, rtol=1e-12)
    after = rank_values(model.counter)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b + 1)


batches = st.one_of(
    st.none(),
    st.integers(min_value=0, max_value=ROWS),
    st.tuples(st.integers(-ROWS, ROWS), st.integers(-ROWS, ROWS)).map(lambda p: slice(*p)),
    st.lists(st.integers(min_value=-ROWS, max_value=ROWS - 1), min_size=1, max_size=30),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=batches, num_slices=st.integers(min_value=1, max_value=6),
       rows=st.integers(min_value=1, max_value=ROWS), data_inputs=st.booleans())
def test_random_valid_calls_match_serial(model, batch, num_slices, rows, data_inputs):
    rng = np.random.default_rng(rows)
    xs, ts = rng.normal(size=(rows, 3)), rng.normal(size=(rows, 3))
    if batch is not None:
        index = np.arange(rows)
        selected = index[batch] if isinstance(batch, slice) else None
        if isinstance(batch, int):
            batch = min(batch, rows)
            selected = index[:batch]
        elif isinstance(batch, list):
            batch = [b % rows for b in batch]
            selected = index[batch]
        if len(selected) == 0:
            return  # the mean of no rows is nan in both; covered elsewhere
    else:
        selected = np.arange(rows)
    args = (synk.data(xs), synk.data(ts)) if data_inputs else (xs, ts)
    got = model.f(*args, model.y, batch=batch, num_slices=num_slices)
    want = model.f.as_pytensor(xs[selected], ts[selected], model.y)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
