"""Checkpoints of make_train_function: state_dict() / load_state_dict() at n 1, 2, 3.

Every rule, sharded and not: the state holds the parameters and the rule's state
equal to the numpy reference (``NumpyRule``), gathered to the master; a state saved
from one form loads into the same form or the other, and training on from it equals
training without the break, in every process. A state that does not fit is refused
before anything changes. Loading into a session of another size:
``test_checkpoint_sizes.py``.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.extensions import make_train_function, updates
from tests.conftest import DEVICE, sizes_to_run
from tests.integration.test_train import (
    MINIBATCHES,
    Trainers,
    X,
    Y,
    new_params,
)
from tests.unit.test_updates_unit import RULE_NAMES, NumpyRule, initial_params, symbolic_model

pytestmark = pytest.mark.timeout(240)

RTOL, ATOL = 1e-10, 1e-13
# Which NumpyRule list holds each kind of state.
FIRST, SECOND = {"velocity", "accumulator", "m"}, {"delta_accumulator", "v", "u"}
KINDS = {"sgd": [], "momentum": ["velocity"], "nesterov_momentum": ["velocity"],
         "adagrad": ["accumulator"], "rmsprop": ["accumulator"],
         "adadelta": ["accumulator", "delta_accumulator"], "adam": ["m", "v"],
         "adamax": ["m", "u"]}
COUNTED = {"adam", "adamax"}  # rules with a step counter, "state/t"
FORMS = [(True, True), (True, False), (False, True), (False, False)]


def expected_state(name: str, reference: NumpyRule) -> dict[str, np.ndarray]:
    """What state_dict() must hold after the reference's steps."""
    want = {"params/W": reference.params[0], "params/b": reference.params[1]}
    for kind in KINDS[name]:
        held = reference.first if kind in FIRST else reference.second
        want[f"state/{kind}/W"], want[f"state/{kind}/b"] = held
    if name in COUNTED:
        want["state/t"] = np.asarray(float(reference.t))
    return want


def assert_state(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert isinstance(got[key], np.ndarray), key
        assert got[key].shape == np.shape(value), key
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.fixture(scope="module", params=sizes_to_run([1, 2, 3]), ids=lambda n: f"n{n}")
def trainers(request):
    synk.fork(request.param, device=DEVICE)
    try:
        yield Trainers(request.param)
    finally:
        synk.close()


def train_steps(trainers, train, reference, minibatches) -> None:
    for idx in minibatches:
        loss = train(trainers.xd, trainers.yd, batch=idx)
        if reference is not None:
            np.testing.assert_allclose(loss, reference.train(X[idx], Y[idx]), rtol=RTOL)


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
@pytest.mark.parametrize("name", RULE_NAMES)
def test_state_dict_equals_the_serial_rule(trainers, name, sharded):
    train, reference = trainers.reset(name, sharded)
    train_steps(trainers, train, reference, MINIBATCHES[:3])
    state = train.state_dict()
    assert_state(state, expected_state(name, reference))
    kept = {key: value.copy() for key, value in state.items()}
    train_steps(trainers, train, None, MINIBATCHES[3:4])  # later steps leave it alone
    for key, value in kept.items():
        np.testing.assert_array_equal(state[key], value)


@pytest.mark.parametrize("saved_sharded, loaded_sharded", FORMS,
                         ids=[f"{'s' if a else 'u'}-to-{'s' if b else 'u'}" for a, b in FORMS])
@pytest.mark.parametrize("name", RULE_NAMES)
def test_resuming_equals_training_without_the_break(trainers, name, saved_sharded,
                                                    loaded_sharded):
    """Save after three steps, disturb the target, load, train on: the result is the
    reference trained on every minibatch without a break, in every process."""
    train, reference = trainers.reset(name, saved_sharded)
    train_steps(trainers, train, reference, MINIBATCHES[:3])
    state = train.state_dict()
    target, _ = trainers.reset(name, loaded_sharded)
    train_steps(trainers, target, None, MINIBATCHES[3:])  # state and params elsewhere now
    target.load_state_dict(state)
    assert_state(target.state_dict(), expected_state(name, reference))
    train_steps(trainers, target, reference, MINIBATCHES[3:])
    trainers.assert_params_everywhere(target.params, reference.params)
    assert_state(target.state_dict(), expected_state(name, reference))


def test_a_state_that_does_not_fit_is_refused_and_changes_nothing(trainers):
    train, reference = trainers.reset("adam")
    train_steps(trainers, train, reference, MINIBATCHES[:2])
    before = train.state_dict()
    other, _ = trainers.reset("momentum")
    train_steps(trainers, other, None, MINIBATCHES[:1])
    momentum_state = other.state_dict()

    def renamed(old, new):
        return {(new if key == old else key): value for key, value in before.items()}

    refused = [
        (momentum_state, ValueError, r"missing .*'state/m/W'.*unexpected 'state/velocity/W'"),
        (renamed("params/W", "params/W1"), ValueError, r"missing 'params/W'.*'params/W1'"),
        ({k: v for k, v in before.items() if k != "state/t"}, ValueError,
         r"missing 'state/t', unexpected none"),
        ({**before, "params/c": np.zeros(3)}, ValueError, r"missing none, unexpected 'params/c'"),
        ({**before, "state/v/W": before["state/v/W"].T}, ValueError,
         r"state\['state/v/W'\] has shape \(3, 5\); this model's is \(5, 3\)"),
        ({**before, "state/t": np.zeros(2)}, ValueError, r"state\['state/t'\] has shape"),
        ({**before, "params/b": before["params/b"] + 1j}, TypeError,
         r"state\['params/b'\] has dtype complex128"),
        (list(before.items()), TypeError, "takes the dict state_dict\\(\\) returns"),
    ]
    for state, error, message in refused:
        with pytest.raises(error, match=message):
            train.load_state_dict(state)
    assert_state(train.state_dict(), before)
    trainers.assert_params_everywhere(train.params, reference.params)


def test_a_rule_of_the_users_own_round_trips_by_position(trainers):
    """A callable rule not from synkhronos.extensions.updates: unsharded, its state
    keyed by position."""

    def my_momentum(loss, params, learning_rate):
        return updates.momentum(loss, params, learning_rate=learning_rate, momentum=0.5)

    params = new_params()
    x, y, loss = symbolic_model(params)
    train = make_train_function(loss, params, [x, y], my_momentum, learning_rate=0.2)
    assert not train.sharded
    reference = NumpyRule("momentum", initial_params(), learning_rate=0.2, momentum=0.5)
    train_steps(trainers, train, reference, MINIBATCHES[:3])
    state = train.state_dict()
    assert sorted(state) == ["params/W", "params/b", "state/0", "state/1"]
    np.testing.assert_allclose(state["state/0"], reference.first[0], rtol=RTOL, atol=ATOL)
    train.reset_state()
    synk.broadcast(params, initial_params())
    train.load_state_dict(state)
    train_steps(trainers, train, reference, MINIBATCHES[3:])
    trainers.assert_params_everywhere(params, reference.params)


def test_unnamed_and_repeated_names_are_keyed_by_index(trainers):
    params = [pytensor.shared(value, name="w") for value in initial_params()]
    x, y, loss = symbolic_model(params)
    train = make_train_function(loss, params, [x, y], "sgd", learning_rate=0.1)
    assert sorted(train.state_dict()) == ["params/#0", "params/#1"]
