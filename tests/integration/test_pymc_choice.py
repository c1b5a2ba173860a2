"""synkhronos.pymc.sample chooses by measurement whether to divide at all
(``divide=None``), called as a PyMC user calls it:

- a small model, no session: nothing is forked and the draws are ``pm.sample``'s bit
  for bit (it is ``pm.sample``); ``divide=False`` the same in a session;
- a model with a discrete free variable: ``pm.sample``'s compound step, bit for bit
  (``divide=True`` refuses it).

``tests/unit/test_pymc_choice.py`` drives the choice itself (its timing forced).
PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos as synk  # noqa: E402
import synkhronos.pymc as synk_pymc  # noqa: E402
from synkhronos.testing import session_open  # noqa: E402
from tests.pymc_common import DRAWS, assert_same_draws, regression, said  # noqa: E402


@pytest.mark.timeout(600)
def test_a_small_model_is_pm_sample(caplog):
    model = regression()
    with caplog.at_level(logging.INFO, logger="synkhronos"):
        got = synk_pymc.sample(model=model, **DRAWS)
    assert not session_open()
    assert any("before forking, PyMC's own function" in line for line in said(caplog))
    assert not any("divided over" in line for line in said(caplog))
    assert_same_draws(got, pm.sample(model=model, **DRAWS))


@pytest.mark.timeout(600)
def test_without_nuts_sampler_it_is_pm_sample_with_its_default(caplog):
    # nutpie where it is installed (PyMC 6's pm.sample chooses it too), else PyMC's
    # NUTS: a small model is then pm.sample itself
    model = regression()
    options = {key: value for key, value in DRAWS.items() if key != "nuts_sampler"}
    with caplog.at_level(logging.INFO, logger="synkhronos"):
        got = synk_pymc.sample(model=model, **options)
    want = pm.sample(model=model, **options)
    library = want.posterior.attrs.get("inference_library")
    assert got.posterior.attrs.get("inference_library") == library
    assert any("PyMC's own function (not divided): PyMC's evaluation" in line
               for line in said(caplog)), said(caplog)
    # not divided: pm.sample itself, whichever sampler it ran
    assert_same_draws(got, want)
    assert _groups(got) == _groups(want)
    # divided, the same sampler drives the divided function
    divided = synk_pymc.sample(model=model, divide=True, processes_per_chain=2, **options)
    assert not session_open()
    assert divided.posterior.attrs.get("inference_library") == want.posterior.attrs.get(
        "inference_library")
    assert set(divided.posterior.data_vars) == set(want.posterior.data_vars)
    assert _groups(divided) == _groups(want)


def _groups(idata) -> set[str]:
    """An InferenceData's groups (ArviZ 1's DataTree: its children)."""
    children = getattr(idata, "children", None)
    return set(children) if children is not None else set(idata.groups())


@pytest.mark.timeout(600)
def test_divide_false_is_pm_sample_in_a_session():
    model = regression()
    synk.fork(3)
    try:
        got = synk_pymc.sample(model=model, divide=False, **DRAWS)
        assert synk.n_parallel() == 3  # the user's session is left as it was
    finally:
        synk.close()
    assert_same_draws(got, pm.sample(model=model, **DRAWS))
    with pytest.raises(TypeError, match="divide must be True, False or None"):
        synk_pymc.sample(model=model, divide="yes", **DRAWS)


@pytest.mark.timeout(600)
def test_a_discrete_variable_is_pm_sample():
    rng = np.random.default_rng(4)
    with pm.Model() as model:
        switch = pm.Bernoulli("switch", 0.5)
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu + switch, 1, observed=rng.normal(1.0, 1.0, size=200))
    got = synk_pymc.sample(model=model, **DRAWS)
    want = pm.sample(model=model, **DRAWS)
    for name in ("switch", "mu"):
        np.testing.assert_array_equal(got.posterior[name].values, want.posterior[name].values)
    with pytest.raises(ValueError, match="'switch' is discrete"):
        synk_pymc.sample(model=model, divide=True, **DRAWS)
    assert not session_open()
