"""Property-based fuzzing of function calls.

Invalid calls: each must raise TypeError or ValueError in the master without waking
any worker (``synkhronos.testing.commands_run()`` does not move; a ``batch_s`` of the
wrong length is checked where the rows live, in one command at most) and without
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
from synkhronos.testing import commands_run, rank_values, split_bounds

from ..conftest import session_fixture

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
    before = commands_run()
    counter_before = model.counter.get_value().copy()
    with pytest.raises((TypeError, ValueError)):
        _make_call(model, kind, data)()
    if kind == "batch_s_length":  # checked by the ranks, inside the call's one command
        assert commands_run() - before <= 1
    else:
        assert commands_run() == before
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
    # sliced calls leave out the output without reduction (it refuses slices)
    subset = None if num_slices == 1 else [0, 1, 2]
    got = model.f(*args, model.y, batch=batch, num_slices=num_slices, output_subset=subset)
    want = model.f.as_pytensor(xs[selected], ts[selected], model.y)
    for g, w in zip(got[:3], want[:3], strict=True):  # the reduced outputs
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    if num_slices == 1:
        _assert_masters_own(got[3], xs[selected], ts[selected], model)


def _assert_masters_own(got, xs, ts, model) -> None:
    """The output without reduction (op None) is the master's own result: the serial
    function on the master's block of the selected rows (None if it has none)."""
    n, master = synk.n_parallel(), synk.master_rank()
    lo, hi = split_bounds(len(xs), n)[master]
    if lo == hi:
        assert got is None
        return
    want = model.f.as_pytensor(xs[lo:hi], ts[lo:hi], model.y)[3]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_masters_own_output_refuses_slices(model):
    """An output without reduction has no rule to combine the master's slices by: a
    sliced call that includes it is refused before anything moves."""
    rng = np.random.default_rng(5)
    xs, ts = rng.normal(size=(ROWS, 3)), rng.normal(size=(ROWS, 3))
    before = commands_run()
    for num_slices in (2, 3):
        with pytest.raises(ValueError, match="output 3 has op None"):
            model.f(xs, ts, model.y, num_slices=num_slices)
    assert commands_run() == before
    got = model.f(xs, ts, model.y)  # unsliced: the master's own rows
    _assert_masters_own(got[3], xs, ts, model)
