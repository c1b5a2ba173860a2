"""Sampling: PyMC's NUTS or nutpie driving the divided log-density from the master.

``sample`` runs PyMC's ``pm.init_nuts`` (jitter, mass matrix) and ``pm.sample`` with a
NUTS step over :func:`~synkhronos.pymc.logp_dlogp_function`'s function: the chains run
one after another in the master, with the seeds ``pm.sample`` would use, so the draws
equal ``pm.sample``'s up to rounding. ``nuts_sampler="nutpie"`` hands the same function
to nutpie through its ``from_pyfunc`` hook.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np

from .. import close, fork
from . import _pymc_compat as compat
from ._likelihood import _build, _check_grainsize, _session_size

__all__ = ["sample"]


def sample(model=None, *, split=None, grainsize=None, **pm_sample_kwargs):
    """``pm.sample`` with the observed log-likelihood evaluated on every process.

    The rows of the observed data are divided among the session's processes and the
    log-likelihood and its gradient summed; the prior is evaluated in the master. PyMC
    initialises NUTS as usual (``pm.init_nuts``: jitter, mass-matrix adaptation) and
    runs the chains one after another in the master. With the same ``random_seed`` the
    draws equal ``pm.sample(nuts_sampler="pymc")``'s, up to floating-point rounding.

    Parameters
    ----------
    model : pymc.Model, optional
        The model (default: the one of the current ``with`` context). It is not changed.
    split : str or list of str, optional
        Names of the ``pm.Data`` containers and observed variables divided by rows; see
        :func:`logp_dlogp_function`.
    grainsize : int, optional
        Rows a process evaluates at a time; see :func:`logp_dlogp_function`.
    **pm_sample_kwargs
        Passed to ``pm.sample`` (``draws``, ``tune``, ``chains``, ``random_seed``,
        ``target_accept``, ``init``, ``initvals``, ``progressbar``, ...). ``cores`` only
        sets the default number of chains, as in PyMC: the chains run in the master,
        whose processes already use the cores. ``nuts_sampler="nutpie"`` samples with
        nutpie (if installed) over the same function. ``step`` is not accepted: build
        your own steps over :func:`logp_dlogp_function`.

    Returns
    -------
    arviz.InferenceData or MultiTrace
        What ``pm.sample`` returns.

    Raises
    ------
    TypeError
        ``step`` was passed, or ``split`` is not a name or list of names.
    ValueError
        See :func:`logp_dlogp_function`; or ``nuts_sampler`` is not "pymc" or "nutpie".

    Notes
    -----
    Without a session it forks one (``synk.fork()``, a process per core) and closes it
    when sampling ends; with a session, it uses that one.
    """
    pm = compat.import_pymc()
    model = pm.modelcontext(model)
    kwargs = dict(pm_sample_kwargs)
    if "step" in kwargs:
        raise TypeError("synkhronos.pymc.sample() builds its own NUTS step; for other steps "
                        "pass synkhronos.pymc.logp_dlogp_function() to them and call pm.sample")
    sampler = kwargs.pop("nuts_sampler", None) or "pymc"
    if sampler not in ("pymc", "nutpie"):
        raise ValueError(f"nuts_sampler must be 'pymc' or 'nutpie' with synkhronos.pymc; "
                         f"got {sampler!r}")
    cores = kwargs.pop("cores", None)
    grainsize = _check_grainsize(grainsize)  # before a session is forked for nothing
    own_session = _session_size() is None
    if own_session:
        fork()
    try:
        vgf, op = _build(pm, model, split, grainsize)
        try:
            if sampler == "nutpie":
                return _sample_nutpie(pm, model, vgf, cores, kwargs)
            return _sample_nuts(pm, model, vgf, cores, kwargs)
        finally:
            op.release()
    finally:
        if own_session:
            close()


def _chains_and_seeds(random_seed, chains: int | None, cores: int | None):
    """The number of chains and the per-chain seeds that ``pm.sample`` would use.

    PyMC internals, reproduced (``pm.sample`` does this inline): its default chain count
    follows its ``cores`` default, and ``init_nuts`` jitters each chain with a seed drawn
    this way from ``random_seed``. Drawing the same seeds makes the starting points, and
    so the draws, equal to ``pm.sample``'s.
    """
    if chains is None:
        chains = compat.default_chains(cores)
    seed = copy.deepcopy(random_seed) if isinstance(
        random_seed, np.random.Generator | np.random.BitGenerator) else random_seed
    return chains, [int(rng.integers(2**30)) for rng in np.random.default_rng(seed).spawn(chains)]


def _sample_nuts(pm, model, vgf, cores, kwargs):
    """PyMC's init_nuts and pm.sample, with a NUTS step over ``vgf``, chains in the master."""
    params = compat.sample_parameters()
    # pm.sample hands its unnamed keywords (and the "nuts" dict) to the NUTS step.
    step_kwargs = {name: kwargs.pop(name) for name in list(kwargs) if name not in params}
    for name, value in (step_kwargs.pop("nuts", None) or {}).items():
        step_kwargs.setdefault(name, value)
    if cores is not None and cores > 1:
        warnings.warn(f"cores={cores}: the chains run one after another in the master, whose "
                      "processes already use the cores for the likelihood", stacklevel=3)

    def default(name):
        return kwargs.pop(name, params[name].default)

    random_seed = kwargs.pop("random_seed", None)
    if random_seed is None:  # one seed for init_nuts and pm.sample alike
        random_seed = int(np.random.default_rng().integers(2**30))
    chains, seeds = _chains_and_seeds(random_seed, kwargs.pop("chains", None), cores)
    quiet = kwargs.get("quiet", False)
    initial_points, initialised = pm.init_nuts(
        init=default("init"), chains=chains, n_init=default("n_init"), model=model,
        random_seed=seeds, progressbar=bool(kwargs.get("progressbar", True)) and not quiet,
        quiet=quiet, jitter_max_retries=default("jitter_max_retries"),
        tune=kwargs.get("tune", params["tune"].default), initvals=kwargs.pop("initvals", None),
        compile_kwargs=kwargs.get("compile_kwargs"), **step_kwargs,
    )
    # The same step init_nuts made (its adapted potential, seed and options), over vgf.
    step = pm.NUTS(potential=initialised.potential, model=model, rng=seeds[0],
                   initial_point=initial_points[0], logp_dlogp_func=vgf, **step_kwargs)
    return pm.sample(model=model, step=step, initvals=initial_points, chains=chains, cores=1,
                     random_seed=random_seed, **kwargs)


def _sample_nutpie(pm, model, vgf, cores, kwargs):
    """nutpie's sampler over ``vgf``, through its public ``from_pyfunc`` hook.

    nutpie calls the log-density from its own (Rust) threads; the session serializes
    the calls. Its chains run one at a time (``cores=1``): the processes already use
    the cores.
    """
    nutpie, from_pyfunc = compat.nutpie_from_pyfunc()

    options = dict(kwargs.pop("nuts", None) or {})
    for name in ("target_accept", "max_treedepth"):
        if name in kwargs:
            options[name] = kwargs.pop(name)
    if "max_treedepth" in options:
        options["maxdepth"] = options.pop("max_treedepth")
    draws = kwargs.pop("draws", 1000)
    tune = kwargs.pop("tune", 1000)
    chains = kwargs.pop("chains", None)
    random_seed = kwargs.pop("random_seed", None)
    progress = bool(kwargs.pop("progressbar", True)) and not kwargs.pop("quiet", False)
    save_warmup = not kwargs.pop("discard_tuned_samples", True)
    initvals = kwargs.pop("initvals", None)
    if kwargs:
        raise TypeError(f"unexpected keyword arguments for nuts_sampler='nutpie': "
                        f"{', '.join(sorted(kwargs))}")
    if chains is None:
        chains, _ = _chains_and_seeds(0, None, cores)
    seed = int(np.random.default_rng(random_seed).integers(2**30))

    values = model.continuous_value_vars
    point = model.initial_point()
    shapes = [np.shape(point[v.name]) for v in values]
    sizes = [int(np.prod(shape, dtype=int)) for shape in shapes]
    n_dim = sum(sizes)
    traced = [*model.free_RVs, *model.deterministics]
    expand_fn = model.compile_fn(model.replace_rvs_by_values(traced), inputs=values,
                                 on_unused_input="ignore", point_fn=False)
    vgf.set_extra_values({})

    def unravel(x):
        pieces, begin = [], 0
        for v, shape, size in zip(values, shapes, sizes, strict=True):
            pieces.append(np.asarray(x[begin:begin + size], dtype=v.dtype).reshape(shape))
            begin += size
        return pieces

    expanded = [np.asarray(out) for out in expand_fn(*unravel(np.zeros(n_dim)))]

    def make_logp_fn():
        def logp(x, **_):
            value, grad = vgf(x)
            return float(value), np.array(grad, dtype="float64", order="C")  # a copy
        return logp

    def make_expand_fn(seed1, seed2, chain):
        def expand(x, **_):
            outs = expand_fn(*unravel(x))
            return {var.name: np.asarray(out, dtype="float64", order="C")
                    for var, out in zip(traced, outs, strict=True)}
        return expand

    start = compat.initial_point_fn(model, initvals)

    def initial_point(seed):
        values_at = start(seed)
        return np.concatenate([np.ravel(values_at[v.name]) for v in values]).astype("float64")

    compiled = from_pyfunc(
        n_dim, make_logp_fn, make_expand_fn, [np.dtype("float64")] * len(traced),
        [out.shape for out in expanded], [var.name for var in traced],
        make_initial_point_fn=initial_point,
    )
    return nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=1, seed=seed,
                         save_warmup=save_warmup, progress_bar=progress, **options)
