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


def sample(draws=1000, *, model=None, split=None, grainsize=None, processes_per_chain=None,
           **kwargs):
    """``pm.sample`` with the observed log-likelihood evaluated on every process.

    The rows of the observed data are divided among the session's processes and the
    log-likelihood and its gradient summed; the prior is evaluated in the master. PyMC
    initialises NUTS as usual (``pm.init_nuts``: jitter, mass-matrix adaptation) and
    runs the chains one after another in the master. With the same ``random_seed`` the
    draws equal ``pm.sample(nuts_sampler="pymc")``'s, up to floating-point rounding.

    Parameters
    ----------
    draws : int, default 1000
        Draws a chain keeps, as in ``pm.sample`` (it may be passed positionally).
    model : pymc.Model, optional
        The model (default: the one of the current ``with`` context). It is not changed.
    split : str or list of str, optional
        Names of the ``pm.Data`` containers, observed variables and potentials divided
        by rows; see :func:`logp_dlogp_function`.
    grainsize : int, optional
        Rows a process evaluates at a time; see :func:`logp_dlogp_function`.
    processes_per_chain : int, optional
        The processes that evaluate each chain's log-likelihood: the size of the session
        ``sample`` forks when none is open (default: a process per core). With a session
        already forked it must be None or that session's size. The chains run one after
        another (running chains in parallel groups is not implemented).
    **kwargs
        Every keyword of ``pm.sample`` (``tune``, ``chains``, ``random_seed``,
        ``target_accept``, ``init``, ``initvals``, ``idata_kwargs``, ``var_names``, ...),
        except ``step``. ``cores`` only sets the default number of chains, as in PyMC:
        the chains run in the master, whose processes already use the cores.
        ``nuts_sampler="nutpie"`` samples with nutpie over the same function: then only
        the keywords nutpie has an equivalent for are accepted (``draws``, ``tune``,
        ``chains``, ``cores``, ``random_seed``, ``initvals`` (one dict),
        ``progressbar``, ``quiet``, ``discard_tuned_samples``, ``target_accept``,
        ``max_treedepth``, ``nuts``, ``nuts_sampler_kwargs``, ``var_names``,
        ``compute_convergence_checks``, ``idata_kwargs``, ``return_inferencedata``).

    Returns
    -------
    arviz.InferenceData or MultiTrace
        What ``pm.sample`` returns (nutpie: what ``nutpie.sample`` returns), with the
        model's coords and dims.

    Raises
    ------
    TypeError
        ``step`` was passed; a model was passed positionally (pass ``model=``); on the
        nutpie route, keywords nutpie has no equivalent for; ``split`` is not a name or
        list of names. All before any process is forked.
    ValueError
        See :func:`logp_dlogp_function`; ``nuts_sampler`` is not "pymc" or "nutpie";
        the model reads ``pm.Minibatch`` data; ``processes_per_chain`` is below 1 or
        differs from the open session's size.

    Notes
    -----
    Without a session it forks one (``synk.fork(processes_per_chain)``) and closes it
    when sampling ends; with a session, it uses that one.
    """
    pm = compat.import_pymc()
    if isinstance(draws, pm.Model):
        raise TypeError("synkhronos.pymc.sample() takes draws as its first argument, as "
                        "pm.sample does; pass the model as model=...")
    if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or draws < 0:
        raise TypeError(f"draws must be a whole number of draws; got {draws!r}")
    model = pm.modelcontext(model)
    kwargs = dict(kwargs, draws=int(draws))
    if "step" in kwargs:
        raise TypeError("synkhronos.pymc.sample() builds its own NUTS step; for other steps "
                        "pass synkhronos.pymc.logp_dlogp_function() to them and call pm.sample")
    sampler = kwargs.pop("nuts_sampler", None) or "pymc"
    if sampler not in ("pymc", "nutpie"):
        raise ValueError(f"nuts_sampler must be 'pymc' or 'nutpie' with synkhronos.pymc; "
                         f"got {sampler!r}")
    if sampler == "nutpie":
        unknown = sorted(set(kwargs) - _NUTPIE_KEYWORDS)
        if unknown:
            raise TypeError(f"nuts_sampler='nutpie' has no equivalent for "
                            f"{', '.join(unknown)}; use nuts_sampler='pymc' for them")
        if not isinstance(kwargs.get("initvals") or {}, dict):
            raise TypeError("nuts_sampler='nutpie' takes one dict of initvals for every "
                            "chain, not one a chain; use nuts_sampler='pymc' for those")
    minibatch = compat.minibatch_variables(model)
    if minibatch:
        raise ValueError(f"observed variable {minibatch[0]!r} reads pm.Minibatch data: "
                         "sampling needs every row, which synkhronos.pymc divides among "
                         "the processes; sample the full data (pm.Data), or fit "
                         "minibatches with ADVI (pm.fit)")
    cores = kwargs.pop("cores", None)
    grainsize = _check_grainsize(grainsize)  # before a session is forked for nothing
    size = _session_size()
    processes = _check_processes(processes_per_chain, size)
    own_session = size is None
    if own_session:
        fork(processes)
    try:
        vgf, op = _build(pm, model, split, grainsize)
        try:
            if sampler == "nutpie":
                return _sample_nutpie(pm, model, vgf, cores, kwargs)
            return _sample_nuts(pm, model, vgf, cores, kwargs)
        finally:
            if op is not None:
                op.release()
    finally:
        if own_session:
            close()


# The pm.sample keywords with an equivalent on the nutpie route.
_NUTPIE_KEYWORDS = {
    "draws", "tune", "chains", "cores", "random_seed", "initvals", "progressbar", "quiet",
    "discard_tuned_samples", "target_accept", "max_treedepth", "nuts", "nuts_sampler_kwargs",
    "var_names", "compute_convergence_checks", "idata_kwargs", "return_inferencedata",
}


def _check_processes(processes_per_chain, size: int | None) -> int | None:
    """``processes_per_chain`` checked: a whole number >= 1, the open session's size."""
    if processes_per_chain is None:
        return None
    if isinstance(processes_per_chain, bool) or not isinstance(processes_per_chain,
                                                               int | np.integer):
        raise TypeError(f"processes_per_chain must be a whole number of processes or None; "
                        f"got {processes_per_chain!r}")
    if processes_per_chain < 1:
        raise ValueError(f"processes_per_chain must be at least 1; got {processes_per_chain}")
    if size is not None and processes_per_chain != size:
        raise ValueError(f"processes_per_chain={processes_per_chain}, but the open session "
                         f"has {size} processes; close it or pass processes_per_chain=None")
    return int(processes_per_chain)


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
    options.update(kwargs.pop("nuts_sampler_kwargs", None) or {})
    var_names = kwargs.pop("var_names", None)
    idata_kwargs = dict(kwargs.pop("idata_kwargs", None) or {})
    idata_kwargs.pop("include_transformed", None)  # (nutpie: never stored)
    if idata_kwargs:
        warnings.warn(f"idata_kwargs keys {sorted(idata_kwargs)} are ignored by the nutpie "
                      "sampler, as in pm.sample", UserWarning, stacklevel=4)
    # nutpie computes no convergence checks; pm.sample's nutpie route returns
    # InferenceData always: both keywords are accepted as it accepts them.
    kwargs.pop("compute_convergence_checks", None)
    kwargs.pop("return_inferencedata", None)
    if chains is None:
        chains, _ = _chains_and_seeds(0, None, cores)
    seed = int(np.random.default_rng(random_seed).integers(2**30))

    values = model.continuous_value_vars
    point = model.initial_point()
    shapes = [np.shape(point[v.name]) for v in values]
    sizes = [int(np.prod(shape, dtype=int)) for shape in shapes]
    n_dim = sum(sizes)
    traced = [*model.free_RVs, *model.deterministics]
    if var_names is not None:
        traced = [var for var in traced if var.name in set(var_names)]
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
        coords=compat.nutpie_coords(model),
        dims={var.name: tuple(model.named_vars_to_dims[var.name]) for var in traced
              if var.name in model.named_vars_to_dims},
    )
    return nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=1, seed=seed,
                         save_warmup=save_warmup, progress_bar=progress, **options)
