"""Random streams at n_parallel 1, 2, 3: each process draws its own, on request the same.

A dropout-like mask over the rows (``RandomStream.binomial``): at n = 1 it is the
serial function's mask, call after call; with workers, each process's block of rows
gets a mask from its own stream (the master's is the serial program's generator);
with ``distribute(random_streams="identical")`` every process draws the master's.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import rank_values, split_bounds

from ..conftest import session_fixture

ROWS = 12  # even blocks at n = 1, 2, 3: identical streams draw identical masks
ONES = np.ones((ROWS, 40))


def _random_stream(seed):
    from pytensor.tensor.random.utils import RandomStream

    with warnings.catch_warnings():  # PyTensor 3.3 deprecates RandomStream, 3.0 does not
        warnings.simplefilter("ignore", FutureWarning)
        return RandomStream(seed)


def _masked(seed):
    x = pt.dmatrix("x")
    mask = _random_stream(seed).binomial(1, 0.5, size=x.shape)
    return x, x * mask, mask.owner.inputs[0]


class Model:
    def __init__(self):
        x, out, self.rng = _masked(7)
        self.dropout = synk.function([x], (out, "gather"))
        xs, outs, self.serial_rng = _masked(7)
        self.serial = pytensor.function([xs], outs)
        self.serial_state = self.serial_rng.get_value().bit_generator.state
        synk.distribute()
        x, out, self.same_rng = _masked(11)
        self.same = synk.function([x], (out, "gather"))
        synk.distribute(random_streams="identical")


model = session_fixture(Model)


def _states(rng):
    """Each process's generator state (``rank_values`` wraps a generator in a 0-d array)."""
    return [value.item().bit_generator.state["state"] for value in rank_values(rng)]


def _blocks(mask):
    return [mask[lo:hi] for lo, hi in split_bounds(ROWS, synk.n_parallel())]


def test_master_keeps_the_serial_generator_workers_get_their_own(model):
    states = _states(model.rng)
    assert states[0] == model.serial_state["state"]
    assert len({s["state"] for s in states}) == len(states)  # all different
    same = _states(model.same_rng)
    assert all(s == same[0] for s in same)


def test_one_process_draws_the_serial_masks(model):
    if synk.n_parallel() != 1:
        pytest.skip("the serial masks are the whole mask only with one process")
    model.serial_rng.get_value().bit_generator.state = model.rng.get_value().bit_generator.state
    for _ in range(3):
        np.testing.assert_array_equal(model.dropout(ONES), model.serial(ONES))


def test_each_process_draws_its_own_mask(model):
    mask = model.dropout(ONES)
    assert mask.shape == (ROWS, 40) and set(np.unique(mask)) == {0.0, 1.0}
    blocks = _blocks(mask)
    for k in range(1, len(blocks)):
        assert not np.array_equal(blocks[k], blocks[0])


def test_identical_streams_on_request(model):
    blocks = _blocks(model.same(ONES))
    for block in blocks[1:]:
        np.testing.assert_array_equal(block, blocks[0])


def test_a_bad_choice_is_refused(model):
    with pytest.raises(ValueError, match="random_streams must be one of"):
        synk.distribute(random_streams="same")
