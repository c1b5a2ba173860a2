"""synkhronos.steps: several calls and collectives in one command, equal to one by one.

Each test builds what it needs in one session per ``n`` (1, 2, 3), compares a
``steps.run`` against the same calls and collectives made one at a time (or against
numpy), and counts the commands.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos import steps
from synkhronos.testing import (
    commands_run,
    on_variable,
    rank_values,
    set_rank_values,
)

from ..conftest import DEVICE, session_fixture

RTOL = 1e-12
rng = np.random.default_rng(11)


class Model:
    def __init__(self):
        n = synk.n_parallel()
        x = pt.dmatrix("x")
        self.w = pytensor.shared(np.zeros(1001), name="w")  # 8 kB: the large-group path
        self.small = pytensor.shared(np.zeros(5), name="small")
        self.flat = pytensor.shared(np.zeros(7), name="flat")
        self.a = pytensor.shared(np.zeros((2, 2)), name="a")
        self.b = pytensor.shared(np.zeros(3), name="b")
        self.f = synk.function([x], (x.sum(axis=0), "sum"), name="colsum")
        self.bump = synk.function([], updates=[(self.w, self.w + 1.0),
                                               (self.small, self.small * 2.0)])
        self.uses = synk.function([], [(self.flat.sum() + self.a.sum() + self.b.sum(), "sum")])
        self.piece = pytensor.shared(np.zeros(0), name="piece", shape=(None,))
        self.double_piece = synk.function([], updates=[(self.piece, self.piece * 2.0)])
        synk.distribute()
        self.n = n


model = session_fixture(Model)


def test_a_call_and_collectives_in_one_command(model):
    n = model.n
    values = [rng.standard_normal(1001) for _ in range(n)]
    set_rank_values(model.w, values)
    data = rng.standard_normal((10, 3))
    before = commands_run()
    got, _, _ = steps.run([steps.call(model.f, data), steps.all_reduce(model.w, op="sum"),
                           steps.call(model.bump)])
    assert commands_run() == before + 1
    np.testing.assert_allclose(got, data.sum(axis=0), rtol=RTOL)
    want = np.sum(values, axis=0) + 1.0  # reduced first, then bumped, in every process
    for value in rank_values(model.w):
        np.testing.assert_allclose(value, want, rtol=RTOL)


@pytest.mark.parametrize("var", ["w", "small"])
def test_reduce_scatter_then_all_gather_pieces_is_all_reduce(model, var):
    target = getattr(model, var)
    n = model.n
    values = [rng.standard_normal(target.get_value().shape) for _ in range(n)]
    set_rank_values(target, values)
    pieces = steps.pieces(target)
    assert pieces[0][0] == 0 and pieces[-1][1] == values[0].size
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))
    steps.run([steps.reduce_scatter(target, op="sum")])
    total = np.sum(values, axis=0)
    for rank, value in enumerate(rank_values(target)):  # each holds its own piece
        start, stop = pieces[rank]
        np.testing.assert_allclose(value[start:stop], total[start:stop], rtol=RTOL)
    steps.run([steps.all_gather_pieces(target)])
    for value in rank_values(target):
        np.testing.assert_allclose(value, total, rtol=RTOL)


def _write_own_piece(var, rank, pieces, value) -> None:
    start, stop = pieces[rank]
    var.get_value(borrow=True)[start:stop] = value  # in place: where it lies


def test_all_gather_pieces_common_leaves_one_buffer_every_process_reads(model):
    n = model.n
    values = [rng.standard_normal(1001) for _ in range(n)]
    set_rank_values(model.w, values)
    pieces = steps.pieces(model.w)
    steps.run([steps.reduce_scatter(model.w, op="sum"),
               steps.all_gather_pieces(model.w, common=True)])
    total = np.sum(values, axis=0)
    for value in rank_values(model.w):
        np.testing.assert_allclose(value, total, rtol=RTOL)
    if DEVICE != "cpu":  # (JAX arrays: the plain all-gather; none is written in place)
        return
    # each process writes its own piece in place; after the next common all-gather
    # (nothing left to copy) every process reads every piece
    new = rng.standard_normal(1001)
    for rank, (start, stop) in enumerate(pieces):
        on_variable(model.w, _write_own_piece, pieces, new[start:stop], ranks=[rank])
    steps.run([steps.all_gather_pieces(model.w, common=True)])
    for value in rank_values(model.w):
        np.testing.assert_array_equal(value, new)
    # one buffer: a write by the last process is the master's too
    on_variable(model.w, _write_own_piece, [(0, 1001)] * n, np.zeros(1001), ranks=[n - 1])
    np.testing.assert_array_equal(model.w.get_value(), np.zeros(1001))
    set_rank_values(model.w, [np.zeros(1001)] * n)  # (each process its own value again)


def test_views_make_variables_views_of_the_flat_one(model):
    if DEVICE == "gpu":  # JAX arrays view nothing: refused in the master, nothing moves
        with pytest.raises(ValueError, match="needs values that can view one another"):
            steps.views(model.flat, [model.a, model.b])
        return
    n = model.n
    a, b = rng.standard_normal((2, 2)), rng.standard_normal(3)
    synk.broadcast([model.a, model.b], [a, b])
    steps.run([steps.views(model.flat, [model.a, model.b], copy_in=True)])
    for value in rank_values(model.flat):  # the variables' values went into flat
        np.testing.assert_array_equal(value, np.concatenate([a.ravel(), b]))
    new = rng.standard_normal(7)
    synk.broadcast(model.flat, new)  # flat moves: the variables follow with copy_in=False
    steps.run([steps.views(model.flat, [model.a, model.b], copy_in=False)])
    want = new[:4].sum() + new[4:].sum() + new.sum()
    np.testing.assert_allclose(model.uses(), n * want, rtol=RTOL)
    with pytest.raises(ValueError, match="1-d flat variable and variables of its dtype"):
        steps.views(model.a, [model.b])


def test_piece_view_makes_a_variable_view_its_own_piece(model):
    if DEVICE == "gpu":  # JAX arrays view nothing: refused in the master, nothing moves
        with pytest.raises(ValueError, match="needs values that can view one another"):
            steps.piece_view(model.w, model.piece)
        return
    n = model.n
    values = [rng.standard_normal(1001) for _ in range(n)]
    set_rank_values(model.w, values)
    pieces = steps.pieces(model.w)
    # the piece views its place: doubled in place, each process's own piece of w doubles
    steps.run([steps.piece_view(model.w, model.piece), steps.call(model.double_piece)])
    for rank, (value, piece) in enumerate(zip(rank_values(model.w), rank_values(model.piece),
                                              strict=True)):
        start, stop = pieces[rank]
        want = values[rank].copy()
        want[start:stop] *= 2.0
        np.testing.assert_array_equal(value, want)
        np.testing.assert_array_equal(piece, want[start:stop])
    # a piece that does not view its place: copy_in gives its value to w, else w wins
    news = [rng.standard_normal(stop - start) for start, stop in pieces]
    set_rank_values(model.piece, news)
    before = rank_values(model.w)
    steps.run([steps.piece_view(model.w, model.piece)])
    for rank, (value, piece) in enumerate(zip(rank_values(model.w), rank_values(model.piece),
                                              strict=True)):
        start, stop = pieces[rank]
        np.testing.assert_array_equal(value, before[rank])
        np.testing.assert_array_equal(piece, before[rank][start:stop])
    set_rank_values(model.piece, news)
    steps.run([steps.piece_view(model.w, model.piece, copy_in=True)])
    for rank, value in enumerate(rank_values(model.w)):
        start, stop = pieces[rank]
        want = before[rank].copy()
        want[start:stop] = news[rank]
        np.testing.assert_array_equal(value, want)
    with pytest.raises(ValueError, match="two 1-d variables of one dtype"):
        steps.piece_view(model.a, model.piece)


def test_a_failing_step_stops_every_process_there(model):
    if model.n == 1:
        pytest.skip("needs a worker to fail (n_parallel=1 has none)")
    set_rank_values(model.w, [np.zeros(1001)] * model.n)
    with pytest.raises(synk.WorkerError):
        steps.run([steps.all_reduce(model.w, op="sum"),
                   steps.call(model.f, rng.standard_normal((4, 3))), _failing_step(model)])
    set_rank_values(model.small, [np.zeros(5)] * model.n)  # undo the spoiled storage
    steps.run([steps.call(model.bump)])  # the session is usable, all in step
    for value in rank_values(model.w):
        np.testing.assert_array_equal(value, np.ones(1001))


def _spoil(var, rank):
    var.container.storage[0] = object()


def _failing_step(model):
    """A step that raises in the last worker: a collective on a variable whose storage
    that worker cannot copy."""
    on_variable(model.small, _spoil, ranks=[model.n - 1])
    return steps.all_reduce(model.small, op="sum")


def test_run_checks_its_items(model):
    assert steps.run([]) == []
    with pytest.raises(TypeError, match="steps.call takes a synk.Function"):
        steps.call(lambda: None)
    with pytest.raises(TypeError, match=r"steps\[0\] is not a step"):
        steps.run([model.f])


def test_two_calls_of_one_function_keep_their_own_inputs(model):
    """Calls prepared for one command never share staging memory."""
    first, second = rng.standard_normal((4, 3)), rng.standard_normal((9, 3))
    for _ in range(2):  # and again, reusing the buffers
        got = steps.run([steps.call(model.f, first), steps.call(model.f, second),
                         steps.call(model.f, first, batch=[3, 0])])
        np.testing.assert_allclose(got[0], first.sum(axis=0), rtol=RTOL)
        np.testing.assert_allclose(got[1], second.sum(axis=0), rtol=RTOL)
        np.testing.assert_allclose(got[2], first[[3, 0]].sum(axis=0), rtol=RTOL)
