"""Functions used before fork() or after close() say what to call first."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import session_open


def test_calls_before_fork_and_after_close():
    x = pt.dvector("x")
    with pytest.raises(RuntimeError, match="synk.fork\\(\\) must be called before synk.function"):
        synk.function([x], x.sum())
    with pytest.raises(RuntimeError, match="synk.fork\\(\\) must be called before synk.distribute"):
        synk.distribute()
    synk.fork(2)
    f = synk.function([x], (x.sum(), "sum"))
    assert f(np.ones(5)) == 5.0
    synk.close()
    with pytest.raises(RuntimeError, match="closed"):
        f(np.ones(5))
    assert not session_open()
