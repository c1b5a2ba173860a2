"""Several likelihoods of different lengths: one parallel call per evaluation.

A model in the shape of the PyMC gallery's movie ratings (parameters shared by several
observed variables, each over its own number of rows) divides each observed variable
on its own rows, and one evaluation of the log-density is still one command, whatever
the number of lengths. Checked here on four observed variables of 301, 40, 2 and 1
rows and a ``pm.Potential`` over 7 rows named in ``split`` (at n = 3 two of them have
fewer rows than processes), against PyMC's own ``model.logp_dlogp_function`` at
n_parallel 1, 2 and 3 (rtol 1e-10 in float64): in one block, in slices of a few rows
(``grainsize``; at n_parallel 1 the compiled function in place), and with the rows
balanced unevenly by measured speed. ``synk.profile()`` records each command: one an
evaluation. One session per size builds every function once.

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ..conftest import session_fixture

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import pytensor.tensor as pt  # noqa: E402

import synkhronos as synk  # noqa: E402
import synkhronos.pymc as synk_pymc  # noqa: E402

LENGTHS = (301, 40, 2, 1)  # the observed variables' rows
PENALTY_ROWS = 7  # the potential's
SPLIT = ["y0", "x0", "y1", "x1", "y2", "x2", "y3", "x3", "penalty", "w"]


def several_lengths(seed=21):
    """Shared parameters, four observed variables of different lengths and families,
    and a potential that sums over the rows of its own container."""
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=rows) for rows in LENGTHS]
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        slope = pm.Normal("slope", 0, 1, shape=2)
        sigma = pm.HalfNormal("sigma", 1)
        x = [pm.Data(f"x{i}", value) for i, value in enumerate(xs)]
        pm.Normal("y0", mu + slope[0] * x[0], sigma,
                  observed=0.5 + 0.8 * xs[0] + rng.normal(size=LENGTHS[0]))
        pm.StudentT("y1", nu=5, mu=mu + slope[1] * x[1], sigma=sigma,
                    observed=0.5 - 0.3 * xs[1] + rng.normal(size=LENGTHS[1]))
        pm.Poisson("y2", pt.exp(0.1 * mu + slope[0] * x[2]),
                   observed=rng.poisson(1.5, size=LENGTHS[2]))
        pm.Normal("y3", mu + x[3], 2 * sigma, observed=rng.normal(size=LENGTHS[3]))
        w = pm.Data("w", rng.normal(size=PENALTY_ROWS))
        pm.Potential("penalty", -0.5 * pt.sum((w - slope[1]) ** 2))
    return model


class Built:
    """The model, PyMC's own function, and the divided ones: in one block, in slices."""

    def __init__(self):
        self.model = several_lengths()
        self.serial = self.model.logp_dlogp_function(ravel_inputs=True)
        self.serial.set_extra_values({})
        self.parallel = {}
        for name, grainsize in (("block", None), ("sliced", 13)):
            fn = synk_pymc.logp_dlogp_function(self.model, split=SPLIT, grainsize=grainsize)
            fn.set_extra_values({})
            self.parallel[name] = fn
        self.size = sum(np.size(v) for v in self.model.initial_point().values())


built = session_fixture(Built)


def _row_sum(fn):
    """The RowSum Op in fn's graph, or None (PyMC's own function)."""
    ops = [node.op for node in fn._pytensor_function.maker.fgraph.apply_nodes
           if type(node.op).__name__ == "RowSum"]
    return ops[0] if ops else None


def _assert_equal_pymc(built, fn, points=3, seed=4):
    rng = np.random.default_rng(seed)
    for _ in range(points):
        point = rng.normal(scale=0.4, size=built.size)
        logp, dlogp = fn(point)
        want_logp, want_dlogp = built.serial(point)
        assert np.isfinite(want_logp)
        np.testing.assert_allclose(logp, want_logp, rtol=1e-10)
        np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-10, atol=1e-12)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["block", "sliced"])
def test_logp_dlogp_equal_pymc(built, name):
    _assert_equal_pymc(built, built.parallel[name])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["block", "sliced"])
def test_one_parallel_call_per_evaluation(built, name):
    fn = built.parallel[name]
    op = _row_sum(fn)
    if op is None:  # one process, one block: PyMC's own function, no call at all
        assert synk.n_parallel() == 1 and name == "block"
        return
    assert sorted(op.part.lengths) == sorted([*LENGTHS, PENALTY_ROWS])
    points = np.random.default_rng(1).normal(scale=0.4, size=(4, built.size))
    fn(points[0])
    with synk.profile() as profile:
        for point in points:
            fn(point)
    assert [record.kind for record in profile.records] == ["call"] * len(points)
    if name == "sliced":  # 301 positions: at most 13 a slice
        assert op.num_slices == math.ceil(math.ceil(301 / synk.n_parallel()) / 13)


@pytest.mark.timeout(900)
def test_rows_balanced_unevenly_over_every_length(built, monkeypatch):
    n = synk.n_parallel()
    fn = built.parallel["block"]
    if n == 1:  # nothing to balance: PyMC's own function
        assert _row_sum(fn) is None
        return
    part = _row_sum(fn).part
    # the last process made to look three times slower a row: its share of every
    # length shrinks, and the sum stays PyMC's
    balancer = synk.steps.Balancer(n, window=4, skip=0)
    for _ in range(4):
        balancer.record([(100, 1e-3)] * (n - 1) + [(100, 3e-3)])
    seen = []
    record = balancer.record
    monkeypatch.setattr(balancer, "record", lambda t: (seen.append(t), record(t)))
    monkeypatch.setattr(part, "balancer", balancer)
    with synk.profile() as profile:
        _assert_equal_pymc(built, fn, points=2, seed=6)
    # still one command an evaluation (one call, with its shares and timings)
    assert [record.kind for record in profile.records] == ["call"] * 2
    assert balancer.in_use is not None and len(seen) == 2
    positions = [timing[0] for timing in seen[-1]]
    assert sum(positions) == max(LENGTHS) and positions[-1] < 0.6 * min(positions[:-1])
