"""synkhronos.pymc as a drop-in for PyMC: the same arguments, errors that name the
function called, and the same draws, checked against the installed PyMC (5.28 or 6).

- every parameter of ``pm.find_MAP``, ``pm.compute_log_likelihood`` and ``pm.sample``
  (read with ``inspect.signature``) is taken by ours, by name and, where PyMC takes it
  by position, at the same position: called with it, ours gets past its argument
  checks (to the error that comes next: no session, or ``pm.Minibatch`` data for
  ``sample``); those it cannot honour raise a TypeError naming them and the function;
- without a session the error names the function called; a model whose likelihood is
  a Potential is refused with how to name it in ``split``, and divided when named;
- ``find_MAP`` with PyMC's keywords (``progressbar``, ``vars``, ``method``,
  ``return_raw``) and ``compute_log_likelihood`` with its own equal PyMC's;
- ``sample`` at one process a chain gives ``pm.sample``'s draws bit for bit, chains
  at once (``cores=2``) and one after another;
- with the chains one after another, one interrupt stops them all (PyMC's own
  sequential sampler runs every later chain to its end), divided and not.

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos.pymc as synk_pymc  # noqa: E402
from synkhronos.testing import session_open  # noqa: E402
from tests.pymc_common import QUIET, regression  # noqa: E402

# What ours cannot honour, with the value that asks for it.
REFUSED = {
    "find_MAP": {"use_hess": True, "use_hessp": True, "compute_hessian": True,
                 "return_inferencedata": True},
    "compute_log_likelihood": {},
    "sample": {"step": object()},
}


def potential_model(rows=120, seed=2):
    """A likelihood written as a Potential over a pm.Data container."""
    x = np.random.default_rng(seed).normal(1.0, 1.0, size=rows)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        mu = pm.Normal("mu", 0, 5)
        pm.Potential("lik", pm.logp(pm.Normal.dist(mu, 1.0), xd).sum())
    return model


def minibatched_model():
    """sample refuses it (ValueError) right after checking its arguments."""
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=pm.Minibatch(np.arange(100.0), batch_size=10),
                  total_size=100)
    return model


def _value(name, parameter, model):
    if name == "model":
        return model
    if name in ("draws", "idata"):
        return 10 if name == "draws" else None
    return None if parameter.default is inspect.Parameter.empty else parameter.default


CASES = [("find_MAP", regression, RuntimeError, r"synk.fork\(\) must be called before "
          r"synkhronos.pymc.find_MAP\(\)"),
         ("compute_log_likelihood", regression, RuntimeError, r"synk.fork\(\) must be called "
          r"before synkhronos.pymc.compute_log_likelihood\(\)"),
         ("sample", minibatched_model, ValueError, "reads pm.Minibatch data")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, build, after, message", CASES, ids=[c[0] for c in CASES])
def test_every_pymc_parameter_is_taken(name, build, after, message):
    assert not session_open()
    ours, theirs = getattr(synk_pymc, name), getattr(pm, name)
    model = build()
    signature = inspect.signature(theirs).parameters
    mine = inspect.signature(ours).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in mine.values())
    # every name PyMC takes is one of ours, or ours takes any name (and binds it by PyMC's
    # signature: checked by the calls below)
    for parameter in signature.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        assert parameter.name in mine or takes_any, (name, parameter.name)
    # PyMC's positional parameters, where ours has them by name, are at the same place
    positional = [p for p in signature.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    ours_positional = [p for p in mine.values()
                       if p.kind in (p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    for i, parameter in enumerate(positional):
        if (i < len(ours_positional)
                and ours_positional[i].kind is not inspect.Parameter.VAR_POSITIONAL):
            assert ours_positional[i].name == parameter.name, (name, i)
        else:
            assert any(p.kind is p.VAR_POSITIONAL for p in ours_positional[:i + 1]), (name, i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for parameter_name, parameter in signature.items():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            args = (None,) if name == "compute_log_likelihood" else ()
            given = {} if parameter_name == "model" else {"model": model}
            if parameter_name == "idata":
                continue  # (given positionally above)
            if parameter_name in REFUSED[name]:
                with pytest.raises(TypeError, match=rf"{name}\(\).*{parameter_name}"):
                    ours(*args, **given, **{parameter_name: REFUSED[name][parameter_name]})
                continue
            with pytest.raises(after, match=message):
                ours(*args, **given, **{parameter_name: _value(parameter_name, parameter,
                                                               model)})
        # by position, as PyMC takes them (its defaults)
        with pytest.raises(after, match=message):
            ours(*[_value(p.name, p, model) for p in positional],
                 **({} if any(p.name == "model" for p in positional) else {"model": model}))
    # a name PyMC does not take, where PyMC takes no others
    if not any(p.kind is p.VAR_KEYWORD for p in signature.values()):
        with pytest.raises(TypeError, match=rf"synkhronos.pymc.{name}\(\) got an "
                                            "unexpected keyword argument 'bogus'"):
            ours(None, model=model, bogus=1)
    assert not session_open()


@pytest.mark.timeout(300)
def test_refusals_name_the_keyword_and_the_function():
    model = regression(rows=120, seed=1)
    for keyword in ("use_hess", "compute_hessian"):
        if keyword in inspect.signature(pm.find_MAP).parameters:
            with pytest.raises(TypeError, match=rf"synkhronos.pymc.find_MAP\(\) cannot "
                                                rf"honour {keyword}=True"):
                synk_pymc.find_MAP(model=model, **{keyword: True})
    # a model where PyMC takes another argument (PyMC 6 takes one positional argument)
    with pytest.raises(TypeError, match="positional arguments(; pass the model as model=)?"):
        synk_pymc.find_MAP(None, model)
    with pytest.raises(TypeError, match="samples with pm.sample's NUTS"):
        synk_pymc.sample(10, model=model, step=object())
    assert not session_open()


def _close(got: dict, want: dict, rtol=1e-6):
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=1e-8, err_msg=key)


@pytest.mark.timeout(600)
def test_find_map_and_log_likelihood_honour_pymc_keywords(two):
    model = regression(rows=120, seed=1)
    b = model["b"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (PyMC 6's announced changes)
        for options in (dict(progressbar=False), dict(progressbar=False, vars=[b]),
                        dict(progressbar=False, method="Powell")):
            _close(synk_pymc.find_MAP(model=model, **options),
                   pm.find_MAP(model=model, **options))
        # the model first, as synkhronos's own signature has it (SPEC 9)
        _close(synk_pymc.find_MAP(model, progressbar=False),
               pm.find_MAP(model=model, progressbar=False))
        got, raw = synk_pymc.find_MAP(model=model, progressbar=False, return_raw=True)
        want, _ = pm.find_MAP(model=model, progressbar=False, return_raw=True)
    _close(got, want)
    np.testing.assert_allclose(raw.x, np.concatenate([want["b"], [want["sigma_log__"]]]),
                               rtol=1e-6)
    idata = pm.sample(model=model, draws=10, tune=10, chains=1, random_seed=1,
                      nuts_sampler="pymc", **QUIET)
    options = dict(progressbar=False, extend_inferencedata=False, sample_dims=("chain", "draw"),
                   compile_kwargs={})
    got = synk_pymc.compute_log_likelihood(idata, model=model, **options)
    want = pm.compute_log_likelihood(idata, model=model, **options)
    np.testing.assert_allclose(got["y"].values, want["y"].values, rtol=1e-9)
    with pytest.raises(TypeError, match=r"synkhronos.pymc.compute_log_likelihood\(\) got an "
                                        "unexpected keyword argument 'bogus'"):
        synk_pymc.compute_log_likelihood(idata, model=model, bogus=1)


@pytest.mark.timeout(600)
def test_a_potential_likelihood_is_divided_when_named(two):
    model = potential_model()
    with pytest.raises(ValueError, match=r"potentials \['lik'\].*split=\['lik', 'x'\]"):
        synk_pymc.find_MAP(model=model, progressbar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        _close(synk_pymc.find_MAP(model=model, split=["lik", "x"], progressbar=False),
               pm.find_MAP(model=model, progressbar=False))


@pytest.mark.timeout(600)
def test_one_process_a_chain_draws_as_pm_sample_bit_for_bit():
    # at one process a chain nothing is divided: PyMC's own function, whose sums (and so
    # draws) are pm.sample's exactly, chains at once or one after another
    model = regression(rows=120, seed=1)
    options = dict(draws=25, tune=25, chains=2, random_seed=7, **QUIET)
    for cores in (2, 1):
        got = synk_pymc.sample(divide=True, model=model, cores=cores, processes_per_chain=1,
                               nuts_sampler="pymc", **options)
        want = pm.sample(model=model, cores=cores, nuts_sampler="pymc", **options)
        for name in ("b", "sigma"):
            np.testing.assert_array_equal(got.posterior[name].values,
                                          want.posterior[name].values, err_msg=(cores, name))
        np.testing.assert_array_equal(got.sample_stats["tree_depth"].values,
                                      want.sample_stats["tree_depth"].values)
    assert not session_open()


class _InterruptAt:
    """pm.sample's callback: a KeyboardInterrupt (as Ctrl-C) at ``draw_idx`` of chain 0,
    and every chain it saw a draw of."""

    def __init__(self, draw_idx: int):
        self.draw_idx = draw_idx
        self.chains: set[int] = set()

    def __call__(self, trace, draw):
        self.chains.add(draw.chain)
        if draw.chain == 0 and draw.draw_idx == self.draw_idx:
            raise KeyboardInterrupt


@pytest.mark.timeout(600)
@pytest.mark.parametrize("divide", [None, True], ids=["pm_sample_route", "divided"])
def test_one_interrupt_stops_chains_run_one_after_another(divide):
    # PyMC's sequential sampler ends the chain an interrupt reaches and runs the next
    # ones to their end; sample() stops them all, and the draws so far come back
    model = regression(rows=120, seed=1)
    options = dict(draws=30, tune=10, chains=3, cores=1, random_seed=7,
                   nuts_sampler="pymc", **QUIET)
    interrupt = _InterruptAt(10 + 5)  # the sixth draw after tuning
    got = synk_pymc.sample(divide=divide, model=model, callback=interrupt,
                           processes_per_chain=2 if divide else None, **options)
    assert not session_open()
    assert interrupt.chains == {0}  # chains 1 and 2 ended at their first draw
    assert got.posterior.sizes["chain"] == 1 and got.posterior.sizes["draw"] == 6
    # pm.sample itself: the later chains ran to their end (and it kept those two)
    pymcs = _InterruptAt(10 + 5)
    pm.sample(model=model, callback=pymcs, **options)
    assert pymcs.chains == {0, 1, 2}
    if divide is None:  # PyMC's own function: the draws of pm.sample's chain 0
        want = pm.sample(model=model, **options)
        np.testing.assert_array_equal(got.posterior["b"].values[0],
                                      want.posterior["b"].values[0][:6])
