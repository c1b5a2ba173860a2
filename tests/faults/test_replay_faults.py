"""A fault during a replayed command is reported as on the general path, on either side.

A call or all-reduce that repeats an earlier one is replayed (``synkhronos/_replay.py``:
the master's record and lane, each worker's kept plan): it skips validation, staging
and lookups, but it passes the same fault points (``synkhronos.testing.fault_at``) as
the general path. Each case raises at one point in one process, once on the general
path and once on the replay, and compares what the master reports; the next calls
are right. (Arming a worker's point is itself a command, so the worker's replayed
call after it runs its kept plan; the master's point is armed without one, so the
master replays through its lane.)
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import fault_at, rank_values, set_rank_values

from ..conftest import REPLAY

pytestmark = pytest.mark.timeout(120)

N = 3
ROWS = np.arange(30.0).reshape(10, 3)


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


@pytest.mark.parametrize(("point", "rank"), [("gather", 0), ("function", 0),
                                             ("gather", N - 1), ("function", N - 1),
                                             ("reply", N - 1)])
def test_a_fault_in_a_replayed_call(point, rank, monkeypatch):
    synk.fork(N)
    try:
        x = pt.dmatrix("x")
        f = synk.function([x], [(x.sum(axis=0), "sum"), (x.max(axis=1), "gather")])
        synk.distribute()
        xd = synk.data(ROWS)
        want = f.as_pytensor(ROWS)
        with fault_at(point, "raise", ranks=[rank]), pytest.raises(synk.WorkerError) as general:
            f(xd, batch=len(ROWS))  # (a call with batch is never replayed)
        for _ in range(3):  # kept, then replayed in every process
            f(xd)
        prepared = []
        prepare = f.prepare
        monkeypatch.setattr(f, "prepare", lambda *a, **k: prepared.append(1) or prepare(*a, **k))
        with fault_at(point, "raise", ranks=[rank]), pytest.raises(synk.WorkerError) as replayed:
            f(xd)
        assert len(prepared) == (0 if REPLAY else 1)  # (SYNK_REPLAY=0: the general path)
        assert type(replayed.value) is type(general.value)
        assert _first_line(replayed.value) == _first_line(general.value)
        assert f"rank {rank}" in _first_line(replayed.value)
        for _ in range(3):  # usable, and right, on the replay again
            for got, expected in zip(f(xd), want, strict=True):
                np.testing.assert_array_equal(got, expected)
    finally:
        synk.close()


@pytest.mark.parametrize(("point", "rank"), [("collective", 0), ("exchange", 0),
                                             ("collective", N - 1), ("exchange", N - 1)])
def test_a_fault_in_a_replayed_all_reduce(point, rank):
    synk.fork(N)
    try:
        w = pytensor.shared(np.zeros(4), name="w")
        synk.function([], [], updates=[(w, w + 1.0)])  # (w is distributed with it)
        synk.distribute()

        def fill() -> list[np.ndarray]:
            values = [np.arange(4.0) + 10 * r for r in range(N)]
            set_rank_values(w, values)
            return values

        fill()
        with fault_at(point, "raise", ranks=[rank]), pytest.raises(synk.WorkerError) as general:
            synk.all_reduce(w, "sum")  # the first of its group: the general path
        for _ in range(3):  # kept, then replayed in every process
            synk.all_reduce(w, "sum")
        fill()
        with fault_at(point, "raise", ranks=[rank]), pytest.raises(synk.WorkerError) as replayed:
            synk.all_reduce(w, "sum")
        assert type(replayed.value) is type(general.value)
        assert _first_line(replayed.value) == _first_line(general.value)
        assert f"rank {rank}" in _first_line(replayed.value)
        values = fill()
        synk.all_reduce(w, "sum")
        for got in rank_values(w):
            np.testing.assert_array_equal(got, sum(values))
    finally:
        synk.close()
