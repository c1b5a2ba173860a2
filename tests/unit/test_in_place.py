"""One process in all (``n_parallel=1``): a repeated call reads the caller's numpy
arrays where they are, instead of copying them into shared memory that no other
process reads (a replay record's ``in_place``, ``_shard.on_arrays``). With workers
the copy stays: they read it. Results against the plain PyTensor function are checked
in ``tests/integration/test_function.py`` at every size."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import weakref

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos import _shard
from synkhronos.testing import commands_run

from ..conftest import REPLAY


def _session(n):
    synk.fork(n)
    x, w = pt.dmatrix("x"), pt.dvector("w")
    f = synk.function([x], ((x * w).sum(axis=0), "sum"), bcast_inputs=[w])
    synk.distribute()
    return f


def _count_reads_in_place(monkeypatch):
    """A list that gets one item per replay that read the caller's arrays where they
    are (a replay that does not copies them into its staging buffers)."""
    reads = []

    def on_arrays(*args):
        handler = original(*args)
        if handler is not None:
            reads.append(1)
        return handler

    original = _shard.on_arrays
    monkeypatch.setattr(_shard, "on_arrays", on_arrays)
    return reads


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
        reads = _count_reads_in_place(monkeypatch)
        for k in range(3):
            x[k, 0] += 10.0  # the caller's array changes in place between calls
            np.testing.assert_allclose(f(x, w), (x * w).sum(axis=0))
        assert len(reads) == (3 if n == 1 and rows == 4096 and REPLAY else 0)
    finally:
        synk.close()


def test_no_reference_to_the_callers_arrays_stays(gc_of_this_test):
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
                    reads = _count_reads_in_place(patch)  # from here on: in place
                a[k] += 1.0
                b[-1, 0] = 100.0 + k
                np.testing.assert_allclose(total(a, weights), (a * weights).sum(axis=0))
                np.testing.assert_allclose(peak(b), b.max(axis=0))
            assert len(reads) == (6 if REPLAY else 0)  # (SYNK_REPLAY=0: never)
    finally:
        synk.close()


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("num_slices", [1, 3])
def test_a_bound_call_is_the_plain_function_and_alone_sends_no_command(n, num_slices):
    """``Function.bind`` (``synkhronos.pymc``'s likelihood): its rows fixed, the point
    varying. With one process in all a repeat calls the compiled function itself on the
    rows where they are, its slices reduced by each output's op (``_replay._Direct``):
    no command; with workers, one. Either way the plain function's results, also for
    an argument of another dtype, which takes the general path."""
    synk.fork(n)
    try:
        x, w = pt.dmatrix("x"), pt.dvector("w")
        f = synk.function([x], [((x * w).sum(axis=0), "sum"), (x @ w, "gather"),
                                (x.max(), "max"), ((x * w).mean(), "avg")], bcast_inputs=[w])
        synk.distribute()
        rows = synk.data(np.arange(22.0).reshape(11, 2))
        bound = f.bind((rows,), num_slices)
        for k in range(6):
            point = np.array([1.0, -k]) if k != 3 else np.array([1, -k], dtype="int8")
            before = commands_run()
            got = bound(point)
            sent = commands_run() - before
            for have, want in zip(got, f.as_pytensor(rows, point), strict=True):
                np.testing.assert_allclose(have, want, rtol=1e-12)
            if k in (1, 2, 5):  # repeats (k=3: another dtype, the general path, kept anew;
                # k=4: back to float64, the call's own replay, held again)
                assert sent == (0 if n == 1 and REPLAY else 1), (k, sent)
    finally:
        synk.close()


_GPU_RULE = """
import os

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import _shard
from synkhronos.testing import commands_run
from synkhronos._core.session import current

synk.fork(1, device="gpu")
placement = current().ctx.placement
assert placement.reads_callers_arrays == bool(placement.gpu_ids)  # the stand-in: none
placement.reads_callers_arrays = True  # a GPU's rule, lent to the stand-in
x = pt.dmatrix("x")
f = synk.function([x], [(x.sum(axis=0), "sum"), (x.max(axis=1), "gather")])
synk.distribute()
rows = np.arange(4096 * 2.0).reshape(4096, 2)  # 64 KiB
for _ in range(2):  # prepared, then repeated: the plan is made on the second
    f(rows)
reads = []
on_arrays = _shard.on_arrays


def counted(*args):
    handler = on_arrays(*args)
    reads.append(handler is not None)
    return handler


_shard.on_arrays = counted
for k in range(3):
    rows[k, 1] += 10.0  # the caller's array changes in place between calls
    for got, want in zip(f(rows), f.as_pytensor(rows), strict=True):
        np.testing.assert_allclose(got, want)
replay = os.environ.get("SYNK_REPLAY", "").strip() != "0"  # SYNK_REPLAY=0: none tried
assert reads == ([True, True, True] if replay else []), reads
synk.close()
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="jax is not installed (it is in the test extra)")
@pytest.mark.timeout(300)
def test_on_a_gpu_one_process_reads_the_callers_arrays_too():
    """``device="gpu"`` at n=1 skips the copy as well where the placement says so (on a
    GPU every input crosses to the device anyway). JAX's CPU platform, the stand-in,
    keeps the copy, since it reads the aligned copy without one of its own; the session
    (in a process of its own: a master that ran JAX cannot fork again) lends it a
    GPU's rule to run the path a GPU takes: no copy, and every change shows."""
    env = dict(os.environ, SYNKHRONOS_GPU_PLATFORM="cpu")
    env.pop("PYTENSOR_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", _GPU_RULE], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("ok")


@pytest.mark.skipif(REPLAY, reason="checks SYNK_REPLAY=0, which this run does not set "
                    "(CI runs the suites with it too)")
def test_nothing_is_replayed_when_replay_is_off():
    """SYNK_REPLAY=0: no record is kept, so every call takes the general path."""
    f = _session(1)
    try:
        x, w = np.ones((4096, 2)), np.array([1.0, 2.0])
        for _ in range(3):
            np.testing.assert_allclose(f(x, w), (x * w).sum(axis=0))
        assert f.record(((None, x.shape, x.dtype), (None, w.shape, w.dtype))) is None
    finally:
        synk.close()
