"""Nothing silently wrong (SPEC section 3): time-major inputs, per-row outputs, and the
master's set_value, at n_parallel 1, 2, 3, each against the plain function on the
full data.

The Deep Learning Tutorials' LSTM, ported as a user would, gave wrong numbers with no
error in three ways; each case here is that program's pattern in small.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import compiled, rank_values

from ..conftest import session_fixture

RTOL = 1e-10


def _lstm_like(x, mask, w, u):
    """A recurrence over time-major ``x`` and ``mask`` ``(time, batch)``: each step's
    state per sequence, masked; the states and their mean over time."""

    def step(x_t, m_t, h):
        h_new = pt.tanh(x_t[:, None] * w + h.dot(u))
        return m_t[:, None] * h_new + (1 - m_t[:, None]) * h

    with warnings.catch_warnings():  # (PyTensor 3 warns that scan will stop returning
        warnings.simplefilter("ignore", DeprecationWarning)  # updates; 2.38 returns them)
        states = pytensor.scan(step, sequences=[x, mask],
                               outputs_info=[pt.zeros((x.shape[1], w.shape[0]))])
    states = states[0] if isinstance(states, (list, tuple)) else states
    pooled = (states * mask[:, :, None]).sum(axis=0) / mask.sum(axis=0)[:, None]
    return states, pooled


class Model:
    def __init__(self):
        x, mask = pt.dmatrix("x"), pt.dmatrix("mask")
        y = pt.lvector("y")
        self.w = pytensor.shared(np.linspace(-0.5, 0.5, 3), name="w")
        self.u = pytensor.shared(np.eye(3) * 0.3, name="u")
        states, pooled = _lstm_like(x, mask, self.w, self.u)
        prob = pt.special.softmax(pooled[:, :2], axis=-1)
        cost = -pt.log(prob[pt.arange(y.shape[0]), y] + 1e-8).mean()
        self.rnn = synk.function([x, mask, y], [prob, states, cost], in_axes=[1, 1, 0],
                                 name="rnn")
        self.rnn_plain = pytensor.function([x, mask, y], [prob, states, cost])
        g = pytensor.grad(cost, self.w)
        self.acc = pytensor.shared(np.zeros(3), name="acc")
        self.rnn_grad = synk.function([x, mask, y], (cost, "avg"), in_axes=[1, 1, 0],
                                      updates=[(self.acc, g, "avg")], name="rnn_grad")
        self.grad_plain = pytensor.function([x, mask, y], g)
        # per-row outputs: default op, explicit gather, op None, along axis 1
        r = pt.dmatrix("r")
        self.rows = synk.function([r], [r.sum(axis=1), (r * 2, "gather"),
                                        ((r ** 2).sum(axis=1), None), r.T * 3,
                                        r.mean(axis=0)], name="rows")
        # the master's set_value
        v = pt.dvector("v")
        self.flag = pytensor.shared(np.float64(0.0), name="flag")
        self.scale = pytensor.shared(np.ones(3), name="scale")
        self.uses = synk.function([v], (v.sum() * self.flag + self.scale.sum(), "sum"),
                                  name="uses")
        self.bump = synk.function([v], (v.sum(), "sum"),
                                  updates=[(self.scale, self.scale + 1)], name="bump")
        self.held = pytensor.shared(np.zeros((0, 2)), name="held")
        self.held_sum = synk.function([], (self.held.sum(), "sum"),
                                      sliceable_shareds=[self.held], name="held_sum")
        synk.distribute()

    def sequences(self, seed=0, time=7, batch=11):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(time, batch))
        lengths = rng.integers(1, time + 1, size=batch)
        mask = (np.arange(time)[:, None] < lengths[None, :]).astype(float)
        return x, mask, rng.integers(0, 2, size=batch)


model = session_fixture(Model)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-12)


def test_time_major_inputs_scatter_along_their_batch_axis(model):
    """``in_axes=1``: each process runs whole sequences; predictions come back per
    sequence in order, states gathered along their batch axis (1), the cost averaged
    by rows: the serial numbers."""
    x, mask, y = model.sequences()
    prob, states, cost = model.rnn(x, mask, y)
    want = model.rnn_plain(x, mask, y)
    assert prob.shape == (11, 2) and states.shape == (7, 11, 3)
    for got, expected in zip((prob, states, cost), want, strict=True):
        _close(got, expected)
    for got, expected in zip(model.rnn.as_pytensor(x, mask, y), want, strict=True):
        _close(got, expected)


def test_time_major_inputs_with_batch_slices_data_and_repeats(model):
    x, mask, y = model.sequences(seed=1, batch=10)
    rows = np.array([7, 2, 9, 0, 4])
    want = model.rnn_plain(x[:, rows], mask[:, rows], y[rows])
    for got, expected in zip(model.rnn(x, mask, y, batch=rows), want, strict=True):
        _close(got, expected)
    want = model.rnn_plain(x[:, 2:8], mask[:, 2:8], y[2:8])
    for got, expected in zip(model.rnn(x, mask, y, batch=slice(2, 8)), want, strict=True):
        _close(got, expected)
    want = model.rnn_plain(x, mask, y)
    for got, expected in zip(model.rnn(x, mask, y, num_slices=2), want, strict=True):
        _close(got, expected)
    data = [synk.data(a) for a in (x, mask, y)]
    for _ in range(2):  # (the second call replays the first)
        for got, expected in zip(model.rnn(*data), want, strict=True):
            _close(got, expected)
        for got, expected in zip(model.rnn(x, mask, y), want, strict=True):
            _close(got, expected)


def test_time_major_gradient_equals_serial(model):
    x, mask, y = model.sequences(seed=2, batch=12)
    cost = model.rnn_grad(x, mask, y)
    _close(cost, model.rnn_plain(x, mask, y)[2])
    rows = split_rows(12, synk.n_parallel())
    acc = rank_values(model.acc)
    for rank, (lo, hi) in enumerate(rows):
        if hi > lo:
            _close(acc[rank], model.grad_plain(x[:, lo:hi], mask[:, lo:hi], y[lo:hi]))


def split_rows(length, n):
    counts = [length // n + (r < length % n) for r in range(n)]
    starts = np.cumsum([0] + counts)
    return list(zip(starts[:-1], starts[1:], strict=True))


def test_lengths_must_agree_along_the_rows_axis(model):
    x, mask, y = model.sequences()
    with pytest.raises(ValueError, match="share their length along their axis of rows"):
        model.rnn(x, mask[:, :-1], y)
    with pytest.raises(ValueError, match="share their length"):
        model.rnn(x, mask, y[:-1])


def test_per_row_outputs_are_gathered_in_row_order(model):
    r = np.arange(35.0).reshape(7, 5) / 10
    sums, doubled, squares, transposed, means = model.rows(r)
    _close(sums, r.sum(axis=1))
    _close(doubled, r * 2)
    _close(transposed, r.T * 3)
    _close(means, r.mean(axis=0))
    master = split_rows(7, synk.n_parallel())[0]
    _close(squares, (r[master[0]:master[1]] ** 2).sum(axis=1))  # op None: the master's
    assert model.rows.output_modes == ["gather", "gather", None, "gather", "avg"]
    got = model.rows(r, batch=[6, 0, 3])
    want = model.rows.as_pytensor(r[[6, 0, 3]])
    for i in (0, 1, 3, 4):
        _close(got[i], want[i])


def test_a_scan_over_the_scattered_rows_is_refused_at_build(model):
    x, mask = pt.dmatrix("x"), pt.dmatrix("mask")
    _, pooled = _lstm_like(x, mask, model.w, model.u)
    with pytest.raises(ValueError, match=r"input 0 \('x'\) is split by rows along its "
                                         r"axis 0, and a scan iterates over that axis.*"
                                         r"in_axes"):
        synk.function([x, mask], pooled.sum())
    # said to be rows: allowed (each process then runs its own steps)
    synk.function([x, mask], (pooled.sum(), "sum"), in_axes=0)


def test_reducing_a_per_row_output_is_refused_with_the_hint_gather(model):
    r = pt.dmatrix("r")
    with pytest.raises(ValueError, match=r"output 0 .*one entry per scattered row.*"
                                         r"op 'sum'.*\"gather\""):
        synk.function([r], (r.sum(axis=1), "sum"))
    with pytest.raises(ValueError, match="output 1 .*op 'avg'"):
        synk.function([r], [r.sum(), (r * 2, "avg")])
    with pytest.raises(ValueError, match=r"output 0 has one entry per scattered row "
                                         r"along each of its axes \(0, 1\)"):
        synk.function([r], r.dot(r.T))  # rows along two axes: no gather is right
    # a dimension merely computed from the rows' count tells nothing (a gradient's
    # shape can be written so): the op given is used
    w = pytensor.shared(np.ones((4, 3)), name="w")
    grad = pytensor.grad((r.reshape((-1, 4)).dot(w) ** 2).sum(), w)
    synk.function([r], [(r[1:], "gather"), grad])


def test_in_axes_is_checked_at_build(model):
    r, s = pt.dmatrix("r"), pt.dvector("s")
    with pytest.raises(ValueError, match="one axis per entry of inputs"):
        synk.function([r, s], r.sum() + s.sum(), in_axes=[1])
    with pytest.raises(ValueError, match=r"in_axes\[1\] is 1, out of range"):
        synk.function([r, s], r.sum() + s.sum(), in_axes=[1, 1])
    with pytest.raises(TypeError, match=r"in_axes\[0\] must be an int"):
        synk.function([r], r.sum(), in_axes=[True])
    with pytest.raises(TypeError, match="in_axes must be an int or a list"):
        synk.function([r], r.sum(), in_axes="1")


def test_set_value_in_the_master_reaches_every_process(model):
    """The LSTM's ``use_noise.set_value(1.)`` and its restored best parameters."""
    n = synk.n_parallel()
    v = np.arange(6.0)
    model.flag.set_value(0.0)
    model.scale.set_value(np.ones(3))
    assert model.uses(v) == 3 * n
    model.flag.set_value(1.0)
    assert model.uses(v) == 15 + 3 * n
    model.scale.set_value(np.zeros(3), borrow=True)
    assert model.uses(v) == 15
    model.bump(v)  # the function's own update, in every process: nothing to send
    assert model.uses(v) == 15 + 3 * n
    model.scale.set_value(np.zeros(5))  # another shape
    assert model.uses(v) == 15
    for value in rank_values(model.scale):
        np.testing.assert_array_equal(value, np.zeros(5))
    synk.set_value(synk.master_rank(), model.scale, np.ones(5))  # the master's alone
    assert model.uses(v) == 20
    assert [float(s.sum()) for s in rank_values(model.scale)] == [5.0] + [0.0] * (n - 1)
    model.scale.set_value(np.full(5, 2.0))  # and before a collective
    synk.all_reduce(model.scale, op="sum")
    np.testing.assert_array_equal(model.scale.get_value(), np.full(5, 2.0 * n))


def test_set_value_of_rows_held_per_process_is_refused_then_scattered(model):
    n = synk.n_parallel()
    whole = np.arange(12.0).reshape(6, 2)
    synk.scatter(model.held, whole)
    assert model.held_sum() == whole.sum()
    model.held.set_value(np.ones((3, 2)))
    if n > 1:
        with pytest.raises(ValueError, match=r"'held' was given new storage .* "
                                             r"synk.scatter"):
            model.held_sum()
        with pytest.raises(ValueError, match="'held' was given new storage"):
            model.uses(np.arange(3.0))  # (any command: nothing moves until it is settled)
    synk.scatter(model.held, whole)
    assert model.held_sum() == whole.sum()


def test_a_function_compiles_at_its_first_call_not_at_distribute(model):
    """The LSTM tutorial builds ``f_cost`` and ``f_grad`` and never calls them: they
    cost no compile (``distribute()`` only ships them)."""
    r = pt.dmatrix("r")
    called = synk.function([r], (r ** 3).sum(axis=1), name="called")
    never = synk.function([r], (r ** 5).sum(axis=1), name="never")
    synk.distribute()
    assert not compiled(called) and not compiled(never)
    _close(called(np.ones((5, 2))), np.full(5, 2.0))
    assert compiled(called) and not compiled(never)
