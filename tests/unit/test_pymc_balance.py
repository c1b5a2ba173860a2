"""The divided likelihood balances its rows by measured speed (``steps.Balancer``).

Where one evaluation takes long enough (``_rowsum._BALANCE_FROM_S``, lowered here so a
small model qualifies), every process's seconds are measured (one evaluation in four
while the split is even, every one once it is not) and the rows follow each process's
rows per second. Checked against PyMC's own function at every point: the sum is the
same whatever the split, to rounding; a process made to look three times slower gets
a third of the others' rows.

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra.
"""

from __future__ import annotations

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos as synk  # noqa: E402
from synkhronos.pymc import _choice, _likelihood, _rowsum  # noqa: E402


def logistic(rows=900, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli("y", logit_p=x @ b, observed=rng.integers(0, 2, rows))
    return model


@pytest.mark.timeout(600)
def test_rows_follow_measured_speed(monkeypatch):
    model = logistic()
    own = _choice.Own.measure(model)
    monkeypatch.setattr(_rowsum, "_BALANCE_FROM_S", 0.0)
    synk.fork(3)
    try:
        rewritten, op = _likelihood.build(pm, model, None, None)
        vgf = _choice.compiled(rewritten)
        balancer = op.part.balancer
        assert balancer is not None and balancer.in_use is None
        rng = np.random.default_rng(0)

        def agree(points: int) -> None:
            for _ in range(points):
                x = own.x + rng.normal(0, 0.3, size=own.x.shape)
                want, got = own.vgf(x), vgf(x)
                np.testing.assert_allclose(got[0], want[0], rtol=1e-10)
                np.testing.assert_allclose(got[1], want[1], rtol=1e-8, atol=1e-10)

        agree(80)  # one in four timed: the measurements fill
        assert balancer.proposed() is not None
        for _ in range(40):  # rank 2 three times slower a row
            balancer.record([(100, 1e-3), (100, 1e-3), (100, 3e-3)])
        seen = []  # each timed call's rows per process, as the processes report them
        record = balancer.record
        monkeypatch.setattr(balancer, "record", lambda t: (seen.append(t), record(t)))
        agree(10)  # uneven shares from here, every call timed
        shares = balancer.in_use
        assert shares is not None and shares[2] < 0.6 * min(shares[:2])
        assert len(seen) == 10
        rows = [rows for rows, _ in seen[-1]]
        assert sum(rows) == 900 and rows[2] < 0.6 * min(rows[:2]), rows
    finally:
        synk.close()
