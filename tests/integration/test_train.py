"""make_train_function and the update recipe at n_parallel 1, 2, 3 against numpy.

Every rule, sharded and not (sharded at n=1 too: one piece), trains softmax regression
for several uneven (shuffled) minibatches, some shorter than n_parallel, and after the
steps the parameters of EVERY process must equal the numpy reference of
``tests/unit/test_updates_unit.py`` (the rule applied to the full minibatch's mean
gradient) to float64 round-off. On ``device="gpu"`` (the stand-in in CI) the sharded
form is the JAX backend's, pieces of one length: its pieces, their padding, and its
agreement with the unsharded form and ``make_train_function_pytensor`` are checked
too. Each session builds all its train functions once (``Trainers``) and every test
resets the state it uses with one broadcast; the graphs are the same for every n, so
later sessions load them from the compile cache.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.extensions import (
    TrainFunction,
    make_train_function,
    make_train_function_pytensor,
    updates,
)
from synkhronos.testing import commands_run, rank_values
from tests.unit.test_updates_unit import (
    CUSTOM,
    RULE_NAMES,
    NumpyRule,
    default_hyper,
    initial_params,
    make_data,
    numpy_loss_and_grads,
    symbolic_model,
)

from ..conftest import DEVICE, sizes_to_run

pytestmark = pytest.mark.timeout(240)

RTOL, ATOL = 1e-10, 1e-13
# Half the rules train with their defaults, half with every hyper-parameter given.
HYPER = {name: CUSTOM[name] if i % 2 else default_hyper(name)
         for i, name in enumerate(RULE_NAMES)}
X, Y = make_data(rows=40, seed=3)
rng = np.random.default_rng(4)
# Uneven minibatches, shuffled; the last two are shorter than 3 processes.
MINIBATCHES = [rng.permutation(40)[:size] for size in (7, 13, 5, 2, 1)]


def new_params() -> list:
    return [pytensor.shared(v, name=n) for v, n in zip(initial_params(), "Wb", strict=True)]


def build(name: str, **kwargs) -> TrainFunction:
    params = new_params()
    x, y, loss = symbolic_model(params)
    return make_train_function(loss, params, [x, y], name, **HYPER[name], **kwargs)


class Trainers:
    """Every rule's train function in both forms, one with the default form, and the
    documented recipe for sgd, in one session."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.train = {name: build(name, sharded=True) for name in RULE_NAMES}
        self.unsharded = {name: build(name, sharded=False) for name in RULE_NAMES}
        self.default = build("sgd")
        self.recipe_params = new_params()
        x, y, loss = symbolic_model(self.recipe_params)
        grad_updates, param_updates, self.recipe_grad = updates.sgd(
            loss, self.recipe_params, learning_rate=0.2)
        self.recipe_grad_fn = synk.function([x, y], loss, updates=grad_updates)
        self.recipe_apply = synk.function([], updates=param_updates)
        synk.distribute()
        self.xd, self.yd = synk.data(X), synk.data(Y)

    def reset(self, name: str, sharded: bool = True) -> tuple[TrainFunction, NumpyRule]:
        """Parameters back to their start, rule state to zero, in every process."""
        train = self.train[name] if sharded else self.unsharded[name]
        synk.broadcast(train.params, initial_params())
        train.reset_state()
        return train, NumpyRule(name, initial_params(), **HYPER[name])

    def assert_params_everywhere(self, params: list, want: list) -> None:
        for rank in range(self.n):
            got = synk.get_value(rank, params)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL,
                                           err_msg=f"rank {rank}")


@pytest.fixture(scope="module", params=sizes_to_run([1, 2, 3]), ids=lambda n: f"n{n}")
def trainers(request):
    synk.fork(request.param, device=DEVICE)
    try:
        yield Trainers(request.param)
    finally:
        synk.close()


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
@pytest.mark.parametrize("name", RULE_NAMES)
def test_every_rule_equals_the_serial_rule_in_every_process(trainers, name, sharded):
    train, reference = trainers.reset(name, sharded)
    assert train.sharded == sharded
    for idx in MINIBATCHES:
        loss = train(trainers.xd, trainers.yd, batch=idx)
        np.testing.assert_allclose(loss, reference.train(X[idx], Y[idx]), rtol=RTOL)
    trainers.assert_params_everywhere(train.params, reference.params)


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
def test_slices_and_every_batch_form_equal_serial(trainers, sharded):
    train, reference = trainers.reset("adam", sharded)
    steps = [
        ((trainers.xd, trainers.yd), 13, 2, np.arange(13)),
        ((trainers.xd, trainers.yd), slice(5, 30), 3, np.arange(5, 30)),
        ((trainers.xd, trainers.yd), rng.permutation(40)[:17], 4, None),
        ((X[:9], Y[:9]), None, 2, np.arange(9)),
        ((X, Y), [38, 2], 5, np.array([38, 2])),
    ]
    for data, batch, num_slices, rows in steps:
        rows = batch if rows is None else rows
        loss = train(*data, batch=batch, num_slices=num_slices)
        np.testing.assert_allclose(loss, reference.train(X[rows], Y[rows]), rtol=RTOL)
    trainers.assert_params_everywhere(train.params, reference.params)


def test_sharded_state_is_split_over_the_processes(trainers):
    """Adam's moments: each process holds its piece only, the pieces tile the whole (on
    the JAX backend: pieces of one length, padded at the end)."""
    train, _ = trainers.reset("adam")
    train(trainers.xd, trainers.yd, batch=MINIBATCHES[0])
    size = sum(p.get_value().size for p in train.params)
    n = trainers.n
    even = {1: 24, 2: 16, 3: 8}[n]  # ceil(18 / n) rounded up to a cache line of float64
    assert synk.steps.piece_length(size, "float64") == even
    with pytest.raises(ValueError, match="needs a size >= 1; got 0"):
        synk.steps.piece_length(0, "float64")
    moments = [var for var in train.state if var.ndim == 1]
    assert len(moments) == 2  # m and v
    for var in moments:
        lengths = [len(value) for value in rank_values(var)]
        if DEVICE == "gpu":  # the JAX backend's pieces: one length
            assert lengths == [even] * n
        else:
            assert sum(lengths) == size
            assert max(lengths) <= size // n + 16  # a piece ends on a cache line
    # unsharded, every process holds the whole of m and v
    full = [var for var in trainers.unsharded["adam"].state if var.ndim]
    assert sum(var.get_value().size for var in full) == 2 * size


def test_a_training_step_is_one_command(trainers):
    train, _ = trainers.reset("momentum")
    for idx in (MINIBATCHES[1], MINIBATCHES[4]):  # 13 rows, and 1 row (fewer than n)
        train(trainers.xd, trainers.yd, batch=idx, num_slices=2)  # variants distributed
        before = commands_run()
        train(trainers.xd, trainers.yd, batch=idx, num_slices=2)
        assert commands_run() == before + 1


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
def test_grad_shared_holds_the_minibatch_mean_gradient_everywhere(trainers, sharded):
    train, reference = trainers.reset("sgd", sharded)
    idx = MINIBATCHES[1]
    _, grads = numpy_loss_and_grads(reference.params, X[idx], Y[idx])
    train(trainers.xd, trainers.yd, batch=idx, num_slices=2)
    want = np.concatenate([g.ravel() for g in grads])
    # (pieces of one length: the padding past the parameters holds zeros)
    want = np.pad(want, (0, train.grad_shared.get_value().size - want.size))
    pieces = synk.steps.pieces(train.grad_shared) if sharded else None
    for rank in range(trainers.n):
        got = synk.get_value(rank, train.grad_shared)
        if pieces is not None:  # sharded: each process holds its piece of it
            start, stop = pieces[rank]
            got, rank_want = got[start:stop], want[start:stop]
        else:
            rank_want = want
        np.testing.assert_allclose(got, rank_want, rtol=RTOL, atol=ATOL)


def test_documented_recipe_with_an_even_split(trainers):
    """all_reduce(op="avg") weights processes equally: exact when rows split evenly."""
    params = trainers.recipe_params
    synk.broadcast(params, initial_params())
    reference = NumpyRule("sgd", initial_params(), learning_rate=0.2)
    for start in (0, 6, 12):
        idx = np.arange(start, start + 6)  # 6 rows split evenly over 1, 2 or 3
        trainers.recipe_grad_fn(trainers.xd, trainers.yd, batch=idx)
        synk.all_reduce(trainers.recipe_grad, op="avg")
        trainers.recipe_apply()
        reference.train(X[idx], Y[idx])
    trainers.assert_params_everywhere(params, reference.params)


def test_bad_calls_raise_before_anything_changes(trainers):
    train, reference = trainers.reset("momentum")
    with pytest.raises(TypeError, match="one data argument per input"):
        train(trainers.xd)
    with pytest.raises(ValueError, match="selects no rows"):
        train(trainers.xd, trainers.yd, batch=slice(3, 3))
    with pytest.raises(ValueError, match="out of range"):
        train(trainers.xd, trainers.yd, batch=[0, 40])
    trainers.assert_params_everywhere(train.params, reference.params)


def test_the_step_functions_are_exposed(trainers):
    train = trainers.train["adam"]
    assert isinstance(train.grad_function, synk.Function)
    assert isinstance(train.apply_function, synk.Function)
    assert train.grad_function.update_modes == ["sum"]
    padded = {1: 24, 2: 32, 3: 24}[trainers.n]  # n pieces of ceil(18 / n), to a cache line
    assert train.grad_shared.get_value().shape == ((padded,) if DEVICE == "gpu" else (18,))
    assert trainers.unsharded["adam"].grad_shared.get_value().shape == (18,)
    assert train.update_rule is updates.adam


def test_the_default_form_is_sharded_with_several_processes_on_cpu(trainers):
    """On device="gpu" the default stays unsharded (make_train_function says why)."""
    assert trainers.default.sharded == (trainers.n > 1 and DEVICE == "cpu")


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_sharded_unsharded_and_serial_pytensor_take_the_same_steps(trainers, name):
    """The sharded step, the unsharded one and the serial program of plain PyTensor
    functions (make_train_function_pytensor) from the same start: the same losses and
    the same parameters in every process, step after step."""
    sharded, _ = trainers.reset(name, True)
    unsharded, _ = trainers.reset(name, False)
    params = new_params()
    x, y, loss = symbolic_model(params)
    serial = make_train_function_pytensor(loss, params, [x, y], name, **HYPER[name])
    for step, idx in enumerate(MINIBATCHES):
        want = serial(X[idx], Y[idx])
        for train in (sharded, unsharded):
            got = train(trainers.xd, trainers.yd, batch=idx, num_slices=1 + step % 2)
            np.testing.assert_allclose(got, want, rtol=RTOL, err_msg=f"step {step}")
        values = [p.get_value() for p in params]
        trainers.assert_params_everywhere(sharded.params, values)
        trainers.assert_params_everywhere(unsharded.params, values)
