"""The original Synkhronos' meanings, each checked against the serial function.

The original's programs run here with only ``theano`` -> ``pytensor`` renames; these
tests pin each point where a port used to fail or silently differ (issue 13):
minibatch Data, op None, per-input ``build_inputs`` flags, ``givens`` onto sliceable
shared variables, safe upcasts into Data, ``scatter`` of values of different lengths,
shared variables named by string, the original's keywords, and the extensions'
helpers and ``make_train_function`` form.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions import train as synk_train
from synkhronos.extensions import updates
from synkhronos.testing import split_bounds

from ..conftest import session_fixture

RTOL = 1e-10
rng = np.random.default_rng(7)


class Model:
    """The functions every test in a session shares (float64: exact comparisons)."""

    def __init__(self):
        x, y = pt.dmatrix("x"), pt.dmatrix("y")
        z = x.dot(y)
        self.f = synk.function([x], [z.mean(axis=0), (z.sum(axis=1), "gather"),
                                     (z.sum(axis=0), None), (z.sum(), "c_sum")],
                               bcast_inputs=[y], name="fidelity")
        self.one = synk.function([x], (x.sum(axis=1), "gather"), name="one_input")
        a, b = pt.dvector("a"), pt.dvector("b")
        self.pair = synk.function([a, b], [(a * b, "gather"), (a.sum() - b.sum(), "sum")])
        # the original's pattern: data scattered into shared variables, used in place
        # of the inputs through givens
        self.s_x = pytensor.shared(np.zeros((0, 3)), name="s_x")
        self.s_t = pytensor.shared(np.zeros((0,)), name="s_t")
        xi, t = pt.dmatrix("xi"), pt.dvector("t")
        self.w = pytensor.shared(np.array([0.5, -1.0, 2.0]), name="w")
        err = (xi.dot(self.w) - t) ** 2
        outputs = [err.mean(), (err.sum(), "sum"), (err, "gather")]
        self.loss = synk.function([], outputs, givens=[(xi, self.s_x), (t, self.s_t)],
                                  sliceable_shareds=[self.s_x, self.s_t], name="givens")
        self.loss_plain = pytensor.function([xi, t], [err.mean(), err.sum(), err])
        self.a = pytensor.shared(np.zeros(0), name="a_vec")
        self.b = pytensor.shared(np.zeros((0, 2)), name="b_mat")
        self.ab = synk.function([], [(self.a.sum(), "sum"), (self.b.sum(), "sum")],
                                name="ab")
        synk.distribute()


model = session_fixture(Model)


def rank_rows(length, n, rank):
    lo, hi = split_bounds(length, n)[rank]
    return lo, hi


# -- minibatch Data ----------------------------------------------------------------------
@pytest.mark.parametrize("batch", [37, slice(5, 48), "indices"], ids=["int", "slice", "idx"])
@pytest.mark.parametrize("num_slices", [1, 3])
def test_minibatch_data_supplies_its_first_rows(model, batch, num_slices):
    """The original's demo_4: a minibatch Data is not indexed by ``batch``."""
    data = rng.standard_normal((60, 4))
    y = rng.standard_normal((4, 2))
    if batch == "indices":
        batch = rng.permutation(60)[:29]
    selected = data[batch] if not isinstance(batch, int) else data[:batch]
    count = len(selected)
    buffer = synk.data(np.concatenate([selected, rng.standard_normal((7, 4))]),
                       minibatch=True)
    plain = model.f.as_pytensor(selected, y)
    subset = [0, 1] if num_slices > 1 else None  # output 2 (op None) refuses slices
    result = model.f(buffer, y, batch=batch, num_slices=num_slices, output_subset=subset)
    np.testing.assert_allclose(result[0], plain[0], rtol=RTOL)
    np.testing.assert_allclose(result[1], plain[1], rtol=RTOL)
    assert len(result[1]) == count
    whole = synk.data(data)  # an indexed Data gives the same rows
    np.testing.assert_allclose(model.f(whole, y, batch=batch)[0], plain[0], rtol=RTOL)


def test_minibatch_data_too_short_is_refused(model):
    buffer = synk.data(np.zeros((10, 4)), minibatch=True)
    with pytest.raises(ValueError, match="minibatch Data of 10 rows, fewer than the 12"):
        model.f(buffer, np.zeros((4, 2)), batch=np.arange(12)[::-1])
    with pytest.raises(ValueError, match="row count 12 is out of range for 10 rows"):
        model.f(buffer, np.zeros((4, 2)), batch=12)


def test_minibatch_data_beside_indexed_inputs(model):
    """Two scattered inputs, one indexed by ``batch``, one a prepared minibatch."""
    A = rng.standard_normal(40)
    idx = rng.permutation(40)[:15]
    B = rng.standard_normal(15)
    out = model.pair(synk.data(A), synk.data(B, minibatch=True), batch=idx)
    np.testing.assert_allclose(out[0], A[idx] * B, rtol=RTOL)
    np.testing.assert_allclose(out[1], A[idx].sum() - B.sum(), rtol=RTOL)


# -- op None and the c_ aliases ------------------------------------------------------------
def test_op_none_is_the_masters_own_result(model):
    n = synk.n_parallel()
    data, y = rng.standard_normal((23, 4)), rng.standard_normal((4, 2))
    lo, hi = rank_rows(23, n, synk.master_rank())
    own = model.f.as_pytensor(data[lo:hi], y)
    result = model.f(data, y)
    np.testing.assert_allclose(result[2], own[2], rtol=RTOL)
    np.testing.assert_allclose(result[3], model.f.as_pytensor(data, y)[3], rtol=RTOL)
    assert model.f.output_modes == ["avg", "gather", None, "sum"]


def test_op_none_refuses_slices_that_it_could_not_combine(model):
    data, y = rng.standard_normal((23, 4)), rng.standard_normal((4, 2))
    with pytest.raises(ValueError, match="output 2 has op None .* num_slices=1"):
        model.f(data, y, num_slices=2)
    plain = model.f.as_pytensor(data, y, output_subset=[0, 1])
    sliced = model.f(data, y, num_slices=2, output_subset=[0, 1])  # without it: fine
    for got, want in zip(sliced, plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL)


# -- build_inputs ------------------------------------------------------------------------------
def test_build_inputs_flags_per_input_and_names(model):
    x_data, y_data = model.f.build_inputs(np.ones((5, 4)), y=np.ones((4, 2)),
                                          minibatch=[False, True])
    assert (x_data.minibatch, y_data.minibatch) == (False, True)
    single = model.one.build_inputs(np.ones((3, 4)))
    assert isinstance(single, synk.Data) and single.shape == (3, 4)
    with pytest.raises(ValueError, match="one flag per input"):
        model.f.build_inputs(np.ones((5, 4)), np.ones((4, 2)), minibatch=[True])


# -- givens onto sliceable shared variables -------------------------------------------------
def test_givens_onto_sliceable_shareds(model):
    n = synk.n_parallel()
    X, T = rng.standard_normal((31, 3)), rng.standard_normal(31)
    synk.scatter([model.s_x, model.s_t], [X, T])
    plain = model.loss_plain(X, T)
    for kwargs in ({}, {"num_slices": 3}):
        result = model.loss(**kwargs)
        for got, want in zip(result, plain, strict=True):
            np.testing.assert_allclose(got, want, rtol=RTOL)
    # batch_s: the same rows of every process's block
    pick = slice(1, 4)
    rows = np.concatenate([np.arange(lo, hi)[pick] for lo, hi in split_bounds(31, n)])
    plain = model.loss_plain(X[rows], T[rows])
    result = model.loss(batch_s=pick, num_slices=2)
    for got, want in zip(result, plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL)


def test_unused_sliceable_shared_is_named(model):
    x = pt.dvector("x")
    used = pytensor.shared(np.zeros(3), name="used")
    unused = pytensor.shared(np.zeros(3), name="stale_data")
    with pytest.raises(ValueError, match=r"sliceable_shareds\[1\] 'stale_data' is not used"):
        synk.function([x], (x.sum() + used.sum(), "sum"), sliceable_shareds=[used, unused])


# -- Data: safe upcasts ----------------------------------------------------------------------
def test_data_takes_safe_upcasts(model):
    labels = synk.data(np.zeros(4, dtype="int32"))
    labels.set_value(np.array([1, 2, 3, 250], dtype="uint8"))
    assert labels.dtype == np.int32 and labels.data.tolist() == [1, 2, 3, 250]
    made = synk.data(np.arange(3, dtype="uint8"), dtype="int32")
    assert made.dtype == np.int32
    wide = synk.data(np.zeros(2))
    wide.set_value(np.array([0.5, 1.5], dtype="float32"))
    assert wide.data.tolist() == [0.5, 1.5]
    narrow = synk.data(np.zeros(2, dtype="float32"))
    with pytest.raises(TypeError, match="does not cast to it safely"):
        narrow.set_value(np.zeros(2))  # float64 into float32 loses precision
    assert narrow.dtype == np.float32


# -- collectives: different lengths, names, nccl ---------------------------------------------
def test_scatter_splits_each_value_on_its_own(model):
    n = synk.n_parallel()
    A, B = rng.standard_normal(11), rng.standard_normal((5, 2))
    synk.scatter([model.a, model.b], [A, B])
    for rank in range(n):
        lo, hi = rank_rows(11, n, rank)
        np.testing.assert_array_equal(synk.get_value(rank, model.a), A[lo:hi])
        lo, hi = rank_rows(5, n, rank)
        np.testing.assert_array_equal(synk.get_value(rank, model.b), B[lo:hi])
    total = model.ab()
    np.testing.assert_allclose(total, [A.sum(), B.sum()], rtol=RTOL)
    synk.scatter([model.a, model.b], [A, B], batch=slice(0, 4))
    np.testing.assert_allclose(model.ab(), [A[:4].sum(), B[:4].sum()], rtol=RTOL)


def test_collectives_take_names_and_nccl(model):
    n = synk.n_parallel()
    synk.broadcast("w", np.array([1.0, 2.0, 3.0]), nccl=False)
    np.testing.assert_array_equal(synk.get_value(n - 1, "w"), [1.0, 2.0, 3.0])
    synk.all_reduce(["w"], op="sum", nccl=True)
    np.testing.assert_array_equal(synk.get_value(0, model.w), [n, 2.0 * n, 3.0 * n])
    stacked = synk.gather("w", nd_up=1, nccl=True)
    assert stacked.shape == (n, 3)
    synk.all_gather("s_x", nccl=True)
    assert synk.reduce("w", op="max", in_place=False, nccl=True).shape == (3,)
    with pytest.raises(ValueError, match="no shared variable named 'nope'"):
        synk.all_reduce("nope")
    model.w.set_value(np.array([0.5, -1.0, 2.0]))
    synk.broadcast(model.w)


def test_ambiguous_name_is_refused(model):
    one = pytensor.shared(np.zeros(2), name="twin")
    two = pytensor.shared(np.zeros(2), name="twin")
    synk.function([], [(one.sum(), "sum"), (two.sum(), "sum")])
    synk.distribute()
    with pytest.raises(ValueError, match="2 shared variables .* are named 'twin'"):
        synk.broadcast("twin")


# -- as_pytensor ----------------------------------------------------
def test_as_pytensor_takes_output_subset(model):
    data, y = rng.standard_normal((9, 4)), rng.standard_normal((4, 2))
    full = model.f.as_pytensor(data, y)
    part = model.f.as_pytensor(data, y, output_subset=[3, 0])
    np.testing.assert_array_equal(part[0], full[3])
    np.testing.assert_array_equal(part[1], full[0])
    subset = model.f(data, y, output_subset=[3, 0])
    np.testing.assert_allclose(subset[0], full[3], rtol=RTOL)


# -- extensions: the original's helpers and make_train_function form ---------------------------
def test_flat_helpers_round_trip():
    params = [pytensor.shared(rng.standard_normal((2, 3)), name="p0"),
              pytensor.shared(rng.standard_normal(4), name="p1")]
    assert updates.vars_flat_size(params) == 10
    flat = updates.flatten_vars(params)
    values = pytensor.function([], flat)()
    np.testing.assert_array_equal(values[:6], params[0].get_value().ravel())
    pieces = pytensor.function([], updates.unflatten_vars(flat, params))()
    for piece, param in zip(pieces, params, strict=True):
        np.testing.assert_array_equal(piece, param.get_value())
    loss = (params[0] ** 2).sum() + params[1].sum()
    grad_shared, flat_grad, unflat = updates.flat_unflat_grads(loss, params)
    step = pytensor.function([], [], updates=[(grad_shared, flat_grad)])
    step()
    np.testing.assert_allclose(pytensor.function([], unflat[0])(),
                               2 * params[0].get_value(), rtol=RTOL)
    holders, grads = updates.nonflat_grads(loss, params)
    assert [h.get_value().shape for h in holders] == [(2, 3), (4,)] and len(grads) == 2


def _tiny_problem(seed):
    r = np.random.default_rng(seed)
    W = pytensor.shared(r.standard_normal((3, 2)) * 0.3, name="W")
    b = pytensor.shared(np.zeros(2), name="b")
    x, y = pt.dmatrix("x"), pt.dmatrix("y")
    loss = ((x.dot(W) + b - y) ** 2).mean()
    return [W, b], x, y, loss


def test_make_train_function_in_the_originals_form(model):
    """``make_train_function(loss, params, x, y, rule, lr, ...)`` equals the serial rule."""
    n = synk.n_parallel()
    X, Y = rng.standard_normal((50, 3)), rng.standard_normal((50, 2))
    batches = [slice(0, 17), slice(17, 34), slice(34, 50)]
    params, x, y, loss = _tiny_problem(3)
    serial = synk_train.make_train_function_theano(loss, params, x, y, updates.momentum,
                                                   lr=0.05, momentum=0.8)
    for batch in batches:
        serial(X[batch], Y[batch])
    expected = [p.get_value() for p in params]
    params, x, y, loss = _tiny_problem(3)
    train = synk_train.make_train_function(loss, params, x, y, updates.momentum, 0.05,
                                           momentum=0.8)
    xd, yd = synk.data(X), synk.data(Y)
    for batch in batches:
        train(xd, yd, batch=batch)
    for param, want in zip(params, expected, strict=True):
        for rank in range(n):
            np.testing.assert_allclose(synk.get_value(rank, param), want, rtol=RTOL)


def test_apply_momentum_is_lasagnes_momentum():
    """apply_momentum over plain SGD updates equals the momentum rule."""
    X, Y = rng.standard_normal((20, 3)), rng.standard_normal((20, 2))
    results = []
    for build in ("apply", "rule"):
        params, x, y, loss = _tiny_problem(5)
        if build == "apply":
            grads = pytensor.grad(loss, params)
            plain = [(p, p - 0.1 * g) for p, g in zip(params, grads, strict=True)]
            step = pytensor.function([x, y], loss,
                                     updates=updates.apply_momentum(plain, momentum=0.7))
        else:
            step = synk_train.make_train_function_pytensor(loss, params, [x, y], "momentum",
                                                           learning_rate=0.1, momentum=0.7)
        for _ in range(3):
            step(X, Y)
        results.append([p.get_value() for p in params])
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(TypeError, match="got both lr and learning_rate"):
        updates.sgd(loss, params, learning_rate=0.1, lr=0.1)


def test_a_deep_graph_distributes(model):
    """Pickling nests once per level of a graph: a chain of 300 ops passes Python's default
    recursion limit, which the original raised for the whole program on import."""
    x = pt.dvector("x")
    w = pytensor.shared(1.0, name="depth_w")
    y = x
    for _ in range(300):
        y = y * w + 1.0
    f = synk.function([x], (y.sum(), "sum"), mode="FAST_COMPILE")
    synk.distribute()
    np.testing.assert_allclose(f(np.zeros(6)), f.as_pytensor(np.zeros(6)), rtol=RTOL)
