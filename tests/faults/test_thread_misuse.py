"""Calls from the wrong thread raise RuntimeError at once; they never deadlock."""

from __future__ import annotations

import threading

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk


@pytest.mark.timeout(60)
def test_second_thread_is_refused_while_the_first_keeps_working():
    synk.fork(2)
    try:
        x = pt.dvector("x")
        f = synk.function([x], (x.sum(), "sum"))
        synk.distribute()
        errors: list[BaseException] = []
        started = threading.Event()

        def other_thread():
            started.set()
            for _ in range(200):
                try:
                    f(np.ones(4))
                except RuntimeError as exc:
                    errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        started.wait()
        for _ in range(200):
            assert f(np.ones(6)) == 6.0
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert len(errors) == 200
        assert all("thread that called synk.fork()" in str(e) for e in errors)
        assert f(np.ones(3)) == 3.0
    finally:
        synk.close()
