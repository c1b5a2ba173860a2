"""``sample(nuts_sampler="numpyro")`` and ``"blackjax"``: ``pm.sample``'s JAX route
with the divided log-density as a host callback, checked against that route itself.

- divided over two processes, by default and (numpyro) in exact mode, the draws agree with
  ``pm.sample``'s to rounding over a short run, and the InferenceData has
  ``pm.sample``'s groups and attributes;
- without ``divide=True`` it is ``pm.sample`` itself: the same draws bit for bit;
- a sampler that is not installed is an ImportError before anything is forked.

Each check runs in a fresh Python (``in_fresh_python``): sampling starts JAX's
runtime, after which a program can fork no session (``synk.fork`` refuses), and the
other tests of this run fork theirs. numpyro and blackjax are optional (CI's PyMC
environments install both).
"""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos as synk  # noqa: E402
import synkhronos.pymc as synk_pymc  # noqa: E402
from tests.pymc_common import (  # noqa: E402
    QUIET,
    assert_same_draws,
    in_fresh_python,
    regression,
)

SHORT = dict(draws=5, tune=20, chains=2, random_seed=8, **QUIET)


def _installed(sampler):
    # looked up, not imported: importing blackjax starts JAX's runtime, and no later
    # test of this run could fork a session
    if importlib.util.find_spec(sampler) is None:
        pytest.skip(f"{sampler} is not installed here (optional; CI's PyMC environments "
                    "have it)")


@pytest.fixture(params=["numpyro", "blackjax"])
def sampler(request):
    _installed(request.param)
    return request.param


def _log_lines() -> list[str]:
    """From now on, the ``synkhronos.pymc:`` log lines of this process."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            if "synkhronos.pymc:" in record.getMessage():
                lines.append(record.getMessage())

    logger = logging.getLogger("synkhronos")
    logger.setLevel(logging.INFO)
    logger.addHandler(Keep())
    return lines


def _close_draws(got, want, names=("b", "sigma"), rel=1e-4):
    for name in names:
        a, b = got.posterior[name].values, want.posterior[name].values
        np.testing.assert_allclose(a, b, rtol=0, atol=rel * b.std(), err_msg=name)


# -- the checks, each run in a fresh process ---------------------------------------------
def check_sampler(sampler):
    # One session forked first, as the docs say: once a sampler has run, JAX has
    # started and no session can fork; both samplings run in it.
    lines = _log_lines()
    model = regression(rows=301)
    synk.fork(2)
    try:
        divided = synk_pymc.sample(model=model, nuts_sampler=sampler, divide=True, **SHORT)
        assert any("divided over 2 processes" in line for line in lines), lines
        # exact mode too, once (its sums the same at every n: test_pymc_exact.py)
        exact = (synk_pymc.sample(model=model, nuts_sampler=sampler, exact=True, **SHORT)
                 if sampler == "numpyro" else None)
    finally:
        synk.close()
    want = pm.sample(model=model, nuts_sampler=sampler, **SHORT)
    _close_draws(divided, want)
    if exact is not None:
        _close_draws(exact, want)
    for group in ("posterior", "sample_stats", "observed_data"):
        assert group in divided and group in want, group
    assert (divided.posterior.attrs["inference_library"]
            == want.posterior.attrs["inference_library"])
    assert divided.posterior.attrs["tuning_steps"] == 20
    del lines[:]
    assert_same_draws(synk_pymc.sample(model=model, nuts_sampler=sampler, **SHORT), want)
    assert any("not divided" in line for line in lines), lines


# -- the tests --------------------------------------------------------------------------------
@pytest.mark.timeout(900)
def test_divided_draws_as_pm_samples_and_undivided_pm_sample_itself(sampler):
    in_fresh_python(__name__, "check_sampler", sampler)


def test_a_sampler_not_installed_is_an_import_error_before_forking(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "numpyro" else find_spec(name, *a))
    with pytest.raises(ImportError, match="pip install numpyro"):
        synk_pymc.sample(model=regression(), nuts_sampler="numpyro", divide=True, **SHORT)
