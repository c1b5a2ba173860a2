"""Rows taken in chunks as the processes come free (``chunks=``, a call keyword and a
``make_train_function`` keyword).

Every chunk must run exactly once, in some process: a per-process update counts the
rows each process ran and the counts must add up to the selected rows, call after
call (the shared counter starts again for every chunked call, two in one command
included). Every result must equal the plain PyTensor function on the full data
(outputs ``avg``, ``sum``, ``max``; an accumulated gradient summed over processes),
and the training step the serial program. What chunks cannot do is refused before
anything moves.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions import make_train_function, make_train_function_pytensor
from synkhronos.testing import commands_run, rank_values
from tests.unit.test_updates_unit import initial_params, make_data, symbolic_model

from ..conftest import REPLAY, session_fixture

pytestmark = pytest.mark.timeout(240)

RTOL = 1e-10
X, Y = make_data(rows=40, seed=8)
W = np.random.default_rng(9).normal(size=(X.shape[1],))
BATCHES = [None, slice(3, 32), np.random.default_rng(10).permutation(40)[:23]]


class Functions:
    """A function whose updates add into their variables (rows run, a gradient), one
    whose update does not, and training steps in chunks."""

    def __init__(self) -> None:
        self.n = synk.n_parallel()
        x = pt.dmatrix("x")
        w = pytensor.shared(W, name="w")
        self.rows = pytensor.shared(np.zeros(()), name="rows")  # rows this process ran
        self.grad = pytensor.shared(np.zeros_like(W), name="grad")  # its summed gradient
        z = x.dot(w)
        self.loss = (z ** 2).mean()
        total = pt.dscalar("total")
        grad = pytensor.grad(self.loss * pt.cast(x.shape[0], "float64") / total, w)
        self.outputs = [self.loss, ((x ** 2).sum(), "sum"), (z.max(), "max")]
        self.f = synk.function(
            [x], self.outputs, bcast_inputs=[total], name="chunks_f",
            updates=[(self.rows, self.rows + pt.cast(x.shape[0], "float64")),
                     (self.grad, self.grad + grad)])
        self.plain = pytensor.function([x], [self.loss, (x ** 2).sum(), z.max(),
                                             pytensor.grad(self.loss, w)])
        self.setting = synk.function([x], z.mean(), updates=[(self.grad, grad * 0 + z.mean())],
                                     bcast_inputs=[total], name="sets_f")
        self.gathering = synk.function([x], [(z, "gather")], name="gather_f")
        self.trains = {}
        for sharded in (True, False):
            params = [pytensor.shared(v, name=name)
                      for v, name in zip(initial_params(), "Wb", strict=True)]
            px, py, loss = symbolic_model(params)
            self.trains[sharded] = (make_train_function(
                loss, params, [px, py], "adam", learning_rate=0.05, sharded=sharded,
                chunks=5), params)
        synk.distribute()
        self.xd, self.yd = synk.data(X), synk.data(Y)

    def zero(self) -> None:
        synk.broadcast([self.rows, self.grad], [np.zeros(()), np.zeros_like(W)])

    def serial_train(self):
        params = [pytensor.shared(v, name=name)
                  for v, name in zip(initial_params(), "Wb", strict=True)]
        px, py, loss = symbolic_model(params)
        return make_train_function_pytensor(loss, params, [px, py], "adam",
                                            learning_rate=0.05), params


made = session_fixture(Functions)


def selected(batch) -> np.ndarray:
    return np.arange(40) if batch is None else np.arange(40)[batch]


def assert_every_row_once_and_like_plain(made: Functions, got: list, rows: np.ndarray,
                                         calls: int = 1) -> None:
    assert sum(float(v) for v in rank_values(made.rows)) == calls * len(rows)
    want = made.plain(X[rows])
    for g, w in zip(got, want[:3], strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL)
    np.testing.assert_allclose(sum(rank_values(made.grad)), calls * want[3], rtol=RTOL)


@pytest.mark.parametrize("batch", BATCHES, ids=["all", "slice", "indices"])
@pytest.mark.parametrize("chunks", [1, 4, 7, 60])
def test_every_chunk_runs_once_and_the_result_is_the_plain_one(made, batch, chunks):
    rows = selected(batch)
    for data in (made.xd, X):  # a Data in place, and an array staged in shared memory
        made.zero()
        got = made.f(data, float(len(rows)), batch=batch, chunks=chunks)
        assert_every_row_once_and_like_plain(made, got, rows)


def test_the_counter_starts_again_for_every_call_and_every_step(made):
    total = np.asarray(40.0)  # (an array: a repeated call may replay)
    for data in (made.xd, X):  # the repeated call replays its message (the one command)
        made.zero()
        got = made.f(data, total, chunks=6)
        for _ in range(2):
            before = commands_run()
            got = made.f(data, total, chunks=6)
            assert commands_run() == before + 1
        assert_every_row_once_and_like_plain(made, got, np.arange(40), calls=3)
    kept = [slot for slot, _ in made.f._variants.plain.records]  # (what replay kept)
    assert ((1, 6) in kept) == REPLAY
    made.zero()
    made.f(made.xd, 40.0)  # the same arguments on blocks: kept apart from the chunks
    made.f(made.xd, 40.0, chunks=6)
    assert_every_row_once_and_like_plain(made, made.f(made.xd, 40.0), np.arange(40),
                                         calls=3)
    made.zero()
    results = synk.steps.run([synk.steps.call(made.f, made.xd, 40.0, chunks=6),
                              synk.steps.call(made.f, made.xd, 40.0, chunks=9)])
    assert_every_row_once_and_like_plain(made, results[1], np.arange(40), calls=2)


def test_a_minibatch_data_takes_its_first_rows_in_chunks(made):
    buffer = synk.data(value=X[:30], minibatch=True)
    made.zero()
    got = made.f(buffer, 25.0, batch=np.arange(25), chunks=4)
    assert_every_row_once_and_like_plain(made, got, np.arange(25))
    buffer.free_memory()


def test_what_chunks_cannot_do_is_refused_before_anything_moves(made):
    made.zero()
    cases = [
        (lambda: made.setting(made.xd, 40.0, chunks=3), "does not add into it"),
        (lambda: made.gathering(made.xd, chunks=3), "op 'gather'"),
        (lambda: made.f(made.xd, 40.0, chunks=3, num_slices=2), "num_slices fixes them"),
        (lambda: made.f(made.xd, 40.0, chunks=3, shares=[1.0] * made.n), "shares fixes"),
        (lambda: made.f(made.xd, 40.0, chunks=0), "an int >= 1"),
        (lambda: made.f(made.xd, 40.0, chunks=-2), "an int >= 1"),
        (lambda: made.f(made.xd, 40.0, chunks=True), "an int >= 1"),
        (lambda: made.f(made.xd, 40.0, chunks=2.0), "an int >= 1"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    assert [float(v) for v in rank_values(made.rows)] == [0.0] * made.n


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
def test_training_in_chunks_equals_the_serial_program(made, sharded):
    train, params = made.trains[sharded]
    train.reset_state()
    for param, value in zip(params, initial_params(), strict=True):
        param.set_value(value)
    serial, serial_params = made.serial_train()
    rng = np.random.default_rng(11)
    for step in range(4):
        batch = rng.permutation(40)[:17 + step]
        loss = train(made.xd, made.yd, batch=batch)
        want = serial(X[batch], Y[batch])
        np.testing.assert_allclose(loss, want, rtol=1e-9)
    for param, want in zip(params, serial_params, strict=True):
        for value in rank_values(param):
            np.testing.assert_allclose(value, want.get_value(), rtol=1e-9, atol=1e-12)


def test_chunks_are_checked_when_the_step_is_built(made):
    params = [pytensor.shared(v) for v in initial_params()]
    px, py, loss = symbolic_model(params)
    with pytest.raises(ValueError, match="balance=True fixes them"):
        make_train_function(loss, params, [px, py], "sgd", chunks=4, balance=True)
    with pytest.raises(ValueError, match="an int >= 1"):
        make_train_function(loss, params, [px, py], "sgd", chunks=0)
