"""Exact mode: sums that do not depend on the number of processes.

``exact=True`` cuts the rows into fixed chunks, evaluates each (whichever process takes
it) and adds the chunks' sums in chunk order in the master. Checked here against the
same function at other sizes, bit for bit: the zoo's hierarchical model (an index
container) and a model of several observed variables of different lengths, at
n_parallel 1, 2 and 3, at the default chunks and at chunks of an uneven number of rows,
with the rows balanced unevenly by measured speed too; and ``sample(exact=True)``'s
draws, equal at one, two and three processes a chain and with two chains at once. Each
value is also PyMC's own to rounding (rtol 1e-10 in float64).

Each test forks and closes its own sessions (one per size), so it runs in a module of
its own. PyMC is not in the ``test`` extra: CI runs this module in its environments
with the ``pymc`` extra.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytest

from ..conftest import sizes_to_run

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos as synk  # noqa: E402
import synkhronos.pymc as synk_pymc  # noqa: E402

from .pymc_zoo import hierarchical  # noqa: E402
from .test_pymc_groups import SPLIT, _row_sum, several_lengths  # noqa: E402

SIZES = [param.values[0] for param in sizes_to_run((1, 2, 3))]
if len(SIZES) < 2:
    pytest.skip("exact mode is compared across session sizes; SYNKHRONOS_TEST_SIZES "
                "names one", allow_module_level=True)


def _points(model, count=3, seed=3):
    size = sum(np.size(v) for v in model.initial_point().values())
    return np.random.default_rng(seed).normal(scale=0.3, size=(count, size))


def _evaluations(model, points, n, uneven, **kwargs):
    """The exact function's (logp, dlogp) at ``points`` in a session of ``n``; with
    ``uneven``, also with the last process made to look three times slower a row."""
    synk.fork(n)
    try:
        fn = synk_pymc.logp_dlogp_function(model, exact=True, **kwargs)
        fn.set_extra_values({})
        op = _row_sum(fn)
        assert op is not None, "exact mode always runs the chunks, at one process too"
        values = [tuple(np.array(v) for v in fn(point)) for point in points]
        if uneven and n > 1:
            balancer = synk.steps.Balancer(n, window=4, skip=0)
            for _ in range(4):
                balancer.record([(100, 1e-3)] * (n - 1) + [(100, 3e-3)])
            op.part.balancer = balancer
            balanced = [tuple(np.array(v) for v in fn(point)) for point in points]
            assert balancer.in_use is not None
            _assert_same(balanced, values)
        return values
    finally:
        synk.close()


def _assert_same(got, want):
    for (logp, dlogp), (want_logp, want_dlogp) in zip(got, want, strict=True):
        assert logp.tobytes() == want_logp.tobytes()
        assert dlogp.tobytes() == want_dlogp.tobytes()


def _assert_pymc(model, points, values):
    serial = model.logp_dlogp_function(ravel_inputs=True)
    serial.set_extra_values({})
    for point, (logp, dlogp) in zip(points, values, strict=True):
        want_logp, want_dlogp = serial(point)
        np.testing.assert_allclose(logp, want_logp, rtol=1e-10)
        np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-10, atol=1e-12)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", ["hierarchical", "hierarchical_grain7", "lengths_grain13"])
def test_exact_same_bits_at_every_size(case):
    if case.startswith("hierarchical"):
        model, kwargs = hierarchical()[0], {}
    else:
        model, kwargs = several_lengths(), {"split": SPLIT}
    if "grain" in case:
        kwargs["grainsize"] = int(case.rsplit("grain", 1)[1])
    points = _points(model)
    first = None
    for n in SIZES:
        values = _evaluations(model, points, n, uneven=True, **kwargs)
        if first is None:
            first = values
            _assert_pymc(model, points, values)
        else:
            _assert_same(values, first)


@pytest.mark.timeout(900)
def test_exact_draws_same_at_every_layout():
    model = hierarchical()[0]
    options = dict(draws=30, tune=30, chains=2, random_seed=11, progressbar=False,
                   compute_convergence_checks=False, model=model, exact=True,
                   nuts_sampler="pymc")
    names = list(model.initial_point())
    draws = {}
    for n in SIZES:
        idata = synk_pymc.sample(cores=1, processes_per_chain=n, **options)
        draws[f"1x{n}"] = [idata.posterior[v.replace("_log__", "")].values for v in names]
    # two chains at once, a process each: the chunks are the same, so are the draws
    idata = synk_pymc.sample(cores=2, processes_per_chain=1, **options)
    draws["2x1"] = [idata.posterior[v.replace("_log__", "")].values for v in names]
    first = draws.pop(f"1x{SIZES[0]}")
    for layout, values in draws.items():
        for got, want in zip(values, first, strict=True):
            assert got.tobytes() == want.tobytes(), layout


def _float32_model():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3001, 3)).astype("float32")
    y = (x @ np.array([0.5, -1.0, 2.0]) + rng.normal(size=3001)).astype("float32")
    with pm.Model() as model:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0, 1, shape=3)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", xd @ b, s, observed=y)
    return model


@pytest.mark.timeout(900)
def test_float32_model_divided_and_exact():
    # floatX float32 throughout: the sums are float32, the check of the split allows
    # float32's rounding (it refused a right split before), exact mode stays exact
    with pytensor.config.change_flags(floatX="float32"):
        model = _float32_model()
        own = model.logp_dlogp_function(ravel_inputs=True)
        own.set_extra_values({})
        point = np.array([0.3, -0.2, 0.1, 0.05], dtype="float32")
        want_logp, want_dlogp = own(point)
        first = None
        for n in SIZES:
            synk.fork(n)
            try:
                for exact in (False, True):
                    fn = synk_pymc.logp_dlogp_function(model, exact=exact)
                    fn.set_extra_values({})
                    logp, dlogp = (np.array(v) for v in fn(point))
                    assert logp.dtype == dlogp.dtype == np.float32
                    np.testing.assert_allclose(logp, want_logp, rtol=1e-5)
                    np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-4,
                                               atol=1e-5 * np.abs(want_dlogp).max())
                    if exact:
                        first = first or (logp.tobytes(), dlogp.tobytes())
                        assert (logp.tobytes(), dlogp.tobytes()) == first, n
            finally:
                synk.close()


def test_exact_checked_before_forking():
    model = hierarchical()[0]
    with pytest.raises(TypeError, match="exact must be True or False"):
        synk_pymc.sample(10, model=model, exact="yes")
    with pytest.raises(ValueError, match="divide=False"):
        synk_pymc.sample(10, model=model, exact=True, divide=False)
    assert synk_pymc.logp_dlogp_function.__kwdefaults__["exact"] is False
