"""The choice of ``synkhronos.pymc.sample(divide=None)`` (``synkhronos.pymc._choice``),
driven directly: the prediction made before forking (``worth_forking``): PyMC's
evaluation too short for the saving to pay for building, no; long enough, yes; rows in
slices, yes at one process; the measured check after building (``keep_divided``) keeps
the faster of two functions; and in a session, both outcomes of that check (its timing
forced): PyMC's own function kept (draws ``pm.sample``'s bit for bit), or the divided
one kept (draws equal ``pm.sample``'s to rounding, its likelihood evaluated by every
process). ``tests/integration/test_pymc_choice.py`` samples as users call it.

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos as synk  # noqa: E402
import synkhronos.pymc as synk_pymc  # noqa: E402
from synkhronos.pymc import _choice  # noqa: E402
from tests.pymc_common import DRAWS, assert_same_draws, regression, said  # noqa: E402


def test_the_prediction_before_forking():
    def own(seconds, compile_s=0.5):
        return _choice.Own(vgf=None, compile_s=compile_s, seconds=seconds, x=np.zeros(1))

    # 40 us an evaluation (10^3 rows here): the call's fixed cost eats the saving
    assert not _choice.worth_forking(own(40e-6), 2, 16_000, sliced=False).divided
    # 4 ms (10^5 rows): seconds saved over 16 000 evaluations, for one second of building
    choice = _choice.worth_forking(own(4e-3), 2, 16_000, sliced=False)
    assert choice.divided and choice.predicted_saving_s > choice.predicted_cost_s
    # long evaluations, but too few of them to pay for the building
    assert not _choice.worth_forking(own(4e-3), 2, 100, sliced=False).divided
    # one process: nothing to divide, unless its rows run in slices
    assert not _choice.worth_forking(own(4e-3), 1, 16_000, sliced=False).divided
    assert _choice.worth_forking(own(4e-3), 1, 16_000, sliced=True).divided
    # the evaluations one running chain makes: its share of the chains
    assert _choice.expected_evaluations({"draws": 100, "tune": 50}, 4, 2) == 2 * 150 * 16


def test_the_draws_of_a_chain():
    # the draws of a chain, PyMC's defaults where not given (PyMC 6: tune None is 1000)
    assert _choice.draws_per_chain({"draws": 100, "tune": 50}) == 150
    assert _choice.draws_per_chain({"draws": 100}) == 1100


def test_the_check_after_building_keeps_the_faster():
    slow = lambda x: time.sleep(0.002)  # noqa: E731
    fast = lambda x: x  # noqa: E731
    own = _choice.Own(vgf=slow, compile_s=0.1, seconds=0.002, x=np.zeros(1))
    assert _choice.keep_divided(own, fast, 2).divided
    own = _choice.Own(vgf=fast, compile_s=0.1, seconds=0.0, x=np.zeros(1))
    choice = _choice.keep_divided(own, slow, 2)
    assert not choice.divided and choice.divided_s >= 0.002 > choice.pymc_s
    assert "PyMC's own function" in str(choice)


class _Lazy:
    """A result computed when read, as a JAX array is (its function returned at once)."""

    def __array__(self, dtype=None, copy=None):
        time.sleep(0.002)
        return np.zeros(1)


def test_a_function_is_timed_until_its_results_are_read():
    # PyMC's function compiled with JAX returns before computing: unread, it was timed
    # at its dispatch, a fraction of its cost, and kept over a faster divided one
    lazy = lambda x: (_Lazy(), _Lazy())  # noqa: E731
    (seconds,) = _choice.seconds_per_evaluation([lazy], np.zeros(1))
    assert seconds >= 0.004


def test_functions_are_timed_at_a_jittered_start():
    # where pm.init_nuts starts a chain (uniform jitter in [-1, 1]), not at the initial
    # point, where a logistic regression's rows are uncommonly cheap; the same point
    # every time
    model = regression()
    x, start = _choice.measuring_point(model), _choice.initial_vector(model)
    assert x.shape == start.shape and np.all(x != start)
    assert np.all(np.abs(x - start) <= 1)
    np.testing.assert_array_equal(x, _choice.measuring_point(model))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("divided_faster", [False, True])
def test_the_measured_check_in_a_session(monkeypatch, caplog, divided_faster):
    model = regression()
    # the timing forced: [PyMC's own, divided] seconds per evaluation
    figures = [1e-3, 5e-4] if divided_faster else [1e-3, 2e-3]
    monkeypatch.setattr(_choice, "seconds_per_evaluation", lambda fns, x: figures[-len(fns):])
    want = pm.sample(model=model, **DRAWS)
    synk.fork(3)
    try:
        with caplog.at_level(logging.INFO, logger="synkhronos"), synk.profile() as prof:
            got = synk_pymc.sample(model=model, **DRAWS)
    finally:
        synk.close()
    measured = [line for line in said(caplog) if "measured," in line]
    assert len(measured) == 1
    calls = [r for r in prof.records if r.kind == "call" and r.name == "pymc_loglik"]
    if divided_faster:
        assert "divided over 3 processes" in measured[0]
        assert len(calls) > 2 * (20 + 20)  # every evaluation, on every process
        for name in ("b", "sigma"):  # the same chains, to rounding
            np.testing.assert_allclose(got.posterior[name].values, want.posterior[name].values,
                                       rtol=1e-6, atol=1e-8, err_msg=name)
    else:
        assert "PyMC's own function" in measured[0]
        assert len(calls) <= 10  # the build alone (its check, its timing), no evaluation
        assert_same_draws(got, want)
