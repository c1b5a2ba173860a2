"""Every model kind PyMC's documentation uses gives PyMC's own logp and gradient.

The zoo (``pymc_zoo.py``): GLMs with numpy arrays and with ``pm.Data``, coords and
dims, a hierarchical model with a group index, a mixture, censored, truncated,
zero-inflated and ordinal likelihoods, multivariate rows (``MvNormal``, ``Multinomial``,
``DirichletMultinomial``), two datasets of different lengths, missing values (PyMC's
imputation) and a ``pm.Potential`` likelihood. Each is built with
``synkhronos.pymc.logp_dlogp_function`` once per session (n = 2 and 3, shared by the
whole module) and compared with ``model.logp_dlogp_function`` at points, rtol 1e-9.
"""

from __future__ import annotations

import numpy as np
import pytest

from ..conftest import session_fixture

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos.pymc as synk_pymc  # noqa: E402

from .pymc_zoo import ROWS, ZOO  # noqa: E402


class Built:
    def __init__(self):
        self.models, self.parallel, self.serial = {}, {}, {}
        for name, build in ZOO.items():
            model, split = build()
            fn = synk_pymc.logp_dlogp_function(model, split=split)
            fn.set_extra_values({})
            ref = model.logp_dlogp_function(ravel_inputs=True)
            ref.set_extra_values({})
            self.models[name], self.parallel[name], self.serial[name] = model, fn, ref


built = session_fixture(Built, sizes=(2, 3))


def test_the_zoo_has_at_least_twelve_kinds():
    assert len(ZOO) >= 12


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(ZOO))
def test_logp_and_gradient_equal_pymc(built, name):
    n_dim = sum(np.size(v) for v in built.models[name].initial_point().values())
    rng = np.random.default_rng(3)
    for _ in range(2):
        point = rng.normal(scale=0.3, size=n_dim)
        logp, dlogp = built.parallel[name](point)
        want_logp, want_dlogp = built.serial[name](point)
        assert np.isfinite(want_logp)
        np.testing.assert_allclose(logp, want_logp, rtol=1e-9)
        np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-9, atol=1e-9)


def _row_lengths(fn) -> tuple[int, ...]:
    """Each divided group's rows, all run by the one function of the RowSum Op."""
    ops = [node.op for node in fn._pytensor_function.maker.fgraph.apply_nodes
           if type(node.op).__name__ == "RowSum"]
    return ops[0].part.lengths


def test_two_datasets_are_divided_each_on_its_own_rows(built):
    assert _row_lengths(built.parallel["two_datasets"]) == (ROWS, 37)
    assert _row_lengths(built.parallel["glm_data"]) == (ROWS,)


def _posterior(model, draws=4):
    """An InferenceData whose posterior is a few prior draws (what matters is that it
    holds values of every free variable)."""
    with model:
        prior = pm.sample_prior_predictive(draws=draws, random_seed=1)
    dataset = prior["prior"]
    dataset = dataset.to_dataset() if hasattr(dataset, "to_dataset") else dataset
    dataset = dataset[[rv.name for rv in model.free_RVs]]
    if hasattr(prior, "add_groups"):  # ArviZ 0.x InferenceData (PyMC 5)
        import arviz

        return arviz.InferenceData(posterior=dataset)
    return type(prior).from_dict({"posterior": dataset})  # xarray DataTree (PyMC 6)


LOG_LIKELIHOOD = ["glm_data", "dims_coords", "mv_normal", "two_datasets", "missing_values"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", LOG_LIKELIHOOD)
def test_compute_log_likelihood_equals_pymc(built, name):
    model = built.models[name]
    split = ZOO[name]()[1]
    idata = _posterior(model)
    want = pm.compute_log_likelihood(idata, model=model, extend_inferencedata=False,
                                     progressbar=False)
    got = synk_pymc.compute_log_likelihood(idata, model=model, split=split,
                                           extend_inferencedata=False)
    assert set(got.data_vars) == set(want.data_vars)
    for var in want.data_vars:
        assert got[var].dims == want[var].dims
        np.testing.assert_allclose(got[var].values, want[var].values, rtol=1e-9)
    extended = synk_pymc.compute_log_likelihood(idata, model=model, split=split,
                                                var_names=[next(iter(want.data_vars))])
    assert extended is idata
    assert list(idata["log_likelihood"].data_vars) == [next(iter(want.data_vars))]


def test_compute_log_likelihood_checks_var_names(built):
    model = built.models["glm_data"]
    idata = _posterior(model)
    with pytest.raises(ValueError, match="'beta' is not one"):
        synk_pymc.compute_log_likelihood(idata, model=model, var_names=["beta"])
    with pytest.raises(TypeError, match="var_names must be a list"):
        synk_pymc.compute_log_likelihood(idata, model=model, var_names="y")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["glm_numpy", "hierarchical", "two_datasets"])
def test_find_map_equals_pymc(built, name):
    model = built.models[name]
    got = synk_pymc.find_MAP(model=model, split=ZOO[name]()[1])
    want = pm.find_MAP(model=model, progressbar=False)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)
