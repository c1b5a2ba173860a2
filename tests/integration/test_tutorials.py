"""The Theano tutorials' pattern at n_parallel 1, 2, 3, against the plain function.

Data in shared variables held whole by every process, ``inputs=[index]``, and
``givens`` that slice a minibatch out of the data: each process runs its block of the
slice (the rule that splits scattered rows, uneven at 7 rows over 2 or 3), the scalar
inputs are broadcast, outputs reduce as for scattered rows. Also: casts of shared
variables in ``sliceable_shareds``, and the refusals at build time.
"""

from __future__ import annotations

import functools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions.train import make_train_function, make_train_function_pytensor
from synkhronos.testing import rank_values, set_rank_values, split_bounds

from ..conftest import session_fixture

RTOL = 1e-10
rng = np.random.default_rng(5)
X = rng.normal(size=(50, 4))
LABELS = rng.integers(0, 3, size=50).astype("float64")  # floats, cast like the tutorials'
W0 = rng.normal(size=(4, 3)) * 0.1


def _model(W, x, y):
    p = pt.special.softmax(x.dot(W), axis=-1)
    cost = -pt.log(p[pt.arange(y.shape[0]), y]).mean()
    return p, cost, pytensor.grad(cost, W)


class Model:
    """Functions every test of a session shares, with their serial twins."""

    def __init__(self):
        self.data_x = pytensor.shared(X, name="data_x")
        self.data_y = pytensor.shared(LABELS, name="data_y")
        labels = pt.cast(self.data_y, "int32")
        self.W = pytensor.shared(W0.copy(), name="W")
        index, size = pt.lscalar("index"), pt.lscalar("size")
        x, y = pt.dmatrix("x"), pt.ivector("y")
        p, cost, grad = _model(self.W, x, y)
        givens = {x: self.data_x[index * size:(index + 1) * size],
                  y: labels[index * size:(index + 1) * size]}
        outputs = [cost, (cost * y.shape[0], "sum"), (p.argmax(axis=1), "gather"),
                   (p, "gather")]
        self.evaluate = synk.function([index, size], outputs, givens=givens)
        self.evaluate_serial = pytensor.function([index, size], [o if not isinstance(o, tuple)
                                                                 else o[0] for o in outputs],
                                                 givens=givens)
        self.lr = 0.5
        self.train = synk.function([index, size], cost, givens=givens,
                                   updates=[(self.W, self.W - self.lr * grad)])
        self.grad_serial = pytensor.function([x, y], grad)
        # The original's sliceable_shareds, with the labels as a cast of the shared.
        xs = pt.dmatrix("xs")
        _, cost_s, _ = _model(self.W, xs, y)
        self.sliceable = synk.function(
            [], [(cost_s * y.shape[0], "sum")], givens=[(xs, self.data_x), (y, labels)],
            sliceable_shareds=[self.data_x, labels])
        self.cost_serial = pytensor.function([xs, y], cost_s * y.shape[0])
        synk.distribute()


model = session_fixture(Model)


def assert_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize(("index", "size"),
                         [(0, 7), (3, 7), (7, 7), (0, 50), (1, 20), (2, 20), (9, 7), (0, 1)],
                         ids=["first", "middle", "last-short", "all", "20", "end-short",
                              "past-end", "one-row"])
def test_slice_pattern_matches_serial(model, index, size):
    try:
        want = model.evaluate_serial(index, size)
    except MemoryError:  # PyTensor 2.38's LogSoftmax refuses no rows: so does the master
        with pytest.raises(synk.WorkerError, match="MemoryError"):
            model.evaluate(index, size)
        return
    got = model.evaluate(index, size)
    if size * index >= 50:  # an empty slice: the serial mean is nan, the gathers empty
        assert np.isnan(got[0]) and np.isnan(want[0])
        assert all(np.shape(g) == np.shape(w) for g, w in zip(got, want, strict=True))
        return
    assert_close(got, want)
    assert_close(model.evaluate.as_pytensor(index, size), want)


def test_scalars_are_broadcast(model):
    assert model.evaluate.inputs == []
    assert [v.name for v in model.evaluate.bcast_inputs] == ["index", "size"]
    assert_close(model.evaluate(size=7, index=2), model.evaluate_serial(2, 7))


def test_index_given_as_a_broadcast_input_divides_the_rows_too(model):
    index, x = pt.lscalar("index"), pt.dmatrix("x")
    f = synk.function([], [(x.shape[0], "gather"), (x, "gather")], bcast_inputs=[index],
                      givens={x: model.data_x[index * 9:(index + 1) * 9]})
    counts, rows = f(2)
    assert list(counts) == [hi - lo for lo, hi in split_bounds(9, synk.n_parallel())]
    np.testing.assert_array_equal(rows, X[18:27])


@pytest.mark.parametrize("num_slices", [2, 3])
def test_slices_of_the_slice_match_serial(model, num_slices):
    got = model.evaluate(1, 20, num_slices=num_slices)
    assert_close(got, model.evaluate_serial(1, 20))


def test_updates_apply_locally_on_each_process_block(model):
    n = synk.n_parallel()
    set_rank_values(model.W, [W0] * n)
    index, size = 1, 17
    rows = np.arange(index * size, (index + 1) * size)
    wants = [W0 - model.lr * model.grad_serial(X[rows[lo:hi]],
                                               LABELS[rows[lo:hi]].astype("int32"))
             for lo, hi in split_bounds(size, n)]  # the gradient at W0, before the step
    model.train(index, size)
    for value, want in zip(rank_values(model.W), wants, strict=True):
        np.testing.assert_allclose(value, want, rtol=RTOL)


def test_sgd_with_all_reduce_is_the_serial_sgd(model):
    """Batches of 6 split evenly at n = 1, 2, 3: the average of the processes' SGD
    steps is the serial step."""
    n = synk.n_parallel()
    set_rank_values(model.W, [W0] * n)
    serial = W0.copy()
    for index in range(8):
        rows = slice(index * 6, (index + 1) * 6)
        model.W.set_value(serial)  # the master's W is the serial W before each step
        step = model.lr * model.grad_serial(X[rows], LABELS[rows].astype("int32"))
        model.train(index, 6)
        serial = serial - step
        synk.all_reduce(model.W, op="avg")
    for value in rank_values(model.W):
        np.testing.assert_allclose(value, serial, rtol=1e-9)
    set_rank_values(model.W, [W0] * n)


def test_cast_of_a_shared_counts_as_the_shared(model):
    n = synk.n_parallel()
    set_rank_values(model.W, [W0] * n)
    got = model.sliceable(batch_s=slice(2, 12))
    want = sum(model.cost_serial(X[2:12], LABELS[2:12].astype("int32")) for _ in range(n))
    np.testing.assert_allclose(got, want, rtol=RTOL)
    assert model.sliceable.sliceable_shareds == [model.data_x, model.data_y]


def test_refusals_at_build(model):
    data = pytensor.shared(X, name="data")
    index, x = pt.lscalar("index"), pt.dmatrix("x")
    with pytest.raises(ValueError, match=r"input 0 \('index'\) is a scalar.*bcast_inputs.*"
                                         r"index \* bs"):
        synk.function([index, x], (x * index).sum())
    given = {x: data[index * 5:(index + 1) * 5]}
    with pytest.raises(ValueError, match=r"input 1 \('other'\) would be scattered"):
        synk.function([index, pt.dmatrix("other")], x.sum(), givens=given)
    with pytest.raises(ValueError, match="sliced by two givens with different bounds"):
        x2 = pt.dmatrix("x2")
        synk.function([index], (x + x2).sum(),
                      givens={x: data[index:index + 5], x2: data[index + 1:index + 6]})
    with pytest.raises(ValueError, match="'unused'.*not used"):
        synk.function([index, pt.lscalar("unused")], x.sum(), givens=given)
    with pytest.raises(TypeError, match="elementwise view"):
        synk.function([], x.sum(), givens={x: data * pt.dmatrix("m")},
                      sliceable_shareds=[data * pt.dmatrix("m")])
    f = synk.function([index], x.sum(), givens=given)  # index broadcast: accepted
    assert f.bcast_inputs == [index]


def test_slices_that_select_different_row_counts_are_refused(model):
    a, b = pytensor.shared(X[:20], name="a"), pytensor.shared(X, name="b")
    index, x, z = pt.lscalar("index"), pt.dmatrix("x"), pt.dmatrix("z")
    f = synk.function([index], ((x + z).sum(), "sum"), givens={x: a[index:index + 10],
                                                                z: b[index:index + 10]})
    assert np.isclose(f(3), (X[3:13] * 2).sum())
    with pytest.raises(ValueError, match="same number of rows.*2 of 'a', 10 of 'b'"):
        f(18)


def _logistic_regression(n_in, n_out):
    """The tutorials' LogisticRegression (logistic_sgd.py), in PyTensor."""
    W = pytensor.shared(np.zeros((n_in, n_out)), name="W")
    b = pytensor.shared(np.zeros(n_out), name="b")
    x, y = pt.dmatrix("x"), pt.ivector("y")
    p_y_given_x = pt.special.softmax(x.dot(W) + b, axis=-1)
    y_pred = pt.argmax(p_y_given_x, axis=1)
    nll = -pt.mean(pt.log(p_y_given_x)[pt.arange(y.shape[0]), y])
    errors = pt.mean(pt.neq(y_pred, y))
    return x, y, (W, b), nll, errors


def _train(make, n_epochs, data):
    """Train as logistic_sgd.py does: one minibatch index after another."""
    train_x, train_y, valid_x, valid_y = (pytensor.shared(v) for v in data)
    x, y, params, cost, errors = _logistic_regression(64, 10)
    index, batch_size, learning_rate = pt.lscalar("index"), 600, 0.13
    grads = pytensor.grad(cost, params)
    train_model = make(
        inputs=[index], outputs=cost,
        updates=[(p, p - learning_rate * g) for p, g in zip(params, grads, strict=True)],
        givens={x: train_x[index * batch_size:(index + 1) * batch_size],
                y: pt.cast(train_y, "int32")[index * batch_size:(index + 1) * batch_size]})
    validate_model = make(
        inputs=[index], outputs=errors,
        givens={x: valid_x[index * batch_size:(index + 1) * batch_size],
                y: pt.cast(valid_y, "int32")[index * batch_size:(index + 1) * batch_size]})
    parallel = make is synk.function
    if parallel:
        synk.distribute()
    printed = []
    n_train = len(data[0]) // batch_size
    n_valid = len(data[2]) // batch_size
    for epoch in range(n_epochs):
        costs = []
        for minibatch_index in range(n_train):
            costs.append(float(train_model(minibatch_index)))
            if parallel:
                synk.all_reduce(list(params), op="avg")
        loss = np.mean([validate_model(i) for i in range(n_valid)])
        printed.append(f"epoch {epoch}, cost {np.mean(costs):.12f}, "
                       f"validation error {loss * 100:.6f} %")
    return printed


@functools.cache
def _digits():
    datasets = pytest.importorskip("sklearn.datasets", reason="needs scikit-learn")
    digits = datasets.load_digits()
    X_all = digits.data / 16.0
    y_all = digits.target.astype("float64")
    data = (X_all[:1200], y_all[:1200], X_all[1197:], y_all[1197:])  # 2 + 1 batches
    return data, _train(pytensor.function, 3, data)


def test_logistic_sgd_port_prints_the_serial_numbers(model):
    """The tutorials' batch of 600 splits evenly at n = 1, 2, 3."""
    data, serial = _digits()
    assert _train(synk.function, 3, data) == serial


def _nll_model():
    W = pytensor.shared(W0.copy(), name="W_train")
    b = pytensor.shared(np.zeros(3), name="b_train")
    x, y = pt.dmatrix("x"), pt.ivector("y")
    p = pt.special.softmax(x.dot(W) + b, axis=-1)
    return x, y, [W, b], -pt.log(p[pt.arange(y.shape[0]), y]).mean()


def _serial_steps(minibatches):
    """The same rule in one plain PyTensor process, on the same minibatches."""
    x, y, params, loss = _nll_model()
    train = make_train_function_pytensor(loss, params, [x, y], "adam", learning_rate=0.05)
    losses = [float(train(X[rows], LABELS[rows].astype("int32"))) for rows in minibatches]
    return losses, [p.get_value() for p in params]


def _assert_trained_like(losses, params, minibatches):
    want_losses, want_params = _serial_steps(minibatches)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
    for param, want in zip(params, want_params, strict=True):
        for value in rank_values(param):  # the same parameters in every process
            np.testing.assert_allclose(value, want, rtol=1e-9, atol=1e-12)


def test_make_train_function_on_minibatches_sliced_by_givens(model):
    """Minibatches of 7 (uneven at n = 2, 3; the last one, 1 row, leaves processes
    without rows): each step is exactly the serial step."""
    x, y, params, loss = _nll_model()
    index = pt.lscalar("index")
    labels = pt.cast(model.data_y, "int32")
    train = make_train_function(
        loss, params, [index], "adam", learning_rate=0.05,
        givens={x: model.data_x[index * 7:(index + 1) * 7], y: labels[index * 7:(index + 1) * 7]})
    assert train.form == "slice"
    losses = [float(train(i)) for i in range(8)]
    _assert_trained_like(losses, params, [slice(i * 7, (i + 1) * 7) for i in range(8)])


def test_make_train_function_on_sliceable_shareds_with_batch_s(model):
    """Every process holds the whole data; batch_s gives each its part of the serial
    minibatch (one slice per process), so each step is the serial step."""
    x, y, params, loss = _nll_model()
    labels = pt.cast(model.data_y, "int32")
    train = make_train_function(loss, params, [], "adam", learning_rate=0.05,
                                givens=[(x, model.data_x), (y, labels)],
                                sliceable_shareds=[model.data_x, labels])
    assert train.form == "sliceable"
    minibatches, losses = [], []
    for start, size in [(0, 7), (7, 11), (18, 2), (20, 30)]:
        parts = split_bounds(size, synk.n_parallel())
        losses.append(float(train(batch_s=[slice(start + lo, start + hi) for lo, hi in parts])))
        minibatches.append(slice(start, start + size))
    _assert_trained_like(losses, params, minibatches)
    with pytest.raises(ValueError, match="sliceable_shareds.*inputs must be empty"):
        make_train_function(loss, params, [x], "sgd", learning_rate=0.1,
                            givens=[(y, labels)], sliceable_shareds=[labels])
