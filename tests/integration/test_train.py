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
import pytensor.tensor as pt
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


# A small float32 MLP for the low-precision exchange (float32 gradients only): its steps
# against the exact step and the serial one. Per format, (rtol of every step's loss,
# atol of the parameters, which start within 0.5 of zero) against the exact step's after
# the 7 Adam steps of learning rate 0.05; measured at n 1, 2 and 3: losses within 2.8e-4
# (bf16) and 7.6e-5 (fp16), parameters within 1.1e-3 and 1.4e-4. Adam divides by the
# gradient's running size: a rounded gradient near zero moves its parameter by up to
# the learning rate, which is why the parameters, not the losses, differ most.
LOW_TOLERANCE = {"bf16": (2e-3, 5e-3), "fp16": (5e-4, 1e-3)}
MLP_HIDDEN = 16
MLP_STEPS = [rng.permutation(40)[:size] for size in (11, 17, 9, 23, 6, 14, 2)]
MLP_VARIANTS = {"exact": {}, "bf16": {"exchange": "bf16", "sharded": True},
                "bf16-unsharded": {"exchange": "bf16", "sharded": False},
                "fp16": {"exchange": "fp16", "sharded": False}}


def mlp_initial() -> list[np.ndarray]:
    rng_mlp = np.random.default_rng(5)
    shapes = [(X.shape[1], MLP_HIDDEN), (MLP_HIDDEN,), (MLP_HIDDEN, 3), (3,)]
    return [(rng_mlp.standard_normal(shape) * 0.5).astype("float32") for shape in shapes]


def mlp_model() -> tuple:
    """Shared float32 parameters, and (x, y, loss) of a one-hidden-layer MLP on them."""
    params = [pytensor.shared(v, name=name)
              for v, name in zip(mlp_initial(), ("W1", "b1", "W2", "b2"), strict=True)]
    w1, b1, w2, b2 = params
    x, y = pt.fmatrix("x"), pt.lvector("y")
    prob = pt.special.softmax(pt.tanh(x.dot(w1) + b1).dot(w2) + b2, axis=1)
    loss = -pt.log(prob[pt.arange(y.shape[0]), y]).mean()
    return params, x, y, loss


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
        # the sharded update where PyTensor may not update in place (a backend that
        # copies): the piece's new value must still reach params_flat
        self.copying = (build("momentum", sharded=True, compile_kwargs={
            "mode": pytensor.compile.mode.get_default_mode().excluding("inplace")})
            if DEVICE == "cpu" else None)
        self.mlp: dict[str, TrainFunction] = {}
        for key, kwargs in MLP_VARIANTS.items():
            params, x, y, loss = mlp_model()
            self.mlp[key] = make_train_function(loss, params, [x, y], "adam",
                                                learning_rate=0.05, **kwargs)
        self.recipe_params = new_params()
        x, y, loss = symbolic_model(self.recipe_params)
        grad_updates, param_updates, self.recipe_grad = updates.sgd(
            loss, self.recipe_params, learning_rate=0.2)
        self.recipe_grad_fn = synk.function([x, y], loss, updates=grad_updates)
        self.recipe_apply = synk.function([], updates=param_updates)
        synk.distribute()
        self.xd, self.yd = synk.data(X), synk.data(Y)
        self.xd32 = synk.data(X.astype("float32"))

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


def _address(var, rank) -> tuple[int, int]:
    value = var.get_value(borrow=True)
    return value.__array_interface__["data"][0], value.nbytes


@pytest.mark.skipif(DEVICE != "cpu", reason="JAX arrays view nothing: the device's sharded "
                    "update copies its pieces (EvenPieceUpdate)")
def test_the_sharded_update_writes_each_piece_in_place(trainers):
    """On the CPU each process's update runs in place on its piece of params_flat (no
    new array, no copy); where the backend copies instead, the new piece still reaches
    params_flat, and every process equals the serial rule."""
    train, reference = trainers.reset("momentum")
    for idx in MINIBATCHES[:2]:  # (the first steps place params_flat in its slot)
        train(trainers.xd, trainers.yd, batch=idx)
    update = train._piece_update
    before = synk.testing.on_variable(update._piece, _address)
    train(trainers.xd, trainers.yd, batch=MINIBATCHES[2])
    flats = synk.testing.on_variable(update.params_flat, _address)
    pieces = synk.testing.on_variable(update._piece, _address)
    assert pieces == before  # the update wrote the same memory
    itemsize = update.params_flat.get_value(borrow=True).itemsize
    for rank, ((flat, _), (piece, nbytes), (start, stop)) in enumerate(
            zip(flats, pieces, update.pieces, strict=True)):
        assert piece == flat + start * itemsize, f"rank {rank}"
        assert nbytes == (stop - start) * itemsize

    copying = trainers.copying
    synk.broadcast(copying.params, initial_params())
    copying.reset_state()
    for idx in MINIBATCHES:
        loss = copying(trainers.xd, trainers.yd, batch=idx)
        np.testing.assert_allclose(loss, reference.train(X[idx], Y[idx]), rtol=RTOL)
    trainers.assert_params_everywhere(copying.params, reference.params)


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


# -- the low-precision exchange of the gradient ------------------------------------------------
def _mlp_run(trainers, key: str) -> tuple[list[float], list[list[np.ndarray]]]:
    """The MLP variant ``key`` trained from the start over MLP_STEPS: each step's loss,
    and every process's parameters at the end."""
    train = trainers.mlp[key]
    synk.broadcast(train.params, mlp_initial())
    train.reset_state()
    losses = [float(train(trainers.xd32, trainers.yd, batch=idx)) for idx in MLP_STEPS]
    return losses, [synk.get_value(rank, train.params) for rank in range(trainers.n)]


def test_mlp_exact_exchange_equals_the_serial_step(trainers):
    """exchange=None (the default) is the exact step: the serial PyTensor rule's."""
    params, x, y, loss = mlp_model()
    serial = make_train_function_pytensor(loss, params, [x, y], "adam", learning_rate=0.05)
    assert trainers.mlp["exact"].exchange is None
    losses, ranks = _mlp_run(trainers, "exact")
    X32 = X.astype("float32")
    want = [float(serial(X32[idx], Y[idx])) for idx in MLP_STEPS]
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for got in ranks:
        for g, w in zip(got, params, strict=True):
            np.testing.assert_allclose(g, w.get_value(), rtol=1e-4, atol=1e-6)


def test_mlp_low_precision_exchange_trains_close_to_the_exact_step(trainers):
    """bf16 and fp16 gradients: every process holds the same parameters, sharded and
    unsharded steps sum the same rounded gradients, and the losses and parameters stay
    within the stated tolerance of the exact step's (and are not the exact step's)."""
    exact_losses, exact_ranks = _mlp_run(trainers, "exact")
    runs = {key: _mlp_run(trainers, key) for key in MLP_VARIANTS if key != "exact"}
    assert trainers.mlp["bf16"].exchange == "bf16"
    assert trainers.mlp["bf16"].sharded and not trainers.mlp["bf16-unsharded"].sharded
    for key, (losses, ranks) in runs.items():
        for other in ranks[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(ranks[0], other, strict=True)), key
        rtol, atol = LOW_TOLERANCE[trainers.mlp[key].exchange]
        np.testing.assert_allclose(losses, exact_losses, rtol=rtol, err_msg=key)
        for got, want in zip(ranks[0], exact_ranks[0], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=key)
        assert not all(np.allclose(got, want, rtol=1e-7, atol=0)
                       for got, want in zip(ranks[0], exact_ranks[0], strict=True)), key
    for got, want in zip(runs["bf16"][1][0], runs["bf16-unsharded"][1][0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_exchange_is_checked_when_the_step_is_built(trainers):
    params = new_params()
    x, y, loss = symbolic_model(params)  # float64
    with pytest.raises(TypeError, match=r"exchange='bf16' rounds float32 gradients; these "
                       r"parameters' gradient is float64 \(leave exchange=None\)"):
        make_train_function(loss, params, [x, y], "sgd", learning_rate=0.1, exchange="bf16")
    params, x, y, loss = mlp_model()
    with pytest.raises(ValueError, match=r"exchange must be None \(exact\), 'bf16' or "
                       r"'fp16'; got 'fp8'"):
        make_train_function(loss, params, [x, y], "sgd", exchange="fp8")
    with pytest.raises(TypeError, match="exchange must be None, 'bf16' or 'fp16'; got bool"):
        make_train_function(loss, params, [x, y], "sgd", exchange=True)
