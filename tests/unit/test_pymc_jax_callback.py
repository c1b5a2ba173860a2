"""The divided log-density as a JAX function (``synkhronos.pymc._jax_samplers``),
against PyMC's own JAX function and the ``ValueGradFunction`` it calls back:

- its value and gradient (``jax.value_and_grad``, jitted) are the function's, bit for
  bit, at several points, vectorised with ``jax.vmap`` too; PyMC's flag gives minus
  the log-density as PyMC's does (numpyro's potential); equal to PyMC's JAX function
  to rounding;
- an evaluation's error is kept for ``sample_jax``, which raises it as itself (JAX
  reports a runtime error of its callback), here from numpyro's sampling loop.

Each check runs in a fresh Python (``in_fresh_python``): JAX's runtime, once started,
would keep the later tests of this run from forking their sessions (so nothing here
imports JAX's samplers either). numpyro is optional (CI's PyMC environments have it).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)
if importlib.util.find_spec("jax") is None:
    pytest.skip("JAX is not installed here (the test extra has it)", allow_module_level=True)

from tests.pymc_common import in_fresh_python, regression  # noqa: E402


def _points(model, count):
    rng = np.random.default_rng(5)
    start = model.initial_point()
    return [[np.asarray(start[v.name] + 0.3 * rng.normal(size=np.shape(start[v.name])))
             for v in model.value_vars] for _ in range(count)]


def check_value_and_gradient():
    import jax
    import jax.numpy as jnp
    from pymc.sampling.jax import get_jaxified_logp

    from synkhronos.pymc._jax_samplers import callback_logp

    model = regression()
    vgf = model.logp_dlogp_function(ravel_inputs=True)
    vgf.set_extra_values({})
    failures: list = []
    for negative_logp in (True, False):
        sign = 1 if negative_logp else -1
        ours = jax.jit(jax.value_and_grad(callback_logp(vgf, model, negative_logp, failures)))
        pymcs = jax.value_and_grad(get_jaxified_logp(model, negative_logp))
        points = _points(model, 3)
        for point in points:
            value, grad = ours([jnp.asarray(a) for a in point])
            want_value, want_grad = vgf(np.concatenate([np.ravel(a) for a in point]))
            assert float(value) == sign * float(want_value)
            np.testing.assert_array_equal(
                np.concatenate([np.ravel(g) for g in grad]), sign * want_grad)
            pymc_value, pymc_grad = pymcs([jnp.asarray(a) for a in point])
            np.testing.assert_allclose(float(value), float(pymc_value), rtol=1e-10)
            for g, h in zip(grad, pymc_grad, strict=True):
                np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-8)
        stacked = [jnp.stack([point[i] for point in points]) for i in range(len(points[0]))]
        values, _ = jax.vmap(ours)(stacked)
        for value, point in zip(values, points, strict=True):
            assert float(value) == sign * float(
                vgf(np.concatenate([np.ravel(a) for a in point]))[0])
    assert failures == []


def check_an_error_is_raised_as_itself():
    import pymc as pm

    from synkhronos.pymc._jax_samplers import sample_jax

    model = regression()
    own = model.logp_dlogp_function(ravel_inputs=True)

    class FailsLater:
        """PyMC's function, until its 30th call."""

        calls = 0

        def set_extra_values(self, values):
            own.set_extra_values(values)

        def __call__(self, x):
            self.calls += 1
            if self.calls == 30:
                raise ValueError("evaluation 30 failed")
            return own(x)

    vgf = FailsLater()
    try:
        sample_jax(pm, model, vgf, dict(nuts_sampler="numpyro", draws=20, tune=20,
                                        chains=1, random_seed=1, progressbar=False,
                                        compute_convergence_checks=False))
    except ValueError as exc:
        assert str(exc) == "evaluation 30 failed", exc
    else:
        raise AssertionError("sampling went on after the evaluation failed")
    assert vgf.calls == 30


@pytest.mark.timeout(600)
def test_value_and_gradient_are_the_functions():
    in_fresh_python(__name__, "check_value_and_gradient")


@pytest.mark.timeout(600)
def test_an_evaluations_error_is_raised_as_itself():
    if importlib.util.find_spec("numpyro") is None:  # (looked up: imported, JAX starts)
        pytest.skip("numpyro is not installed here (optional; CI's PyMC environments "
                    "have it)")
    in_fresh_python(__name__, "check_an_error_is_raised_as_itself")

