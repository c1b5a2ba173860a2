"""Sampling: PyMC's NUTS, nutpie, numpyro or blackjax driving the divided log-density.

Which one: ``nuts_sampler``, or where it is not given the one ``pm.sample`` would pick
(``compat.default_nuts_sampler``: PyMC 6 takes nutpie where it is installed).

``sample`` runs PyMC's ``pm.init_nuts`` (jitter, mass matrix) and ``pm.sample`` with a
NUTS step over :func:`~synkhronos.pymc.logp_dlogp_function`'s function, with the seeds
``pm.sample`` would use, so the draws equal ``pm.sample``'s up to rounding. Where the
chains run:

- several at once (``cores`` > 1, no session open): PyMC's own parallel sampler forks
  one process per chain from this one, before any session exists; the step's
  likelihood is built here without one and, at a chain process's first evaluation,
  that process forks its own session of ``processes_per_chain`` processes and compiles
  its rows' function. Each chain process is a program of its own for synkhronos (its
  prefix, lock and watcher), so the one-session-per-program rule holds in each; PyMC's
  master collects the draws, shows one progress display and builds one InferenceData;
  a chain process closes its session as it ends (normally, on PyMC's abort after
  Ctrl-C, or on its SIGTERM);
- one at a time, in this process (one running chain, a session already open, or
  nutpie): the session (the user's, or one ``sample`` forks and closes) evaluates
  every chain's likelihood. ``nuts_sampler="nutpie"`` hands the function to nutpie
  through its ``from_pyfunc`` hook; "numpyro" and "blackjax" run ``pm.sample`` with
  the function as their JAX log-density (``_jax_samplers``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import multiprocessing.util
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import close, fork, n_parallel
from . import _choice
from . import _pymc_compat as compat
from ._jax_samplers import sample_jax
from ._likelihood import (
    build_logp_dlogp,
    check_exact,
    check_grainsize,
    discrete_names,
    session_size,
    sliced,
)

__all__ = ["sample"]

log = logging.getLogger("synkhronos")


def sample(draws=1000, *, model=None, split=None, grainsize=None, processes_per_chain=None,
           divide=None, exact=False, **kwargs):
    """``pm.sample`` with the observed log-likelihood evaluated on every process.

    The rows of the observed data are divided among a session's processes and the
    log-likelihood and its gradient summed; the prior is evaluated in the process that
    runs the chain. PyMC initialises NUTS as usual (``pm.init_nuts``: jitter,
    mass-matrix adaptation) and samples with its own sampler. With the same
    ``random_seed`` the draws equal ``pm.sample(nuts_sampler="pymc")``'s, up to
    floating-point rounding where the rows are divided, bit for bit at one process a
    chain in one block of rows (nothing divided: PyMC's own function, and a chain's
    process forks no session).

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
        The processes that evaluate one running chain's log-likelihood (its session's
        size). Default, without a session: the usable cores divided among the chains
        running at once (at least one each). With a session already forked it must be None or
        that session's size.
    divide : bool, optional
        Whether the likelihood is divided at all. None (default): chosen by
        measurement (``synkhronos.pymc._choice``): PyMC's own function is timed at the
        initial point before anything is forked, and a session is forked only where
        dividing is predicted to save more than building it costs over the run; once
        built, the divided function is timed against PyMC's and kept only if faster.
        Where it is not kept, this is ``pm.sample`` itself (same draws, same speed);
        on the nutpie route, nutpie's NUTS over PyMC's function measured there, where
        that is predicted faster than nutpie compiling its own (the same draws, to
        rounding; its chains one after another).
        True: always divided (the earlier behaviour); False: ``pm.sample`` itself.
        A model with discrete free variables is sampled by ``pm.sample`` itself
        (PyMC's compound step, nothing divided) unless ``divide=True``, which refuses
        it.
        The choice and its figures are logged (logger ``"synkhronos"``, INFO).
    exact : bool, default False
        Sums that do not depend on the number of processes (see
        :func:`logp_dlogp_function`): with the same ``random_seed`` the draws are then
        the same bit for bit at every ``processes_per_chain`` (and from one run to the
        next), though not ``pm.sample``'s. Always divided (``divide=False`` is refused).
    **kwargs
        Every keyword of ``pm.sample`` (``tune``, ``chains``, ``cores``,
        ``random_seed``, ``target_accept``, ``init``, ``initvals``, ``idata_kwargs``,
        ``var_names``, ``callback``, ``trace``, ...), except ``step``. ``cores`` keeps
        PyMC's meaning, the chains running at once, each in its own process with its
        own session of ``processes_per_chain`` processes. Its default is PyMC's (half
        the logical CPUs, at most 4, at most the usable cores; with
        ``processes_per_chain`` given, no more than fit in the usable cores), and so is
        the default of ``chains``. With a session already forked the chains run one
        after another in this process. ``nuts_sampler=None`` (the default) picks
        the sampler ``pm.sample`` would (PyMC 6: nutpie where it is installed and
        the other keywords allow it; PyMC 5: its own NUTS), and keeps PyMC's NUTS
        where a keyword has no equivalent on the nutpie route; PyMC 6's ``backend``
        and ``compile_kwargs`` give the mode of the likelihood's functions too.
        ``nuts_sampler="nutpie"`` samples with nutpie over the same function, its
        chains one after another in this process: then only the keywords nutpie has
        an equivalent for are accepted (``draws``, ``tune``, ``chains``, ``cores``,
        ``random_seed``, ``initvals`` (one dict), ``progressbar``, ``quiet``,
        ``discard_tuned_samples``, ``target_accept``, ``max_treedepth``, ``nuts``,
        ``nuts_sampler_kwargs``, ``var_names``, ``compute_convergence_checks``,
        ``idata_kwargs``, ``return_inferencedata``, ``backend``, ``compile_kwargs``).
        ``nuts_sampler="numpyro"`` or ``"blackjax"`` is ``pm.sample`` with that
        sampler, its log-density the divided function (a JAX callback) with
        ``divide=True`` or ``exact=True``, otherwise PyMC's own JAX function (not
        divided: not chosen by measurement, see the docs' "numpyro and blackjax").

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
        list of names; ``cores`` or ``processes_per_chain`` is not a whole number. All
        before any process is forked.
    ValueError
        See :func:`logp_dlogp_function` (raised from the chain's process where chains
        run at once); ``nuts_sampler`` is not one of pm.sample's ("pymc", "nutpie",
        "numpyro", "blackjax"); the model reads
        ``pm.Minibatch`` data; ``cores`` or ``processes_per_chain`` is below 1;
        ``processes_per_chain`` differs from the open session's size; ``mp_ctx`` is
        not ``"fork"`` while chains run at once.
    ImportError
        ``nuts_sampler`` names a sampler (or JAX) that is not installed, before any
        process is forked.

    Notes
    -----
    Without a session and with one running chain it forks one
    (``synk.fork(processes_per_chain)``, unpinned: a process whose core another program
    takes moves, and the rows follow the processes' measured speed) and closes it when
    sampling ends; with
    several, each chain's process forks and closes its own. With a session, it uses
    that one. Ctrl-C behaves as in ``pm.sample`` (the draws so far come back), but
    stops every chain: with the chains one after another, PyMC's own sampler would go
    on with the next chain to its end. Every chain process and its session end with it.
    """
    pm = compat.import_pymc()
    if isinstance(draws, pm.Model):
        raise TypeError("synkhronos.pymc.sample() takes draws as its first argument, as "
                        "pm.sample does; pass the model as model=...")
    if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or draws < 0:
        raise TypeError(f"draws must be a whole number of draws; got {draws!r}")
    model = pm.modelcontext(model)
    kwargs = dict(kwargs, draws=int(draws))
    asked = dict(kwargs)  # for pm.sample itself, with the sampler resolved below
    divide = _check_divide(divide)
    exact = check_exact(exact)
    if exact:
        if divide is False:
            raise ValueError("exact=True sums the divided rows in fixed chunks; it cannot "
                             "be had with divide=False (PyMC's own function)")
        divide = True
    if "step" in kwargs:
        raise TypeError("synkhronos.pymc.sample() builds its own NUTS step; for another "
                        "step, fork a session (synk.fork()), build the step over "
                        "synkhronos.pymc.logp_dlogp_function(model) (e.g. pm.NUTS("
                        "logp_dlogp_func=...)) and call pm.sample(step=..., cores=1)")
    sampler = kwargs.pop("nuts_sampler", None)
    if sampler not in (None, *_SAMPLERS):
        raise ValueError(f"nuts_sampler must be one of {', '.join(map(repr, _SAMPLERS))} "
                         f"(pm.sample's); got {sampler!r}")
    if sampler in _JAX_SAMPLERS:
        compat.check_jax_sampler(sampler)  # (ImportError before anything is forked)
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
    # PyMC 6's backend is the mode of compile_kwargs, for the likelihood's functions
    # as for PyMC's own (the master's, and the rows' on every process).
    compile_kwargs = compat.resolved_compile_kwargs(
        kwargs.pop("backend", None) if "backend" in compat.sample_parameters() else None,
        kwargs.get("compile_kwargs"))
    if compile_kwargs:
        kwargs["compile_kwargs"] = compile_kwargs
    discrete = discrete_names(model)
    if sampler is None:  # pm.sample's own choice (PyMC 6: nutpie where installed)
        sampler = ("pymc" if discrete else
                   compat.default_nuts_sampler(kwargs, compile_kwargs, _NUTPIE_KEYWORDS))
    asked["nuts_sampler"] = sampler
    cores = _check_count("cores", kwargs.pop("cores", None))
    grainsize = check_grainsize(grainsize)  # before a session is forked for nothing
    size = session_size()
    processes = _check_processes(processes_per_chain, size)
    usable = len(os.sched_getaffinity(0))
    if discrete and divide:
        raise ValueError(f"{'exact' if exact else 'divide'}=True: the divided likelihood is "
                         f"sampled by NUTS alone, "
                         f"whose free variables are all continuous; {discrete[0]!r} is "
                         "discrete (divide=None samples it with pm.sample's compound step)")
    if discrete:
        # PyMC's compound step (NUTS and a discrete step), over PyMC's own functions
        log.info("synkhronos.pymc: %r is discrete: pm.sample's compound step, not divided",
                 discrete[0])
        return pm.sample(model=model, **asked)
    if divide is False:
        return pm.sample(model=model, **asked)
    if sampler == "nutpie":
        chains = _check_count("chains", kwargs.get("chains")) or compat.default_chains(cores)
        measure_own = functools.partial(_choice.Own.measure, model,
                                        compile_kwargs=compile_kwargs)
        own, worth = _before_forking(
            model, split, grainsize, divide, size, processes or usable,
            _choice.expected_evaluations(kwargs, chains, 1), measure_own)
        # not divided: nutpie over PyMC's function (measured), or pm.sample itself
        parallel = min(chains, cores or compat.default_cores(), usable)

        def undivided(own):
            if _choice.nutpie_over_own(own, kwargs, chains, parallel):
                return _sample_nutpie(pm, model, own.vgf, cores, kwargs)
            return pm.sample(model=model, **asked)

        if not worth:
            return undivided(own if own is not None else measure_own())
        return _in_master(pm, model, split, grainsize, processes, size,
                          lambda vgf: _sample_nutpie(pm, model, vgf, cores, kwargs),
                          undivided, own, divide is None,
                          compile_kwargs=compile_kwargs, exact=exact)
    if sampler in _JAX_SAMPLERS:
        if not divide:
            # pm.sample itself: JAX's compiled sampler loop runs PyMC's function faster
            # than timing it alone predicts (docs: "numpyro and blackjax"), so no
            # measurement here can say that dividing pays
            log.info("synkhronos.pymc: nuts_sampler=%r: pm.sample's own JAX function (not "
                     "divided; divide=True divides)", sampler)
            return pm.sample(model=model, **asked)
        return _in_master(pm, model, split, grainsize, processes, size,
                          lambda vgf: sample_jax(pm, model, vgf, asked), None, None, False,
                          compile_kwargs=compile_kwargs, exact=exact)
    random_seed = kwargs.pop("random_seed", None)
    if random_seed is None:  # one seed for init_nuts and pm.sample alike
        random_seed = int(np.random.default_rng().integers(2**30))
    chains, seeds = _chains_and_seeds(random_seed, _check_count("chains",
                                                                kwargs.pop("chains", None)),
                                      cores)
    if size is not None:
        if cores is not None and cores > 1:
            warnings.warn(f"cores={cores}: with a session already forked the chains run "
                          "one after another in the master, whose processes already use "
                          "the cores for the likelihood", stacklevel=2)
        running = 1
    else:
        running, processes = _layout(chains, cores, processes, usable,
                                     compat.default_cores())
    sampling = _Sampling(chains, seeds, random_seed, kwargs, compile_kwargs)
    measure = divide is None
    # pm.init_nuts first, as pm.sample runs it: its step's function is PyMC's own, the
    # one the choice measures (no compile of its own) and samples with if not dividing
    init = _initialise(pm, model, sampling) if measure else None
    own, worth = _before_forking(model, split, grainsize, divide, size, processes,
                                 _choice.expected_evaluations(kwargs, chains, running),
                                 lambda: _own_measured(model, init))
    if not worth:  # pm.sample itself: its init, its step
        return _sample_nuts(pm, model, None, sampling, running, init)
    if running == 1:
        # A session of its own on every usable core, unpinned: pinned, a process
        # whose core another program shares cannot move (on a quiet machine pinning
        # measured within 2% either way, benchmarks/pymc_parts.py at n=2), and the
        # rows balance by measured speed (``_rowsum``).
        if init is not None and own is None:  # (measured in the open session)
            own = _own_measured(model, init)
        return _in_master(pm, model, split, grainsize, processes, size,
                          functools.partial(_sample_nuts, pm, model, sampling=sampling,
                                            running=1, init=init),
                          lambda own: _sample_nuts(pm, model, None, sampling, 1, init),
                          own, measure, compile_kwargs=compile_kwargs, exact=exact)
    mp_ctx = kwargs.pop("mp_ctx", None)
    if mp_ctx is not None and (mp_ctx if isinstance(mp_ctx, str)
                               else mp_ctx.get_start_method()) != "fork":
        raise ValueError(f"mp_ctx={mp_ctx!r}: synkhronos.pymc.sample runs chains at once "
                         "in processes forked from this one (mp_ctx='fork', the default "
                         "here); pass cores=1 to run them one after another instead")
    # Each chain's process forks its own session at its first evaluation (none at one
    # process in one block: PyMC's own function). Oversubscribed cores (more processes
    # than cores) must not spin while they wait.
    spin = 0.0 if running * processes > usable else None
    vgf, op = build_logp_dlogp(pm, model, split, grainsize,
                               open_session=_chain_session(processes, spin),
                               processes=processes, caller="sample",
                               compile_kwargs=sampling.compile_kwargs, exact=exact)
    try:
        return _sample_nuts(pm, model, vgf, sampling, running, init)
    except Exception as exc:
        cause = compat.chain_failure(exc)
        if isinstance(cause, ValueError):
            # the model's checks, made in the chain's process: raised as there
            raise cause.with_traceback(None) from exc
        raise
    finally:
        if op is not None:
            op.release()


def _before_forking(model, split, grainsize, divide, size, processes, evaluations,
                    measure_own: Callable[[], _choice.Own]
                    ) -> tuple[_choice.Own | None, bool]:
    """Step 1 of ``_choice``, where a measured choice is asked and nothing is forked
    yet: ``(own, worth)``, PyMC's own function measured (``measure_own()``, or None
    where nothing was measured) and whether to go on to build the divided one.
    Nothing is measured with ``divide`` True or a session open (step 2 measures in
    it), or at one process in one block (nothing to divide: not worth it)."""
    if divide or size is not None:
        return None, True
    in_slices = sliced(model, split, grainsize, processes)
    if processes == 1 and not in_slices:
        return None, False
    own = measure_own()
    return own, _choice.worth_forking(own, processes, evaluations, in_slices).divided


def _in_master(pm, model, split, grainsize, processes, size, run, undivided, own,
               measure: bool, compile_kwargs: dict | None = None, exact: bool = False):
    """``run(vgf)`` with the chains in this process: over the open session, or over one
    forked here (``processes``) and closed at the end.
    With ``measure`` the divided function is kept only if it is measured faster than
    PyMC's own (``own``, measured before forking; None: measured now), otherwise the
    session is closed and ``undivided(own)`` samples with PyMC's own function, measured
    (``undivided`` is None where nothing is measured).
    ``exact``: ``build_logp_dlogp``'s (never measured: always divided)."""
    own_session = size is None
    if own_session:
        fork(processes)
    try:
        if not measure:
            vgf, op = build_logp_dlogp(pm, model, split, grainsize, caller="sample",
                                       compile_kwargs=compile_kwargs, exact=exact)
        else:
            vgf, op, own = _choice.build_chosen(pm, model, split, grainsize, own,
                                                caller="sample",
                                                compile_kwargs=compile_kwargs)
        if vgf is not None:
            try:
                return run(vgf)
            finally:
                if op is not None:
                    op.release()
    finally:
        if own_session:
            close()
    return undivided(own)


def _layout(chains: int, cores: int | None, processes: int | None, usable: int,
            pymc_cores: int) -> tuple[int, int]:
    """``(running chains, processes per chain)`` for a sampling without a session.

    ``cores`` keeps PyMC's meaning, its default included (``pymc_cores``: four on a
    machine of 8 logical CPUs or more, one on 2), though never more than the ``usable``
    cores (a job given part of a machine); with ``processes_per_chain`` given and
    ``cores`` not, no more run at once than fit in the usable cores. The cores
    go to the running chains' processes, divided evenly (CmdStan's ``parallel_chains``
    x ``threads_per_chain``).
    """
    if cores is not None:
        running = min(cores, chains)
    else:
        running = max(1, min(pymc_cores, chains, usable))
        if processes is not None:
            running = max(1, min(running, usable // processes))
    if processes is None:
        processes = max(1, usable // running)
    return running, processes


def _chain_session(processes: int, spin: float | None):
    """The function a chain's process calls at its first evaluation: it forks that
    process's session and returns its size."""

    def open_session() -> int:
        fork(processes, spin=spin)
        # PyMC's chain processes end through multiprocessing, which runs its own
        # finalizers but not atexit's: close the session there (also after PyMC's abort
        # on Ctrl-C, and on SIGTERM, which the session turns into SystemExit).
        multiprocessing.util.Finalize(None, close, exitpriority=0)
        return n_parallel()

    return open_session


# pm.sample's NUTS samplers; those whose loop JAX compiles (their log-density is a
# callback, _jax_samplers).
_SAMPLERS = ("pymc", "nutpie", "numpyro", "blackjax")
_JAX_SAMPLERS = ("numpyro", "blackjax")

# The pm.sample keywords with an equivalent on the nutpie route.
_NUTPIE_KEYWORDS = {
    "draws", "tune", "chains", "cores", "random_seed", "initvals", "progressbar", "quiet",
    "discard_tuned_samples", "target_accept", "max_treedepth", "nuts", "nuts_sampler_kwargs",
    "var_names", "compute_convergence_checks", "idata_kwargs", "return_inferencedata",
    "backend", "compile_kwargs",
}


def _check_divide(divide) -> bool | None:
    if divide is not None and not isinstance(divide, bool):
        raise TypeError(f"divide must be True, False or None (chosen by measurement); "
                        f"got {divide!r}")
    return divide


def _check_count(name: str, value) -> int | None:
    """``cores`` or ``chains`` checked: None or a whole number >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be a whole number or None; got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1; got {value}")
    return int(value)


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


@dataclasses.dataclass
class _Sampling:
    """What ``pm.sample`` is asked for: the chains, their seeds (``pm.sample``'s), the
    seed itself, and the rest of its keywords."""

    chains: int
    seeds: list[int]
    random_seed: Any
    kwargs: dict
    compile_kwargs: dict


@dataclasses.dataclass
class _Initialised:
    """What ``pm.init_nuts`` made, as ``pm.sample`` makes it: the chains' starting
    points and the NUTS step over PyMC's own function (its adapted potential, seed and
    options), the step's keywords, ``pm.sample``'s keywords left, and its seconds
    (compiling PyMC's function, mostly)."""

    points: list
    step: Any
    step_kwargs: dict
    kwargs: dict
    seconds: float


def _initialise(pm, model, sampling: _Sampling) -> _Initialised:
    """``pm.init_nuts`` with ``pm.sample``'s arguments and seeds."""
    params = compat.sample_parameters()
    kwargs = dict(sampling.kwargs)
    # pm.sample hands its unnamed keywords (and the "nuts" dict) to the NUTS step.
    step_kwargs = {name: kwargs.pop(name) for name in list(kwargs) if name not in params}
    for name, value in (step_kwargs.pop("nuts", None) or {}).items():
        step_kwargs.setdefault(name, value)

    def default(name):
        return kwargs.pop(name, params[name].default)

    quiet = kwargs.get("quiet", False)
    start = time.perf_counter()
    points, step = pm.init_nuts(
        init=default("init"), chains=sampling.chains, n_init=default("n_init"), model=model,
        random_seed=sampling.seeds,
        progressbar=bool(kwargs.get("progressbar", True)) and not quiet,
        quiet=quiet, jitter_max_retries=default("jitter_max_retries"),
        tune=kwargs.get("tune", params["tune"].default), initvals=kwargs.pop("initvals", None),
        compile_kwargs=sampling.compile_kwargs, **step_kwargs,
    )
    return _Initialised(points, step, step_kwargs, kwargs, time.perf_counter() - start)


def _own_measured(model, init: _Initialised) -> _choice.Own:
    """PyMC's own function, as init_nuts compiled it for its step, timed."""
    return _choice.Own.of(compat.step_function(init.step), init.seconds, model)


def _sample_nuts(pm, model, vgf, sampling: _Sampling, running: int,
                 init: _Initialised | None = None):
    """``pm.sample`` after ``pm.init_nuts`` (``init``; made here if None), with its
    NUTS step over ``vgf`` (None: init_nuts's own step, PyMC's function: this is then
    ``pm.sample`` itself) and ``running`` chains at once (more than one: PyMC's own
    chain processes, forked)."""
    init = init if init is not None else _initialise(pm, model, sampling)
    step = init.step
    if vgf is not None:  # the same step (its potential, seed and options), over vgf
        step = pm.NUTS(potential=init.step.potential, model=model, rng=sampling.seeds[0],
                       initial_point=init.points[0], logp_dlogp_func=vgf,
                       **init.step_kwargs)
    kwargs = dict(init.kwargs)
    if running > 1 and vgf is not None:
        kwargs["mp_ctx"] = "fork"  # the chain processes inherit the step: no pickling
    if running == 1 and sampling.chains > 1:
        kwargs["callback"] = _OneInterruptStopsAll(_choice.draws_per_chain(kwargs),
                                                   kwargs.get("callback"))
    return pm.sample(model=model, step=step, initvals=init.points, chains=sampling.chains,
                     cores=running, random_seed=sampling.random_seed, **kwargs)


class _OneInterruptStopsAll:
    """``pm.sample``'s callback where its chains run one after another: PyMC ends the
    chain that a ``KeyboardInterrupt`` (Ctrl-C) reaches and goes on with the next, to
    its end. Once a chain has ended before its ``per_chain``-th draw, every later chain
    ends at its first (PyMC then keeps the chains that drew the most, as after any
    interrupt). ``callback``, the caller's, runs at every draw after it."""

    def __init__(self, per_chain: int, callback: Callable | None):
        self.per_chain = per_chain
        self.callback = callback
        self.chain: int | None = None  # the chain of the last draw seen
        self.ended = True  # whether that chain has drawn its last

    def __call__(self, trace, draw):
        if draw.chain != self.chain:
            cut_short = not self.ended
            self.chain, self.ended = draw.chain, False
            if cut_short:
                raise KeyboardInterrupt  # (PyMC ends this chain: it drew one)
        self.ended = draw.draw_idx + 1 >= self.per_chain
        if self.callback is not None:
            self.callback(trace=trace, draw=draw)


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
                      "sampler, as in pm.sample", UserWarning, stacklevel=5)
    # nutpie computes no convergence checks; pm.sample's nutpie route returns
    # InferenceData always: both keywords are accepted as it accepts them.
    kwargs.pop("compute_convergence_checks", None)
    kwargs.pop("return_inferencedata", None)
    if chains is None:
        chains, _ = _chains_and_seeds(0, None, cores)
    seed = compat.nutpie_seed(random_seed, chains)  # (pm.sample's, for the same draws)

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
    start_time = time.time()
    idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=1, seed=seed,
                          save_warmup=save_warmup, progress_bar=progress, **options)
    compat.patch_nutpie_idata(idata, model, time.time() - start_time, tune)
    return idata
