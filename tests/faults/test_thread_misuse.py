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


@pytest.mark.timeout(60)
def test_refused_call_changes_nothing_not_even_staging():
    """A call refused for its thread leaves every buffer as it was: it is refused before
    a repeated call's shortcut would copy its numpy values into the staging memory that
    the owning thread's calls use (a command of that thread could be reading it)."""
    synk.fork(2)
    try:
        x = pt.dvector("x")
        f = synk.function([x], (x.sum(), "sum"))
        synk.distribute()
        assert f(np.ones(6)) == 6.0
        assert f(np.ones(6)) == 6.0  # the repeated-call path, staged in place
        staged = f._staging.buffers[0].data  # white box: where the workers read x
        before = staged.copy()
        errors: list[BaseException] = []

        def other_thread():
            try:
                f(np.full(6, 100.0))  # the same dtype and shape: a repeat of that call
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=30)
        assert len(errors) == 1 and "thread that called synk.fork()" in str(errors[0])
        np.testing.assert_array_equal(staged, before)
        assert f(np.ones(6)) == 6.0
    finally:
        synk.close()
