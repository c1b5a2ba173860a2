"""The shared cases (``tests/cases.py``) on one machine, against numpy on the full data.

The several-machines suite runs the same cases under ``mpiexec``
(``tests/mpi/scripts/suite.py``); here they run in a session of each size, and every
result that has a reference must equal it (copies exactly, reductions within
rounding). One session per size runs every case, as the MPI script does.
"""

from __future__ import annotations

import pytest

import synkhronos as synk
from tests import cases

from ..conftest import DEVICE, sizes_to_run


@pytest.fixture(scope="module", params=sizes_to_run([1, 2, 3]), ids=lambda n: f"n{n}")
def ran(request):
    synk.fork(request.param, device=DEVICE)
    try:
        yield request.param, *cases.run_all(request.param)
    finally:
        synk.close()


@pytest.mark.parametrize("case", list(cases.CASES))
def test_case_equals_numpy(ran, case):
    n, checks, notes = ran
    prefix = {"functions": "f/", "data": "data/", "collectives": ("copy/", "reduce/"),
              "low_precision": "rounded/"}[case]
    mine = {name: check for name, check in checks.items() if name.startswith(prefix)}
    assert mine, f"case {case} gave no result"
    for name, check in mine.items():
        check.compare(name)


def test_notes_name_the_refusals(ran):
    n, checks, notes = ran
    assert notes["n"] == n and notes["machines"] == [0] * n
    assert "op 'max' takes the exact exchange" in notes["rounded/refused"]
    if n > 1:
        assert "batch_s" in notes["f/batch_s_refused"]
        assert "same shape" in notes["reduce/mismatch"]
    assert notes["f/worker_error"][0] == n - 1
