"""Rows split by ``shares`` (a call keyword) and ``balance=True`` (make_train_function).

Skewed shares on purpose, at n 2 and 3: each process must take exactly the rows
``weighted_counts`` gives it (read from a per-process update), and every result must
equal the plain PyTensor function on the full data (outputs ``avg``, ``sum``,
``max``, ``gather``), and the serial training program (every process's parameters).
Without shares nothing changes: the even split, and the repeated-call path.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions import make_train_function, make_train_function_pytensor
from synkhronos.testing import commands_run, rank_values, split_bounds, weighted_counts
from tests.unit.test_updates_unit import initial_params, make_data, symbolic_model

from ..conftest import DEVICE, sizes_to_run

pytestmark = pytest.mark.timeout(240)

RTOL = 1e-10
X, Y = make_data(rows=40, seed=5)
W = np.random.default_rng(6).normal(size=(X.shape[1],))
SKEWED = {2: (5.0, 1.0), 3: (1.0, 3.0, 7.0)}  # deliberately far from even
BATCHES = [None, slice(3, 32), np.random.default_rng(7).permutation(40)[:23]]


class Functions:
    """A function of scattered rows, the same over a givens slice, and train steps."""

    def __init__(self, n: int) -> None:
        self.n = n
        x = pt.dmatrix("x")
        w = pytensor.shared(W, name="w")
        self.rows = pytensor.shared(np.zeros(()), name="rows")  # this process's rows
        z = x.dot(w)
        outputs = [z.mean(), ((x ** 2).sum(), "sum"), (z.max(), "max"), (z, "gather")]
        self.f = synk.function([x], outputs, updates=[(self.rows, pt.cast(x.shape[0], "float64"),
                                                       "sum")], name="rows_f")
        self.data_x = pytensor.shared(X, name="data_x")
        index = pt.lscalar("index")
        xs = pt.dmatrix("xs")
        zs = xs.dot(w)
        self.slice_rows = pytensor.shared(np.zeros(()), name="slice_rows")
        self.f_slice = synk.function(
            [index], [zs.mean(), (zs, "gather")],
            givens={xs: self.data_x[index * 17:(index + 1) * 17]},
            updates=[(self.slice_rows, pt.cast(xs.shape[0], "float64"))], name="slice_f")
        self.trains = {}
        self.serial_params = {}
        for sharded in (True, False):
            params = [pytensor.shared(v, name=n) for v, n in zip(initial_params(), "Wb",
                                                                  strict=True)]
            px, py, loss = symbolic_model(params)
            self.trains[sharded] = make_train_function(
                loss, params, [px, py], "adam", learning_rate=0.05,
                sharded=sharded, balance=True)
        synk.distribute()
        self.xd, self.yd = synk.data(X), synk.data(Y)

    def serial_train(self):
        """The serial program (plain PyTensor in the master) from the same start."""
        params = [pytensor.shared(v, name=n) for v, n in zip(initial_params(), "Wb",
                                                              strict=True)]
        px, py, loss = symbolic_model(params)
        return make_train_function_pytensor(loss, params, [px, py], "adam",
                                            learning_rate=0.05), params


@pytest.fixture(scope="module", params=sizes_to_run([2, 3]), ids=lambda n: f"n{n}")
def made(request):
    synk.fork(request.param, device=DEVICE)
    try:
        yield Functions(request.param)
    finally:
        synk.close()


def split_counts(length: int, parts: int) -> list[int]:
    """The even split's row counts."""
    return [stop - start for start, stop in split_bounds(length, parts)]


def selected(batch) -> np.ndarray:
    return np.arange(40) if batch is None else np.arange(40)[batch]


def assert_like_plain(made: Functions, got: list, rows: np.ndarray) -> None:
    want = made.f.as_pytensor(X[rows])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL)


@pytest.mark.parametrize("batch", BATCHES, ids=["all", "slice", "indices"])
@pytest.mark.parametrize("num_slices", [1, 2])
def test_skewed_shares_give_each_process_its_rows_and_the_plain_result(made, batch,
                                                                       num_slices):
    shares = SKEWED[made.n]
    rows = selected(batch)
    for data in (made.xd, X):  # a Data in place, and an array staged in shared memory
        got = made.f(data, batch=batch, shares=shares, num_slices=num_slices)
        counts = [int(v) for v in rank_values(made.rows)]
        assert counts == weighted_counts(len(rows), shares)
        assert counts != split_counts(len(rows), made.n)  # skewed indeed
        assert_like_plain(made, got, rows)  # (the plain function updates the master's)


def test_minibatch_data_takes_its_first_rows_by_shares(made):
    buffer = synk.data(value=X[:30], minibatch=True)
    shares = SKEWED[made.n]
    got = made.f(buffer, batch=np.arange(25), shares=shares)
    assert [int(v) for v in rank_values(made.rows)] == weighted_counts(25, shares)
    assert_like_plain(made, got, np.arange(25))
    buffer.free_memory()


def test_without_shares_nothing_changes(made):
    """The even split, equal shares included, and the repeated call's single command."""
    for shares in (None, (1.0,) * made.n, (7,) * made.n):
        got = made.f(made.xd, batch=slice(1, 40), shares=shares)
        assert [int(v) for v in rank_values(made.rows)] == split_counts(39, made.n)
        assert_like_plain(made, got, np.arange(1, 40))
    made.f(made.xd)
    before = commands_run()
    got = made.f(made.xd)  # the repeated-call path, taken as before
    assert commands_run() == before + 1
    assert_like_plain(made, got, np.arange(40))


def test_fewer_rows_than_processes_follow_the_shares(made):
    shares = SKEWED[made.n]
    got = made.f(made.xd, batch=[4, 9][: made.n - 1], shares=shares)
    rows = np.array([4, 9][: made.n - 1])
    assert_like_plain(made, got, rows)


def test_shares_split_the_slice_of_givens(made):
    shares = SKEWED[made.n]
    for index in (0, 1, 2):  # the last slice is short: 40 - 34 = 6 rows
        rows = np.arange(40)[index * 17:(index + 1) * 17]
        got = made.f_slice(index, shares=shares)
        counts = [int(v) for v in rank_values(made.slice_rows)]
        assert counts == weighted_counts(len(rows), shares)
        want = made.f_slice.as_pytensor(index)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL)


def test_bad_shares_raise_before_anything_moves(made):
    made.f(made.xd, batch=slice(0, 10))
    before = commands_run()
    with pytest.raises(ValueError, match=f"but there are {made.n} processes"):
        made.f(made.xd, shares=(1.0,) * (made.n + 1))
    with pytest.raises(ValueError, match="finite and positive"):
        made.f(made.xd, shares=(1.0,) * (made.n - 1) + (0.0,))
    with pytest.raises(TypeError, match="shares must be a sequence"):
        made.f(made.xd, shares=2.0)
    with pytest.raises(TypeError, match="timings must be a callable or None; got int"):
        synk.steps.call(made.f, made.xd, timings=3)
    assert commands_run() == before
    assert [int(v) for v in rank_values(made.rows)] == split_counts(10, made.n)


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
def test_training_on_skewed_shares_equals_the_serial_program(made, sharded):
    train = made.trains[sharded]
    synk.broadcast(train.params, initial_params())
    train.reset_state()
    serial, serial_params = made.serial_train()
    rng = np.random.default_rng(8)
    plans = [SKEWED[made.n], SKEWED[made.n][::-1], None, SKEWED[made.n]]
    for step, shares in enumerate(plans):
        idx = rng.permutation(40)[: 11 + 7 * step]
        loss = train(made.xd, made.yd, batch=idx, shares=shares, num_slices=1 + step % 2)
        np.testing.assert_allclose(loss, serial(X[idx], Y[idx]), rtol=RTOL)
    want = [p.get_value() for p in serial_params]
    for rank in range(made.n):
        for got, w in zip(synk.get_value(rank, train.params), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=RTOL, err_msg=f"rank {rank}")


def test_balance_uses_the_measured_speeds_and_stays_exact(made):
    """Timings fed to the balancer as if rank 0 were three times faster: the steps take
    rows by those shares, measure every process, and equal the serial program."""
    train = made.trains[True]
    synk.broadcast(train.params, initial_params())
    train.reset_state()
    serial, serial_params = made.serial_train()
    balancer = train.balancer
    assert balancer is not None
    for _ in range(40):  # seconds per row: rank 0 three times faster than the others
        balancer.record([(10, 1.0)] + [(10, 3.0)] * (made.n - 1))
    seen = []
    record = balancer.record
    balancer.record = lambda timings: seen.append(timings)  # keep the forced speeds
    try:
        rng = np.random.default_rng(9)
        for _ in range(3):
            idx = rng.permutation(40)[:30]
            loss = train(made.xd, made.yd, batch=idx)
            np.testing.assert_allclose(loss, serial(X[idx], Y[idx]), rtol=RTOL)
    finally:
        del balancer.record
    assert balancer.record == record
    shares = balancer.in_use
    assert shares is not None and shares[0] == pytest.approx(3 / (made.n + 2))
    for timings in seen:  # every process measured, on the rows its share gave it
        assert [rows for rows, _ in timings] == weighted_counts(30, shares)
        assert all(seconds > 0 for _, seconds in timings)
    want = [p.get_value() for p in serial_params]
    for rank in range(made.n):
        for got, w in zip(synk.get_value(rank, train.params), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=RTOL, err_msg=f"rank {rank}")


def test_steps_report_each_process_rows_and_seconds(made):
    seen = []
    shares = SKEWED[made.n]
    got = synk.steps.run([synk.steps.call(made.f, made.xd, batch=slice(0, 30), shares=shares,
                                          timings=seen.append)])[0]
    (timings,) = seen
    assert [rows for rows, _ in timings] == weighted_counts(30, shares)
    assert all(seconds > 0 for _, seconds in timings)
    assert_like_plain(made, got, np.arange(30))


def test_balance_is_checked_when_built(made):
    params = [pytensor.shared(v, name=n) for v, n in zip(initial_params(), "Wb",
                                                          strict=True)]
    px, py, loss = symbolic_model(params)
    with pytest.raises(TypeError, match="balance must be True or False"):
        make_train_function(loss, params, [px, py], "sgd", learning_rate=0.1, balance=1)
    s_x = pytensor.shared(X, name="s_x")
    s_y = pytensor.shared(Y, name="s_y")
    with pytest.raises(ValueError, match="batch_s chooses each process's rows"):
        make_train_function(loss, params, [], "sgd", learning_rate=0.1,
                            givens=[(px, s_x), (py, s_y)], sliceable_shareds=[s_x, s_y],
                            balance=True)
    train = make_train_function(loss, params, [], "sgd", learning_rate=0.1,
                                givens=[(px, s_x), (py, s_y)], sliceable_shareds=[s_x, s_y])
    before = commands_run()
    with pytest.raises(ValueError, match="with sliceable_shareds batch_s chooses"):
        train(batch_s=slice(0, 5), shares=SKEWED[made.n])
    assert commands_run() == before
