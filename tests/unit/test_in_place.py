"""One process in all (``n_parallel=1``): a repeated call reads the caller's numpy
arrays where they are, instead of copying them into shared memory that no other
process reads (``Function._repeat_in_place``, ``_shard.read_in_place``). With workers
the copy stays: they read it. Results against the plain PyTensor function are checked
in ``tests/integration/test_function.py`` at every size."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos import _call


def _session(n):
    synk.fork(n)
    x, w = pt.dmatrix("x"), pt.dvector("w")
    f = synk.function([x], ((x * w).sum(axis=0), "sum"), bcast_inputs=[w])
    synk.distribute()
    return f


def _forbid_copies(monkeypatch):
    copies = []

    def refill(self, args, refs, arrays, kept):
        copies.append(len(arrays))
        return original(self, args, refs, arrays, kept)

    original = _call.Staging.refill
    monkeypatch.setattr(_call.Staging, "refill", refill)
    return copies


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("rows", [6, 4096])
def test_repeated_calls_copy_only_where_a_worker_reads(n, rows, monkeypatch):
    """In place at n=1 from 32 KiB of numpy inputs on (4096 rows of two float64: 64 KiB);
    below that the copy costs less than arranging to skip it."""
    f = _session(n)
    try:
        x, w = np.arange(2.0 * rows).reshape(rows, 2), np.array([1.0, -2.0])
        for _ in range(3):  # prepared, then repeated: the plan is made on the second
            np.testing.assert_allclose(f(x, w), (x * w).sum(axis=0))
        copies = _forbid_copies(monkeypatch)
        for k in range(3):
            x[k, 0] += 10.0  # the caller's array changes in place between calls
            np.testing.assert_allclose(f(x, w), (x * w).sum(axis=0))
        assert copies == ([] if n == 1 and rows == 4096 else [2, 2, 2])
    finally:
        synk.close()


def test_no_reference_to_the_callers_arrays_stays():
    """As PyTensor's own call, a call read in place keeps nothing of the caller's."""
    f = _session(1)
    try:
        w = np.array([1.0, 2.0])
        for k in range(4):
            x = np.full((4096, 2), float(k))  # read in place from the third call
            gone = weakref.ref(x)
            np.testing.assert_allclose(f(x, w), (x * w).sum(axis=0))
            del x
            gc.collect()
            assert gone() is None, f"call {k} kept the caller's array"
    finally:
        synk.close()


def test_calls_in_turn_each_read_in_place():
    """A training step and a validation call in turn: each finds the other's plan kept
    (a process keeps the last call's), yet neither copies, and each sees the arrays'
    latest values."""
    synk.fork(1)
    try:
        x, w = pt.dmatrix("x"), pt.dvector("w")
        total = synk.function([x], ((x * w).sum(axis=0), "sum"), bcast_inputs=[w])
        peak = synk.function([x], (x.max(axis=0), "max"))
        synk.distribute()
        a, b = np.arange(8192.0).reshape(4096, 2), np.ones((4096, 2))
        weights = np.array([1.0, -1.0])
        with pytest.MonkeyPatch.context() as patch:
            for k in range(6):
                if k == 3:
                    copies = _forbid_copies(patch)  # from here on: read in place
                a[k] += 1.0
                b[-1, 0] = 100.0 + k
                np.testing.assert_allclose(total(a, weights), (a * weights).sum(axis=0))
                np.testing.assert_allclose(peak(b), b.max(axis=0))
            assert copies == []
    finally:
        synk.close()
