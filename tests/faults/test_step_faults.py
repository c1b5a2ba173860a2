"""A step of several calls, in a session of its own, with a worker failing inside it."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos import steps
from synkhronos.testing import fault_at


def test_a_worker_dying_inside_a_step_breaks_the_session():
    """A worker that raises in the second call of a step: WorkerError, still usable; one
    killed there: WorkerDiedError."""
    synk.fork(2)
    try:
        x = pt.dvector("x")
        f = synk.function([x], (x.sum(), "sum"))
        synk.distribute()
        two = [steps.call(f, np.ones(4)), steps.call(f, np.ones(6))]
        assert steps.run(two) == [4.0, 6.0]
        with fault_at("function", "raise", ranks=[1]), pytest.raises(synk.WorkerError):
            steps.run(two)
        assert steps.run(two) == [4.0, 6.0]
        with fault_at("function", "kill", ranks=[1]), pytest.raises(synk.WorkerDiedError):
            steps.run(two)
    finally:
        synk.close()


def test_a_worker_failing_in_a_call_in_chunks():
    """Rows in chunks (a counter the processes share): a worker that raises gives
    WorkerError and the next call takes every chunk again; one killed gives
    WorkerDiedError, never a hang."""
    synk.fork(3)
    try:
        x = pt.dmatrix("x")
        f = synk.function([x], (x.sum(), "sum"))
        synk.distribute()
        data = synk.data(np.ones((50, 2)))
        assert f(data, chunks=7) == 100.0
        with fault_at("function", "raise", ranks=[2]), pytest.raises(synk.WorkerError):
            f(data, chunks=7)
        assert f(data, chunks=7) == 100.0
        with fault_at("function", "kill", ranks=[1]), pytest.raises(synk.WorkerDiedError):
            f(data, chunks=7)
    finally:
        synk.close()
