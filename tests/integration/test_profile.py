"""synk.profile(): per-call phases are recorded while active, nothing otherwise."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos import profile


@pytest.mark.parametrize("n", [1, 3])
def test_profile_records_every_phase(n):
    synk.fork(n)
    try:
        x = pt.dmatrix("x")
        f = synk.function([x], [(x.sum(axis=0), "sum"), (x.sum(axis=1), "gather")], name="sums")
        synk.distribute()
        data = synk.data(np.arange(60.0).reshape(20, 3))
        f(data)
        with profile() as prof:
            for _ in range(3):
                got = f(data, batch=np.arange(19, -1, -2))
            np.testing.assert_array_equal(got[1], data.data[19::-2].sum(axis=1))
            with pytest.raises(RuntimeError, match="cannot be nested"):
                with profile():
                    pass
        f(data)  # outside the block: not recorded
        summary = prof.summary()
        assert summary["calls"] == 3 and len(prof.records) == 3
        record = prof.records[0]
        assert record.kind == "call" and record.name == "sums"
        assert len(record.function) == len(record.gather) == n
        assert all(t > 0 for t in record.function)
        for phase in ("stage", "gather", "function", "reduce", "total"):
            assert summary[phase] > 0, phase
        assert summary["total"] >= summary["stage"] + summary["reduce"]
        assert summary["function_max"] >= summary["function"]
        f(data)  # profiling off again: plain replies
        assert len(prof.records) == 3
    finally:
        synk.close()
