"""make_train_function and the update recipe at n_parallel 1, 2, 3 against numpy.

Every rule trains softmax regression for several uneven (shuffled) minibatches, some
shorter than n_parallel, and after the steps the parameters of EVERY process must
equal the numpy reference of ``tests/unit/test_updates_unit.py`` (the rule applied to
the full minibatch's mean gradient) to float64 round-off. Each session builds all its
train functions once (``Trainers``) and every test resets the state it uses with one
broadcast; the graphs are the same for every n, so later sessions load them from the
compile cache.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.extensions import TrainFunction, make_train_function, updates
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


class Trainers:
    """Every rule's train function, and the documented recipe for sgd, in one session."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.train: dict[str, TrainFunction] = {}
        self.unsharded: dict[str, TrainFunction] = {}
        for name in RULE_NAMES:
            params = new_params()
            x, y, loss = symbolic_model(params)
            self.train[name] = make_train_function(loss, params, [x, y], name, **HYPER[name])
            if n > 1:  # with several processes the default is sharded: the other form too
                params = new_params()
                x, y, loss = symbolic_model(params)
                self.unsharded[name] = make_train_function(loss, params, [x, y], name,
                                                           sharded=False, **HYPER[name])
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
        train = self.train[name] if sharded or self.n == 1 else self.unsharded[name]
        synk.broadcast(train.params, initial_params())
        train.reset_state()
        return train, NumpyRule(name, initial_params(), **HYPER[name])

    def assert_params_everywhere(self, params: list, want: list) -> None:
        for rank in range(self.n):
            got = synk.get_value(rank, params)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL,
                                           err_msg=f"rank {rank}")


def skip_sharded_on_device(sharded: bool) -> None:
    if sharded and DEVICE == "gpu":
        pytest.skip("device='gpu' has no sharded update (JAX arrays cannot be viewed and "
                    "updated in place); its unsharded form is tested")


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
    skip_sharded_on_device(sharded)
    train, reference = trainers.reset(name, sharded)
    assert train.sharded == (sharded and trainers.n > 1)
    for idx in MINIBATCHES:
        loss = train(trainers.xd, trainers.yd, batch=idx)
        np.testing.assert_allclose(loss, reference.train(X[idx], Y[idx]), rtol=RTOL)
    trainers.assert_params_everywhere(train.params, reference.params)


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
def test_slices_and_every_batch_form_equal_serial(trainers, sharded):
    skip_sharded_on_device(sharded)
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
    """Adam's moments: each process holds its piece only, the pieces tile the whole."""
    train, _ = trainers.reset("adam")
    train(trainers.xd, trainers.yd, batch=MINIBATCHES[0])
    size = sum(p.get_value().size for p in train.params)
    if not train.sharded:
        return
    moments = [var for var in train.state if var.ndim == 1]
    assert len(moments) == 2  # m and v
    for var in moments:
        lengths = [len(value) for value in rank_values(var)]
        assert sum(lengths) == size
        if trainers.n > 1:
            assert max(lengths) <= size // trainers.n + 16  # a piece ends on a cache line
    if trainers.n > 1:  # unsharded, every process holds the whole of m and v
        full = [var for var in trainers.unsharded["adam"].state if var.ndim]
        assert sum(var.get_value().size for var in full) == 2 * size


def test_a_training_step_is_one_command(trainers):
    train, _ = trainers.reset("momentum")
    for idx in (MINIBATCHES[1], MINIBATCHES[4]):  # 13 rows, and 1 row (fewer than n)
        train(trainers.xd, trainers.yd, batch=idx, num_slices=2)  # variants distributed
        before = commands_run()
        train(trainers.xd, trainers.yd, batch=idx, num_slices=2)
        assert commands_run() == before + 1


def test_grad_shared_holds_the_minibatch_mean_gradient_everywhere(trainers):
    train, reference = trainers.reset("sgd")
    idx = MINIBATCHES[1]
    _, grads = numpy_loss_and_grads(reference.params, X[idx], Y[idx])
    train(trainers.xd, trainers.yd, batch=idx, num_slices=2)
    want = np.concatenate([g.ravel() for g in grads])
    pieces = synk.steps.pieces(train.grad_shared) if train.sharded else None
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
    assert train.grad_shared.get_value().shape == (18,)
    assert train.update_rule is updates.adam
