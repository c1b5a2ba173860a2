"""Checkpoints across sessions of different sizes: save at one n, close, fork at another
n, load, train on; the result equals the serial rule trained without the break.

Each case forks two sessions in turn (so it cannot share test_checkpoint.py's
module-wide session); the state also travels through an ``.npz`` file, as a user
saves it.
"""

from __future__ import annotations

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.extensions import make_train_function
from tests.integration.test_checkpoint import assert_state, expected_state
from tests.integration.test_train import HYPER, MINIBATCHES, X, Y, new_params
from tests.unit.test_updates_unit import NumpyRule, initial_params, symbolic_model

pytestmark = pytest.mark.timeout(240)

RTOL, ATOL = 1e-10, 1e-13
# (n, sharded) where the state is saved -> where it is loaded
MOVES = [((2, True), (3, True)), ((3, True), (1, False)), ((1, False), (2, True))]


def session_steps(n, sharded, name, minibatches, reference, state=None):
    """Fork ``n``, build the train function (loading ``state`` if given), train on
    ``minibatches`` checked against ``reference``; return the state; close."""
    synk.fork(n)
    try:
        params = new_params()
        x, y, loss = symbolic_model(params)
        train = make_train_function(loss, params, [x, y], name, sharded=sharded,
                                    **HYPER[name])
        assert train.sharded == sharded
        if state is not None:
            train.load_state_dict(state)
        xd, yd = synk.data(X), synk.data(Y)
        for idx in minibatches:
            loss_value = train(xd, yd, batch=idx)
            np.testing.assert_allclose(loss_value, reference.train(X[idx], Y[idx]),
                                       rtol=RTOL)
        for rank in range(n):
            for got, want in zip(synk.get_value(rank, params), reference.params, strict=True):
                np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                           err_msg=f"rank {rank}")
        return train.state_dict()
    finally:
        synk.close()


@pytest.mark.parametrize("saved, loaded", MOVES,
                         ids=[f"n{a[0]}{'s' if a[1] else 'u'}-to-n{b[0]}{'s' if b[1] else 'u'}"
                              for a, b in MOVES])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_state_loads_into_another_number_of_processes(tmp_path, name, saved, loaded):
    reference = NumpyRule(name, initial_params(), **HYPER[name])
    state = session_steps(*saved, name, MINIBATCHES[:3], reference)
    np.savez(tmp_path / "checkpoint.npz", **state)
    with np.load(tmp_path / "checkpoint.npz") as stored:
        state = dict(stored)
    final = session_steps(*loaded, name, MINIBATCHES[3:], reference, state)
    assert_state(final, expected_state(name, reference))
