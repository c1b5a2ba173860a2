"""synkhronos.pymc on unmodified PyMC models, checked against PyMC itself.

- the models: a logistic regression written with numpy arrays, a hierarchical GLM
  written with ``pm.Data`` containers and dims (``test_pymc_logp.py`` checks their logp
  and dlogp against PyMC's at n_parallel 1, 2 and 3, and -inf out of support);
- ``sample`` gives posterior means within 3 MCSE of ``pm.sample`` (same seed, and another
  seed), and the same draws up to rounding for the same seed;
- ``sample`` takes ``pm.sample``'s signature (draws first), keeps coords and dims, and
  refuses before forking: a model passed first, nutpie keywords without an equivalent,
  per-chain initvals on nutpie, ``pm.Minibatch`` data, a bad ``processes_per_chain``;
- a process forked from the master (a PyMC chain process) gets a clear RuntimeError;
- ``split`` and ``grainsize`` are validated, and a likelihood that mixes rows is refused;
- a likelihood whose session was closed refuses to run (n_parallel 1: no command);
- nutpie (where installed) samples the same posterior, calling from its own threads;
- the demo runs.

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra (PyMC 5.28 on Python 3.11, PyMC 6 on Python 3.12).
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import subprocess
import sys
import traceback

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import arviz as az  # noqa: E402 - a dependency of PyMC
import xarray as xr  # noqa: E402 - a dependency of ArviZ

import synkhronos as synk  # noqa: E402
import synkhronos.pymc as synk_pymc  # noqa: E402
from synkhronos.testing import session_open  # noqa: E402

DEMO = pathlib.Path(__file__).parents[2] / "demos" / "pymc_sampling.py"
SAMPLE = dict(draws=300, tune=300, chains=2, progressbar=False, compute_convergence_checks=False)
PYMC_NUTS = {"nuts_sampler": "pymc"}  # (PyMC 6 would pick nutpie where installed)


def logistic_model(rows=1001, features=3, seed=1):
    """An unmodified logistic regression: numpy data, observed numpy labels."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    beta = np.linspace(-1, 1, features)
    y = (rng.random(rows) < 1 / (1 + np.exp(-(x @ beta + 0.3)))).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=features)
        a = pm.Normal("a", 0, 2)
        pm.Bernoulli("y", logit_p=a + x @ b, observed=y)
    return model


def hierarchical_model(rows=1203, groups=6, seed=2):
    """An unmodified hierarchical GLM: pm.Data containers, dims, a group index."""
    rng = np.random.default_rng(seed)
    group = rng.integers(groups, size=rows)
    x = rng.normal(size=rows)
    y = 1.0 + rng.normal(size=groups)[group] + 0.5 * x + rng.normal(scale=0.7, size=rows)
    with pm.Model(coords={"group": range(groups), "obs": range(rows)}) as model:
        g = pm.Data("g", group, dims="obs")
        xd = pm.Data("x", x, dims="obs")
        mu_a = pm.Normal("mu_a", 0, 2)
        sigma_a = pm.HalfNormal("sigma_a", 1)
        a = pm.Normal("a", mu_a, sigma_a, dims="group")  # centred: ~200 rows a group
        b = pm.Normal("b", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Deterministic("a_mean", a.mean())
        pm.Normal("y", a[g] + b * xd, sigma, observed=y, dims="obs")
    return model


def bounded_model(rows=400, seed=3):
    """A scale left untransformed, so that a point can lie outside its support."""
    rng = np.random.default_rng(seed)
    y = rng.normal(1.0, 2.0, size=rows)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 5)
        sigma = pm.HalfNormal("sigma", 3, default_transform=None)
        pm.Normal("y", mu, sigma, observed=y)
    return model


def rows_mixing_model(rows=200, seed=0):
    """A likelihood that is not a sum over its rows: it standardises by their mean."""
    rng = np.random.default_rng(seed)
    x = rng.normal(3.0, 2.0, size=rows)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0, 1)
        standardised = (xd - xd.mean()) / xd.std()  # a mean over rows: not a sum of rows
        pm.Normal("y", b * standardised, 1, observed=rng.normal(size=rows))
    return model


def reference(model):
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    return fn


# -- sampling ------------------------------------------------------------------------------


def mcse(draws: xr.DataArray) -> np.ndarray:
    """ArviZ's Monte Carlo standard error of each component's posterior mean (draws
    with ``chain`` and ``draw`` dimensions), flattened."""
    return az.mcse(xr.Dataset({"draws": draws}), method="mean")["draws"].values.ravel()


def assert_within_mcse(got, want, names, limit=3.0):
    for name in names:
        a, b = got.posterior[name].values, want.posterior[name].values
        error = np.sqrt(mcse(got.posterior[name]) ** 2 + mcse(want.posterior[name]) ** 2)
        gap = np.abs(a.mean(axis=(0, 1)) - b.mean(axis=(0, 1))).ravel()
        assert np.all(gap <= limit * error), (name, gap, error)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("build", [logistic_model, hierarchical_model])
def test_sample_matches_pm_sample(two, build):
    model = build()
    names = [rv.name for rv in model.free_RVs]
    got = synk_pymc.sample(divide=True, model=model, random_seed=5, **SAMPLE, **PYMC_NUTS)
    want = pm.sample(model=model, random_seed=5, nuts_sampler="pymc", cores=1, **SAMPLE)
    assert_within_mcse(got, want, names)
    # Another seed: independent chains. With ten components (the hierarchical model) a
    # 3-MCSE bound fails one run in about thirty by chance alone; 4 MCSE, one in 1,500.
    other = pm.sample(model=model, random_seed=6, nuts_sampler="pymc", cores=1, **SAMPLE)
    assert_within_mcse(got, other, names, limit=4.0)
    if build is logistic_model:
        # The same seed, the same draws: the sums differ from PyMC's only by rounding.
        # (Where the trees are long, as in the hierarchical model, NUTS amplifies that
        # rounding, and the start values' round trip through the log transform, until
        # the chains part ways; they still sample the same posterior.)
        for name in names:
            a, b = got.posterior[name].values, want.posterior[name].values
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * b.std(), err_msg=name)


@pytest.mark.timeout(900)
def test_sample_forks_and_closes_its_own_session():
    assert not session_open()
    usable = sorted(os.sched_getaffinity(0))
    during: set[tuple[int, ...]] = set()

    def affinity(trace, draw):  # PyMC calls it in the master after every draw
        during.add((tuple(sorted(os.sched_getaffinity(0))), synk.n_parallel()))

    model = logistic_model(rows=301)
    result = synk_pymc.sample(divide=True, model=model, random_seed=1, draws=50, tune=50,
                              chains=1, progressbar=False, compute_convergence_checks=False,
                              callback=affinity)
    assert result.posterior["b"].shape == (1, 50, 3)
    assert not session_open()
    # its session took every usable core, unpinned (a process whose core another
    # program takes may move), while it sampled
    assert during == {(tuple(usable), len(usable))}
    assert sorted(os.sched_getaffinity(0)) == usable


@pytest.mark.timeout(900)
def test_sample_refuses_a_step(two):
    with pytest.raises(TypeError, match="samples with pm.sample's NUTS"):
        synk_pymc.sample(model=logistic_model(rows=11), step=object())
    with pytest.raises(ValueError, match="nuts_sampler must be one of 'pymc', 'nutpie', "
                       "'numpyro', 'blackjax'"):
        synk_pymc.sample(model=logistic_model(rows=11), nuts_sampler="stan")


@pytest.mark.timeout(900)
def test_sample_refuses_misuse_before_forking():
    assert not session_open()
    model = logistic_model(rows=11)
    with pytest.raises(TypeError, match="takes draws as its first argument.*model=..."):
        synk_pymc.sample(model)
    with pytest.raises(TypeError, match="nuts_sampler='nutpie' has no equivalent for "
                                        "callback, mp_ctx"):
        synk_pymc.sample(10, model=model, nuts_sampler="nutpie", mp_ctx="fork",
                         callback=print)
    with pytest.raises(TypeError, match="one dict of initvals"):
        synk_pymc.sample(10, model=model, nuts_sampler="nutpie", initvals=[{}, {}])
    for bad, error in ((0, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match="processes_per_chain must be"):
            synk_pymc.sample(10, model=model, processes_per_chain=bad)
    x = np.arange(100.0)
    with pm.Model() as minibatched:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=pm.Minibatch(x, batch_size=10), total_size=100)
    with pytest.raises(ValueError, match="'y' reads pm.Minibatch data.*ADVI"):
        synk_pymc.sample(10, model=minibatched)
    assert not session_open()


@pytest.mark.timeout(900)
def test_sample_takes_draws_positionally_and_keeps_coords():
    # its own session of processes_per_chain processes; pm.sample's keywords pass through
    model = hierarchical_model(rows=101)
    idata = synk_pymc.sample(40, divide=True, model=model, tune=40, chains=1, random_seed=2,
                             processes_per_chain=2, progressbar=False, nuts_sampler="pymc",
                             compute_convergence_checks=False, var_names=["a", "b"],
                             idata_kwargs={"log_likelihood": False})
    assert idata.posterior["a"].dims == ("chain", "draw", "group")
    assert list(idata.posterior["a"].coords["group"].values) == list(range(6))
    assert idata.posterior.sizes["draw"] == 40
    assert set(idata.posterior.data_vars) == {"a", "b"}
    assert not session_open()


def test_sample_checks_processes_against_an_open_session(two):
    with pytest.raises(ValueError, match="processes_per_chain=3, but the open session has 2"):
        synk_pymc.sample(10, model=logistic_model(rows=11), processes_per_chain=3)


# -- processes forked from the master --------------------------------------------------------
def _call_in_fork(fn, point) -> str:
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()

    def child():
        try:
            fn(point)
        except BaseException as exc:  # reported to the parent as text
            queue.put(f"{type(exc).__name__}: {exc}")
        else:
            queue.put("no error")

    process = context.Process(target=child)
    process.start()
    message = queue.get()
    process.join(60)
    return message


@pytest.mark.timeout(900)
def test_forked_chain_process_gets_a_clear_error(two):
    model = logistic_model(rows=101)
    fn = synk_pymc.logp_dlogp_function(model)
    fn.set_extra_values({})
    point = np.zeros(4)
    message = _call_in_fork(fn, point)
    assert message.startswith("RuntimeError"), message
    assert "can only be issued by the master process" in message
    assert "was forked from it" in message
    # the session is unharmed
    np.testing.assert_allclose(fn(point)[0], reference(model)(point)[0], rtol=1e-9)
    # PyMC's own chain processes (cores=2, fork) get the same error
    with model:
        step = pm.NUTS(logp_dlogp_func=fn)
        with pytest.raises(Exception) as info:
            pm.sample(step=step, draws=5, tune=5, chains=2, cores=2, mp_ctx="fork",
                      progressbar=False, compute_convergence_checks=False)
    text = "".join(traceback.format_exception(info.value))
    assert "was forked from it" in text


@pytest.mark.timeout(900)
def test_spawned_chain_processes_fall_back_to_the_master(two):
    # spawn and forkserver pickle the step: the likelihood refuses (PicklingError), and
    # PyMC then samples its chains in the master, through the session
    model = logistic_model(rows=101)
    fn = synk_pymc.logp_dlogp_function(model)
    with model:
        step = pm.NUTS(logp_dlogp_func=fn)
        idata = pm.sample(step=step, draws=20, tune=20, chains=2, cores=2, mp_ctx="spawn",
                          random_seed=1, progressbar=False, compute_convergence_checks=False)
    assert idata.posterior["b"].shape == (2, 20, 3)


# -- split -----------------------------------------------------------------------------------
@pytest.fixture
def one():
    synk.fork(1)
    try:
        yield 1
    finally:
        synk.close()


@pytest.mark.timeout(900)
def test_likelihood_of_a_closed_session_refuses_to_run(one):
    # n=1 in slices calls the compiled function in place, never reading the freed rows
    # after close (in one block it would be PyMC's own function, without rows to free)
    fn = synk_pymc.logp_dlogp_function(bounded_model(), grainsize=100)
    fn.set_extra_values({})
    good = np.array([0.5, 2.0])
    assert np.isfinite(fn(good)[0])
    synk.close()
    with pytest.raises(RuntimeError, match="session is closed"):
        fn(good)


def _two_likelihoods(rows=50, groups=4):
    rng = np.random.default_rng(0)
    with pm.Model() as model:
        scale = pm.Data("scale", np.ones(groups))
        pm.Data("unused", np.ones(rows))
        g = pm.Data("g", rng.integers(groups, size=rows))
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu * scale[g], 1, observed=rng.normal(size=rows))
        pm.Normal("w", mu, 1, observed=rng.normal(size=rows + 1))
    return model


@pytest.mark.timeout(900)
def test_split_is_validated(one):
    model = _two_likelihoods()
    with pytest.raises(TypeError, match="split must be a name or a list of names"):
        synk_pymc.logp_dlogp_function(model, split=3)
    with pytest.raises(TypeError, match="split must be a name or a list of names"):
        synk_pymc.logp_dlogp_function(model, split=["y", 1])
    with pytest.raises(ValueError, match=r"different numbers of rows .'y': 50, 'w': 51.*"
                                         r"each on its own rows.*split=\['y', 'w'\]"):
        synk_pymc.logp_dlogp_function(model)
    with pytest.raises(ValueError, match="'nope', which is not a variable of the model"):
        synk_pymc.logp_dlogp_function(model, split=["y", "nope"])
    with pytest.raises(ValueError, match="'mu', which is neither a pm.Data container"):
        synk_pymc.logp_dlogp_function(model, split="mu")
    with pytest.raises(ValueError, match="'scale' by rows, but it has 4 rows and the observed"):
        synk_pymc.logp_dlogp_function(model, split=["y", "scale"])
    with pytest.raises(ValueError, match="'unused', which no observed variable's likelihood"):
        synk_pymc.logp_dlogp_function(model, split=["y", "unused"])
    for bad in (2.5, "64", True):
        with pytest.raises(TypeError, match="grainsize must be a whole number of rows"):
            synk_pymc.logp_dlogp_function(model, split="y", grainsize=bad)
    with pytest.raises(ValueError, match="grainsize must be at least 1 row; got 0"):
        synk_pymc.logp_dlogp_function(model, split="y", grainsize=0)
    synk.close()
    with pytest.raises(RuntimeError, match="synk.fork.. must be called before"):
        synk_pymc.logp_dlogp_function(model, split="y")
    # sample() checks the grain before it forks a session of its own
    with pytest.raises(ValueError, match="grainsize must be at least 1 row; got -3"):
        synk_pymc.sample(model=model, split="y", grainsize=-3)
    assert not session_open()


@pytest.mark.timeout(900)
def test_split_names_observed_and_containers(two):
    model = _two_likelihoods()
    point = np.array([0.3])
    want = reference(model)(point)
    # 'y' reads the index 'g' by rows: naming 'y' alone leaves 'g' whole, which fails
    with pytest.raises(ValueError, match=r"name every such pm.Data container in split "
                                         r"\(divided now: \['y'\]\)"):
        synk_pymc.logp_dlogp_function(model, split="y")
    for split in (["y", "g"], ["g"], ["w"]):  # 'w' divided, 'y' in the master: also right
        fn = synk_pymc.logp_dlogp_function(model, split=split)
        fn.set_extra_values({})
        got = fn(point)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-9)


@pytest.mark.timeout(900)
def test_container_read_by_rows_but_not_divided_is_refused(two):
    model = hierarchical_model(rows=101)
    with pytest.raises(ValueError, match="name every such pm.Data container in split"):
        synk_pymc.logp_dlogp_function(model, split=["x"])


@pytest.mark.timeout(900)
def test_likelihood_that_mixes_rows_is_refused(two):
    model = rows_mixing_model()
    with pytest.raises(ValueError, match="not a sum over the divided rows"):
        synk_pymc.logp_dlogp_function(model)
    # one process, in slices: each slice would standardise by its own rows' mean
    synk.close()
    synk.fork(1)
    with pytest.raises(ValueError, match=r"on 1 processes \(4 slices each\)"):
        synk_pymc.logp_dlogp_function(model, grainsize=50)
    synk_pymc.logp_dlogp_function(model)  # one block: the whole rows, as PyMC


@pytest.mark.timeout(900)
def test_missing_values_with_a_container_are_divided_and_watched(two):
    # the observed part's rows of the container are copied (mask moved onto the data):
    # the function still equals PyMC's, and pm.set_data on the container is caught
    rng = np.random.default_rng(5)
    x = rng.normal(size=61)
    y = 0.5 * x + rng.normal(size=61)
    y[[3, 10, 11, 40]] = np.nan
    with pm.Model() as model:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", b * xd, 1, observed=np.ma.masked_invalid(y))
    fn = synk_pymc.logp_dlogp_function(model)
    fn.set_extra_values({})
    point = np.linspace(-0.5, 0.5, 5)  # b and the four imputed values
    want = reference(model)(point)
    got = fn(point)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9, atol=1e-12)
    with model:
        pm.set_data({"x": x + 1.0})
    with pytest.raises(RuntimeError, match="'x' changed .pm.set_data."):
        fn(point)


# -- the rewritten model -------------------------------------------------------------------
@pytest.mark.timeout(900)
def test_the_rewrite_gives_back_what_it_took(two):
    # sample is pm.sample on a copy of the model without the divided observed
    # variables: their observed data, the constant data and, when asked, their
    # pointwise log-likelihood come back as pm.sample gives them for the model
    model = hierarchical_model(rows=301)
    options = dict(SAMPLE, draws=50, tune=50, random_seed=3, **PYMC_NUTS,
                   idata_kwargs={"log_likelihood": True})
    got = synk_pymc.sample(divide=True, model=model, **options)
    want = pm.sample(model=model, cores=1, **options)
    for group in ("observed_data", "constant_data"):
        xr.testing.assert_equal(_dataset(got, group), _dataset(want, group))
    ours, pymcs = _dataset(got, "log_likelihood"), _dataset(want, "log_likelihood")
    assert ours["y"].dims == pymcs["y"].dims == ("chain", "draw", "obs")
    # the same draws to rounding, so the same pointwise terms to rounding
    np.testing.assert_allclose(ours["y"].values, pymcs["y"].values, rtol=1e-6, atol=1e-8)


def test_the_rewrite_reads_the_models_own_data(two):
    # The copy reads the user's containers: pm.set_data on one the master evaluates
    # (a prior's scale) reaches the divided function as it reaches PyMC's; observed
    # values in a container are observed data, not constant data, as in pm.sample
    rng = np.random.default_rng(7)
    with pm.Model() as model:
        scale = pm.Data("scale", 2.0)
        y = pm.Data("y", rng.normal(1.0, 1.0, size=200))
        mu = pm.Normal("mu", 0, scale)
        pm.Normal("obs", mu, 1.0, observed=y)
    got = synk_pymc.logp_dlogp_function(model)
    got.set_extra_values({})
    x = np.array([0.3])
    before = got(x)[0]
    with model:
        pm.set_data({"scale": 5.0})
    want = reference(model)
    np.testing.assert_allclose(got(x)[0], want(x)[0], rtol=1e-12)
    assert got(x)[0] != before
    options = dict(SAMPLE, draws=20, tune=20, chains=1, random_seed=2, **PYMC_NUTS)
    idata = synk_pymc.sample(divide=True, model=model, initvals={model["mu"]: 0.5},
                             **options)
    reference_idata = pm.sample(model=model, initvals={"mu": 0.5}, cores=1, **options)
    for group in ("observed_data", "constant_data"):
        xr.testing.assert_equal(_dataset(idata, group), _dataset(reference_idata, group))
    # the start given by the variable is the start given by its name: the same draws
    np.testing.assert_allclose(idata.posterior["mu"].values,
                               reference_idata.posterior["mu"].values, rtol=1e-6)


def _dataset(idata, group):
    found = idata[group]
    return found.to_dataset() if hasattr(found, "to_dataset") else found


def test_a_model_with_initval_is_refused_with_the_way_out(two):
    with pm.Model() as model:
        pm.Normal("mu", 0, 1, initval=0.5)
        pm.Normal("y", model["mu"], 1, observed=np.zeros(40))
    with pytest.raises(ValueError, match=r"initval \('mu'\).*initvals="):
        synk_pymc.logp_dlogp_function(model)


@pytest.mark.timeout(900)
def test_backend_compiles_the_rows_and_the_function(two):
    # backend= on PyMC 5 as on 6 (PyMC 6's own keyword): the rows' function and the
    # returned one in that mode, equal to PyMC's function (JAX: test_pymc_jax_callback)
    model = hierarchical_model(rows=301)
    want = reference(model)
    size = sum(np.size(value) for value in model.initial_point().values())
    point = np.random.default_rng(4).normal(size=size) * 0.3
    backends = ["c"] + (["numba"] if _installed("numba") else [])
    for backend in backends:
        got = synk_pymc.logp_dlogp_function(model, backend=backend)
        got.set_extra_values({})
        linker = type(got._pytensor_function.maker.linker).__name__
        assert linker == {"c": "VMLinker", "numba": "NumbaLinker"}[backend]
        value, grad = got(point)
        np.testing.assert_allclose(value, want(point)[0], rtol=1e-10)
        np.testing.assert_allclose(grad, want(point)[1], rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="not a PyTensor backend"):
        synk_pymc.logp_dlogp_function(model, backend="fortran")


def _installed(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


# -- nutpie ----------------------------------------------------------------------------------
@pytest.mark.timeout(900)
def test_nutpie_posterior_matches_pm_sample(two):
    pytest.importorskip("nutpie", reason="nutpie is not installed here (optional; CI's "
                        "Python 3.12 environment has it)")
    model = logistic_model()
    got = synk_pymc.sample(divide=True, model=model, nuts_sampler="nutpie", random_seed=5,
                           draws=300, tune=300, chains=2, progressbar=False)
    want = pm.sample(model=model, random_seed=6, nuts_sampler="pymc", cores=1, **SAMPLE)
    assert_within_mcse(got, want, [rv.name for rv in model.free_RVs], limit=4.0)
    # pm.sample's keywords with a nutpie equivalent, and the model's coords and dims
    model = hierarchical_model(rows=101)
    idata = synk_pymc.sample(30, divide=True, model=model, nuts_sampler="nutpie", tune=30, chains=1,
                             random_seed=1, progressbar=False, target_accept=0.9,
                             max_treedepth=8, compute_convergence_checks=False,
                             nuts_sampler_kwargs={"store_unconstrained": False})
    assert idata.posterior["a"].dims == ("chain", "draw", "group")
    assert idata.posterior.sizes["draw"] == 30


@pytest.mark.timeout(900)
def test_nutpie_route_draws_as_pm_samples_nutpie_route():
    # nutpie seeded as pm.sample seeds it, from the same jittered start: at one process
    # (PyMC's own function, which nutpie compiles separately for pm.sample) the draws
    # agree to rounding (PyMC 5's C function against nutpie's Numba one: 3e-6 apart
    # after 25 steps), and the InferenceData has pm.sample's groups and attributes
    pytest.importorskip("nutpie", reason="nutpie is not installed here (optional; CI's "
                        "Python 3.12 environment has it)")
    model = hierarchical_model(rows=101)
    options = dict(draws=5, tune=20, chains=2, random_seed=8, progressbar=False,
                   nuts_sampler="nutpie", model=model)
    got = synk_pymc.sample(divide=True, processes_per_chain=1, **options)
    want = pm.sample(**options)
    for name in ("a", "b", "sigma"):
        a, b = got.posterior[name].values, want.posterior[name].values
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * b.std(), err_msg=name)
    for group in ("observed_data", "constant_data"):
        assert group in got and group in want
    for key in ("inference_library", "tuning_steps"):
        assert got.posterior.attrs[key] == want.posterior.attrs[key]
    assert got.posterior.attrs["sampling_time"] > 0


# -- the demo --------------------------------------------------------------------------------
@pytest.mark.timeout(900)
def test_pymc_sampling_demo():
    result = subprocess.run(
        [sys.executable, str(DEMO), "--rows", "3001", "--features", "3", "--draws", "200",
         "--tune", "200", "--n-parallel", "2"],
        capture_output=True, text=True, timeout=850,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("pymc_sampling passed on 2 processes")
