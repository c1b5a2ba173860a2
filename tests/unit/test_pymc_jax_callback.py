"""The divided log-likelihood's Op in a graph JAX compiles (``_rowsum._jax_callback``),
in the rewritten model PyMC's JAX route samples, against PyMC's own JAX function of
the user's model and the rewritten model's own compiled function:

- its value and gradient (``jax.value_and_grad``, jitted) are the compiled function's,
  bit for bit, at several points, vectorised with ``jax.vmap`` too; PyMC's flag gives
  minus the log-density as PyMC's does (numpyro's potential); equal to PyMC's JAX
  function of the user's model to rounding;
- an evaluation's error is kept on the Op, and ``sample`` raises it as itself (JAX
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


def _built(model):
    """The session (two processes) and the rewritten model with its Op."""
    import synkhronos as synk
    from synkhronos.pymc import _likelihood

    synk.fork(2)
    return _likelihood.build(pm, model, None, None)


def check_value_and_gradient():
    import jax
    import jax.numpy as jnp
    from pymc.sampling.jax import get_jaxified_logp

    from synkhronos.pymc import _rowsum

    model = regression()
    rewritten, op = _built(model)
    _rowsum.register_backends("JAX")
    vgf = rewritten.logp_dlogp_function(ravel_inputs=True)
    vgf.set_extra_values({})
    for negative_logp in (True, False):
        sign = 1 if negative_logp else -1
        ours = jax.jit(jax.value_and_grad(get_jaxified_logp(rewritten, negative_logp)))
        pymcs = jax.value_and_grad(get_jaxified_logp(model, negative_logp))
        points = _points(model, 3)
        for point in points:
            value, grad = ours([jnp.asarray(a) for a in point])
            want_value, want_grad = vgf(np.concatenate([np.ravel(a) for a in point]))
            np.testing.assert_allclose(float(value), sign * float(want_value), rtol=1e-12)
            np.testing.assert_allclose(np.concatenate([np.ravel(g) for g in grad]),
                                       sign * want_grad, rtol=1e-10)
            pymc_value, pymc_grad = pymcs([jnp.asarray(a) for a in point])
            np.testing.assert_allclose(float(value), float(pymc_value), rtol=1e-10)
            for g, h in zip(grad, pymc_grad, strict=True):
                np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-8)
        stacked = [jnp.stack([point[i] for point in points]) for i in range(len(points[0]))]
        values, _ = jax.vmap(ours)(stacked)
        for value, point in zip(values, points, strict=True):
            np.testing.assert_allclose(float(value), sign * float(
                vgf(np.concatenate([np.ravel(a) for a in point]))[0]), rtol=1e-12)
    assert op.failures == []


def check_an_error_is_raised_as_itself():
    from synkhronos.pymc import _sampling

    model = regression()
    rewritten, op = _built(model)
    evaluate = op._evaluate
    calls = []

    def fails_later(theta):
        calls.append(1)
        if len(calls) == 30:
            raise ValueError("evaluation 30 failed")
        return evaluate(theta)

    op._evaluate = fails_later
    try:
        _sampling._pm_sample(pm, model, rewritten, dict(
            nuts_sampler="numpyro", draws=20, tune=20, chains=1, random_seed=1,
            progressbar=False, compute_convergence_checks=False), op)
    except ValueError as exc:
        assert str(exc) == "evaluation 30 failed", exc
    else:
        raise AssertionError("sampling went on after the evaluation failed")
    assert len(calls) == 30


def check_backend_jax():
    import synkhronos as synk
    import synkhronos.pymc as synk_pymc

    model = regression()
    want = model.logp_dlogp_function(ravel_inputs=True)
    want.set_extra_values({})
    synk.fork(2)
    got = synk_pymc.logp_dlogp_function(model, backend="jax")
    got.set_extra_values({})
    assert type(got._pytensor_function.maker.linker).__name__ == "JAXLinker"
    for point in _points(model, 3):
        x = np.concatenate([np.ravel(a) for a in point])
        np.testing.assert_allclose(got(x)[0], want(x)[0], rtol=1e-10)
        np.testing.assert_allclose(got(x)[1], want(x)[1], rtol=1e-8, atol=1e-10)
    synk.close()


@pytest.mark.timeout(600)
def test_backend_jax_compiles_the_rows_and_the_function_with_jax():
    in_fresh_python(__name__, "check_backend_jax")


@pytest.mark.timeout(600)
def test_value_and_gradient_are_the_functions():
    in_fresh_python(__name__, "check_value_and_gradient")


@pytest.mark.timeout(600)
def test_an_evaluations_error_is_raised_as_itself():
    if importlib.util.find_spec("numpyro") is None:  # (looked up: imported, JAX starts)
        pytest.skip("numpyro is not installed here (optional; CI's PyMC environments "
                    "have it)")
    in_fresh_python(__name__, "check_an_error_is_raised_as_itself")

