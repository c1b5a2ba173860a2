"""The update rules in one process, against numpy references written from the math.

Never forks. Graphs compile with PyTensor's Python linker (no Numba), so the suite
stays fast. The numpy model (softmax regression: its loss and exact gradient) and
the numpy rules here are also the references of ``tests/integration/test_train.py``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions import make_train_function, updates

PY_MODE = pytensor.compile.mode.Mode(linker="py", optimizer=None)
RTOL, ATOL = 1e-10, 1e-13

N_FEATURES, N_CLASSES = 5, 3

# Lasagne's defaults, written down independently of the code under test.
DEFAULTS = {
    "sgd": {},
    "momentum": {"momentum": 0.9},
    "nesterov_momentum": {"momentum": 0.9},
    "adagrad": {"learning_rate": 1.0, "epsilon": 1e-6},
    "rmsprop": {"learning_rate": 1.0, "rho": 0.9, "epsilon": 1e-6},
    "adadelta": {"learning_rate": 1.0, "rho": 0.95, "epsilon": 1e-6},
    "adam": {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
    "adamax": {"learning_rate": 0.002, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
}
REQUIRED = {"sgd", "momentum", "nesterov_momentum"}  # learning_rate has no default
RULE_NAMES = list(DEFAULTS)

# Non-default hyper-parameters, one set per rule.
CUSTOM = {
    "sgd": {"learning_rate": 0.3},
    "momentum": {"learning_rate": 0.2, "momentum": 0.5},
    "nesterov_momentum": {"learning_rate": 0.2, "momentum": 0.7},
    "adagrad": {"learning_rate": 0.5, "epsilon": 1e-3},
    "rmsprop": {"learning_rate": 0.1, "rho": 0.8, "epsilon": 1e-4},
    "adadelta": {"learning_rate": 0.7, "rho": 0.5, "epsilon": 1e-2},
    "adam": {"learning_rate": 0.05, "beta1": 0.8, "beta2": 0.9, "epsilon": 1e-4},
    "adamax": {"learning_rate": 0.05, "beta1": 0.7, "beta2": 0.95, "epsilon": 1e-4},
}


def default_hyper(name: str) -> dict:
    """The hyper-parameters a test passes to get the defaults (plus a required rate)."""
    return {"learning_rate": 0.1} if name in REQUIRED else {}


def reference_hyper(name: str, given: dict) -> dict:
    return {**DEFAULTS[name], **given}


# -- the numpy model -------------------------------------------------------------------------
def make_data(rows: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, N_FEATURES))
    y = rng.integers(0, N_CLASSES, size=rows).astype(np.int64)
    return X, y


def initial_params(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(scale=0.5, size=(N_FEATURES, N_CLASSES)), rng.normal(size=N_CLASSES)]


def numpy_loss_and_grads(params: list[np.ndarray], X: np.ndarray, y: np.ndarray
                         ) -> tuple[float, list[np.ndarray]]:
    """Mean cross-entropy of softmax regression and its exact gradient."""
    W, b = params
    logits = X @ W + b
    logits = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(logits)
    prob /= prob.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = -np.log(prob[rows, y]).mean()
    delta = prob.copy()
    delta[rows, y] -= 1
    delta /= len(y)
    return loss, [X.T @ delta, delta.sum(axis=0)]


def symbolic_model(params: list) -> tuple:
    """The same model in PyTensor on shared ``params``: (x, y, loss)."""
    W, b = params
    x, y = pt.dmatrix("x"), pt.lvector("y")
    prob = pt.special.softmax(x.dot(W) + b, axis=1)
    loss = -pt.log(prob[pt.arange(y.shape[0]), y]).mean()
    return x, y, loss


# -- the numpy rules -------------------------------------------------------------------------
class NumpyRule:
    """One update rule in numpy, holding its parameters and state."""

    def __init__(self, name: str, params: list[np.ndarray], **hyper) -> None:
        self.name = name
        self.h = reference_hyper(name, hyper)
        self.params = [p.copy() for p in params]
        self.first = [np.zeros_like(p) for p in params]  # velocity / accumulator / m
        self.second = [np.zeros_like(p) for p in params]  # delta accumulator / v / u
        self.t = 0

    def step(self, grads: list[np.ndarray]) -> None:
        h, name = self.h, self.name
        self.t += 1
        t = self.t
        for i, g in enumerate(grads):
            p, a, s = self.params[i], self.first[i], self.second[i]
            if name == "sgd":
                p = p - h["learning_rate"] * g
            elif name == "momentum":
                a = h["momentum"] * a - h["learning_rate"] * g
                p = p + a
            elif name == "nesterov_momentum":
                a = h["momentum"] * a - h["learning_rate"] * g
                p = p + h["momentum"] * a - h["learning_rate"] * g
            elif name == "adagrad":
                a = a + g * g
                p = p - h["learning_rate"] * g / np.sqrt(a + h["epsilon"])
            elif name == "rmsprop":
                a = h["rho"] * a + (1 - h["rho"]) * g * g
                p = p - h["learning_rate"] * g / np.sqrt(a + h["epsilon"])
            elif name == "adadelta":
                a = h["rho"] * a + (1 - h["rho"]) * g * g
                u = g * np.sqrt(s + h["epsilon"]) / np.sqrt(a + h["epsilon"])
                p = p - h["learning_rate"] * u
                s = h["rho"] * s + (1 - h["rho"]) * u * u
            elif name == "adam":
                a = h["beta1"] * a + (1 - h["beta1"]) * g
                s = h["beta2"] * s + (1 - h["beta2"]) * g * g
                m_hat = a / (1 - h["beta1"] ** t)
                v_hat = s / (1 - h["beta2"] ** t)
                # Lasagne adds epsilon to sqrt(v), not sqrt(v_hat): the paper's epsilon-hat.
                epsilon_hat = h["epsilon"] / np.sqrt(1 - h["beta2"] ** t)
                p = p - h["learning_rate"] * m_hat / (np.sqrt(v_hat) + epsilon_hat)
            elif name == "adamax":
                a = h["beta1"] * a + (1 - h["beta1"]) * g
                s = np.maximum(h["beta2"] * s, np.abs(g))
                p = p - h["learning_rate"] / (1 - h["beta1"] ** t) * a / (s + h["epsilon"])
            else:
                raise ValueError(f"no reference for {name!r}")
            self.params[i], self.first[i], self.second[i] = p, a, s

    def train(self, X: np.ndarray, y: np.ndarray) -> float:
        loss, grads = numpy_loss_and_grads(self.params, X, y)
        self.step(grads)
        return loss


def assert_close(got, want) -> None:
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# -- tests -----------------------------------------------------------------------------------
def shared_params(values: list[np.ndarray]) -> list:
    return [pytensor.shared(v.copy(), name=n) for v, n in zip(values, "Wb", strict=False)]


def serial_functions(name: str, hyper: dict):
    params = shared_params(initial_params())
    x, y, loss = symbolic_model(params)
    grad_updates, param_updates, grad_shared = updates.RULES[name](loss, params, **hyper)
    f_grad = pytensor.function([x, y], loss, updates=grad_updates, mode=PY_MODE)
    f_apply = pytensor.function([], [], updates=param_updates, mode=PY_MODE)
    return params, f_grad, f_apply, grad_shared


@pytest.mark.parametrize("custom", [False, True], ids=["defaults", "custom"])
@pytest.mark.parametrize("name", RULE_NAMES)
def test_rule_matches_numpy_reference(name, custom):
    hyper = CUSTOM[name] if custom else default_hyper(name)
    params, f_grad, f_apply, _ = serial_functions(name, hyper)
    reference = NumpyRule(name, initial_params(), **hyper)
    X, y = make_data()
    for lo, hi in [(0, 7), (7, 20), (20, 23), (23, 40), (3, 4)]:
        loss = f_grad(X[lo:hi], y[lo:hi])
        f_apply()
        assert_close(loss, reference.train(X[lo:hi], y[lo:hi]))
        for param, want in zip(params, reference.params, strict=True):
            assert_close(param.get_value(), want)


def test_flatten_then_split_gives_back_each_gradient():
    W = pytensor.shared(np.arange(6.0).reshape(2, 3) / 10, name="W")
    b = pytensor.shared(np.array([0.5, -0.2]), name="b")
    s = pytensor.shared(np.float64(1.5), name="s")
    h = pytensor.shared(np.ones((1, 2), dtype="float32"), name="h", shape=(1, None))
    x = pt.dmatrix("x")
    loss = (pt.tanh(s * x.dot(W.T) + b) * h).sum() ** 2 / x.shape[0]
    params = [W, b, s, h]
    flat, grad_shared = updates.flatten_gradients(loss, params)
    assert grad_shared.get_value().shape == (6 + 2 + 1 + 2,)
    assert grad_shared.dtype == "float64"
    assert not grad_shared.get_value().any()
    pieces = updates.split_flat(grad_shared, params)
    grads = pytensor.grad(loss, params)
    f_flat = pytensor.function([x], grads, updates=[(grad_shared, flat)], mode=PY_MODE)
    f_split = pytensor.function([], pieces, mode=PY_MODE)
    want = f_flat(np.random.default_rng(2).normal(size=(4, 3)))
    np.testing.assert_array_equal(
        grad_shared.get_value(), np.concatenate([np.ravel(g) for g in want])
    )
    for got, expected, param in zip(f_split(), want, params, strict=True):
        assert got.shape == np.shape(param.get_value())
        assert got.dtype == param.dtype
        np.testing.assert_array_equal(got, np.asarray(expected).astype(param.dtype))


def test_flat_gradient_is_written_in_place_into_grad_shared():
    """As grad_shared's update, the flat gradient fills its own buffer (the all-reduce
    slot, once there is one): no new vector per call, nothing to copy in."""
    W = pytensor.shared(np.arange(6.0).reshape(2, 3) / 10, name="W")
    b = pytensor.shared(np.array([0.5, -0.2]), name="b")
    x = pt.dmatrix("x")
    loss = (pt.tanh(x.dot(W.T) + b) ** 2).mean()
    flat, grad_shared = updates.flatten_gradients(loss, [W, b])
    f = pytensor.function([x], pytensor.grad(loss, [W, b]), updates=[(grad_shared, flat)])
    buffer = grad_shared.get_value(borrow=True)
    for seed in range(3):
        want = f(np.random.default_rng(seed).normal(size=(5, 3)))
        assert grad_shared.get_value(borrow=True) is buffer
        np.testing.assert_allclose(buffer, np.concatenate([np.ravel(g) for g in want]))


@pytest.mark.parametrize("name", RULE_NAMES)
def test_hyper_parameter_defaults_follow_lasagne(name):
    signature = inspect.signature(updates.RULES[name])
    defaults = {
        key: p.default for key, p in signature.parameters.items()
        if key not in ("loss", "params") and p.default is not inspect.Parameter.empty
    }
    assert defaults == DEFAULTS[name]
    required = signature.parameters["learning_rate"].default is inspect.Parameter.empty
    assert required == (name in REQUIRED)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_learning_rate_is_required_for_sgd_family(name):
    params = shared_params(initial_params())
    _, _, loss = symbolic_model(params)
    with pytest.raises(TypeError, match="learning_rate"):
        updates.RULES[name](loss, params)


@pytest.mark.parametrize("name", RULE_NAMES)
def test_state_starts_at_zero_and_each_rule_returns_one_flat_vector(name):
    params = shared_params(initial_params())
    _, _, loss = symbolic_model(params)
    grad_updates, param_updates, grad_shared = updates.RULES[name](
        loss, params, **default_hyper(name))
    assert len(grad_updates) == 1 and grad_updates[0][0] is grad_shared
    assert grad_shared.get_value().shape == (N_FEATURES * N_CLASSES + N_CLASSES,)
    updated = [var for var, _ in param_updates]
    assert all(any(p is var for var in updated) for p in params)
    assert len({id(var) for var in updated}) == len(updated)
    for var in updated:
        if not any(var is p for p in params):
            assert not np.any(var.get_value()), f"{var} does not start at zero"


def test_learning_rate_may_be_a_shared_variable():
    rate = pytensor.shared(0.25, name="rate")
    params = shared_params(initial_params())
    x, y, loss = symbolic_model(params)
    grad_updates, param_updates, _ = updates.sgd(loss, params, learning_rate=rate)
    f_grad = pytensor.function([x, y], loss, updates=grad_updates, mode=PY_MODE)
    f_apply = pytensor.function([], [], updates=param_updates, mode=PY_MODE)
    X, y_ = make_data()
    reference = NumpyRule("sgd", initial_params(), learning_rate=0.25)
    f_grad(X, y_)
    f_apply()
    reference.train(X, y_)
    rate.set_value(0.5)
    reference.h["learning_rate"] = 0.5
    f_grad(X, y_)
    f_apply()
    reference.train(X, y_)
    for param, want in zip(params, reference.params, strict=True):
        assert_close(param.get_value(), want)


def test_bad_arguments_are_refused():
    params = shared_params(initial_params())
    x, _, loss = symbolic_model(params)
    with pytest.raises(ValueError, match="scalar"):
        updates.adam(x.sum(axis=0), params)
    with pytest.raises(TypeError, match="loss must be a PyTensor variable"):
        updates.adam(1.0, params)
    with pytest.raises(TypeError, match=r"params\[1\] must be a shared variable"):
        updates.adam(loss, [params[0], x])
    with pytest.raises(ValueError, match="at least one"):
        updates.adam(loss, [])
    with pytest.raises(ValueError, match="more than once"):
        updates.adam(loss, [params[0], params[0]])


def test_make_train_function_refuses_bad_rules_and_inputs_before_anything_runs():
    params = shared_params(initial_params())
    x, y, loss = symbolic_model(params)
    with pytest.raises(ValueError, match="must name one of"):
        make_train_function(loss, params, [x, y], "nadam")
    with pytest.raises(TypeError, match="must return one gradient update into one flat"):
        make_train_function(loss, params, [x, y], lambda loss, params: None)
    with pytest.raises(TypeError, match="update_rule must be a rule"):
        make_train_function(loss, params, [x, y], 3)
    with pytest.raises(ValueError, match="at least one variable scattered"):
        make_train_function(loss, params, [], "adam")
    with pytest.raises(TypeError, match="inputs must be a list"):
        make_train_function(loss, params, {x: y}, "adam")
