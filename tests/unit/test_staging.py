"""Staging (``_staging.py``): the buffers a prepared call copies numpy arguments into.

A buffer is viewed with each value's shape in place, and grows only when a value does
not fit; the results of the calls around it are checked against numpy here and
against the plain PyTensor function in ``tests/integration/test_function.py``."""

from __future__ import annotations

import errno

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos import _staging
from synkhronos._runtime import epoch


@pytest.fixture
def summed():
    synk.fork(2)
    try:
        x = pt.dmatrix("x")
        f = synk.function([x], (x.sum(axis=0), "sum"))
        synk.distribute()
        yield f
    finally:
        synk.close()


def test_a_buffer_that_cannot_grow_is_left_as_it_was(summed, monkeypatch):
    """Where the bigger segment does not fit (ENOSPC: a small /dev/shm), the call raises
    and the buffer still holds its segment: the next call that fits works."""
    small = np.arange(20.0).reshape(10, 2)
    np.testing.assert_allclose(summed(small), small.sum(axis=0))

    def full(owner, session, nbytes):
        raise OSError(errno.ENOSPC, f"no room for {nbytes} bytes")

    monkeypatch.setattr(_staging, "allocate", full)
    with pytest.raises(OSError, match="no room"):
        summed(np.ones((5000, 2)))
    monkeypatch.undo()
    for values in (small + 1, np.ones((3, 2))):  # the same size, then fewer rows
        np.testing.assert_allclose(summed(values), values.sum(axis=0))


def test_viewing_a_buffer_with_another_shape_moves_no_epoch(summed):
    """Fewer rows in a buffer that fits them keep every record (a user's Data reshaped
    moves the epoch: a bound call holds its rows without a key); growth does."""
    summed(np.ones((50, 2)))
    before = epoch.current
    for rows in (10, 50, 1, 50):
        values = np.full((rows, 2), float(rows))
        np.testing.assert_allclose(summed(values), values.sum(axis=0))
    assert epoch.current == before
    values = np.ones((500, 2))
    np.testing.assert_allclose(summed(values), values.sum(axis=0))
    assert epoch.current != before  # grown: the old segment released, its mapping dropped
