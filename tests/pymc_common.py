"""What the PyMC tests share: a small regression model, draws compared bit for bit,
the package's log lines and sampling options kept quiet (the integration tests' session
of two processes, ``two``, is in ``tests/integration/conftest.py``).

Imported only by test modules that have already skipped where PyMC is missing
(``pytest.importorskip("pymc")``).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pymc as pm

ROOT = pathlib.Path(__file__).parents[1]

QUIET = dict(progressbar=False, compute_convergence_checks=False)
# PyMC's own NUTS named: PyMC 6 would otherwise pick nutpie where it is installed
DRAWS = dict(draws=20, tune=20, chains=2, cores=1, random_seed=11, nuts_sampler="pymc", **QUIET)


def regression(rows=150, seed=3):
    """y ~ Normal(x @ b, sigma), two features."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 2))
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=2)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", x @ b, sigma, observed=x @ [0.5, -1.0] + rng.normal(size=rows))
    return model


def assert_same_draws(got, want, names=("b", "sigma")):
    for name in names:
        np.testing.assert_array_equal(got.posterior[name].values, want.posterior[name].values,
                                      err_msg=name)


def said(caplog) -> list[str]:
    """The ``synkhronos.pymc:`` log lines ``caplog`` caught."""
    return [r.getMessage() for r in caplog.records if "synkhronos.pymc:" in r.getMessage()]



def in_fresh_python(module: str, check: str, *args) -> None:
    """``check(*args)``, a function of the test module ``module`` (dotted, from the
    repository's root), run in a new Python process: for checks that start JAX's
    runtime, after which no later test of this run could fork a session."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"from {module} import {check}; {check}(*{args!r})")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=800, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
