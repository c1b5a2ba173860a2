"""Sampling: ``pm.sample`` on the rewritten model, whichever sampler drives it.

``sample`` checks its arguments, decides whether dividing pays (``_choice``), opens
the session the chains' evaluations need, and calls ``pm.sample`` on the model whose
divided terms are one term over the row-sum Op (``_model``): PyMC's seeds,
initialisation, start-value checks, samplers and InferenceData are PyMC's own, so the
draws equal ``pm.sample``'s on the user's model up to rounding. Where the chains run:

- several at once (PyMC's NUTS, ``cores`` > 1, no session open): PyMC's own parallel
  sampler forks one process per chain from this one, before any session exists. The
  Op is built here without one: the evaluations PyMC makes here first (start-value
  checks, jitter) run all the rows in a plain function, and at a chain process's
  first evaluation that process forks its own session of ``processes_per_chain``
  processes and compiles its rows' function. Each chain process is a program of its
  own for synkhronos (its prefix, lock and watcher), so the one-session-per-program
  rule holds in each; a chain process closes its session as it ends (normally, on
  PyMC's abort after Ctrl-C, or on its SIGTERM);
- in this process (one running chain, a session already open, nutpie, numpyro or
  blackjax): the session (the user's, or one ``sample`` forks and closes) evaluates
  every chain's likelihood; nutpie compiles the rewritten model itself
  (``nutpie.compile_pymc_model``, the Op in Numba's object mode or a JAX callback),
  numpyro and blackjax through PyMC's JAX route (a host callback, ``_rowsum``).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing.util
import os
import warnings
from collections.abc import Callable

import numpy as np

from .. import close, fork, n_parallel
from . import _choice
from . import _pymc_compat as compat
from ._likelihood import build, check_exact, check_grainsize, discrete_names, session_size, sliced
from ._model import named_keys
from ._rowsum import linker_of, register_backends

__all__ = ["sample"]

log = logging.getLogger("synkhronos")


def sample(draws=1000, *, model=None, split=None, grainsize=None, processes_per_chain=None,
           divide=None, exact=False, backend=None, **kwargs):
    """``pm.sample`` with the observed log-likelihood evaluated on every process.

    The rows of the observed data are divided among a session's processes and the
    log-likelihood and its gradient summed; the prior is evaluated in the process that
    runs the chain. This is ``pm.sample`` itself, on a copy of the model whose divided
    terms are one term over the processes' sum: PyMC initialises, checks the start
    values, samples and builds the InferenceData as it does for the model. With the
    same ``random_seed`` the draws equal ``pm.sample``'s with the same sampler, up to
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
        Where it is not kept, this is ``pm.sample`` itself (same draws, same speed).
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
    backend : str, optional
        The backend the rows' function and PyMC's own compile with: ``"c"``,
        ``"numba"`` or ``"jax"`` (on the CPU, one XLA thread a process), as PyMC 6's
        ``pm.sample(backend=...)`` (taken on PyMC 5 too, as ``compile_kwargs``'
        ``mode``). Default: PyTensor's default mode.
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
        the fastest sampler installed: nutpie where it is, the mode compiles with
        Numba or JAX and every keyword has an equivalent there (PyMC 5 as 6),
        otherwise PyMC's NUTS. ``compile_kwargs`` gives the mode of the likelihood's
        functions too.
        ``nuts_sampler="nutpie"`` is ``pm.sample``'s nutpie route on the rewritten
        model (nutpie compiles it, the Op called back from its threads one at a
        time); only the keywords nutpie has an equivalent for are accepted
        (``draws``, ``tune``, ``chains``, ``cores``, ``random_seed``, ``initvals``
        (one dict), ``progressbar``, ``quiet``, ``discard_tuned_samples``,
        ``target_accept``, ``max_treedepth``, ``nuts``, ``nuts_sampler_kwargs``,
        ``var_names``, ``compute_convergence_checks``, ``idata_kwargs``,
        ``return_inferencedata``, ``compile_kwargs``).
        ``nuts_sampler="numpyro"`` or ``"blackjax"`` is ``pm.sample`` with that
        sampler, its log-density the divided function (a JAX callback) with
        ``divide=True`` or ``exact=True``, otherwise PyMC's own JAX function (not
        divided: not chosen by measurement, see the docs' "numpyro and blackjax").

    Returns
    -------
    arviz.InferenceData or MultiTrace
        What ``pm.sample`` returns for the model: its coords and dims, its
        ``observed_data`` and ``constant_data``, and with
        ``idata_kwargs={"log_likelihood": True}`` the pointwise log-likelihood of its
        observed variables (PyMC's ``compute_log_likelihood``, in the master).

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
    divide = _check_divide(divide)
    exact = check_exact(exact)
    if exact:
        if divide is False:
            raise ValueError("exact=True sums the divided rows in fixed chunks; it cannot "
                             "be had with divide=False (PyMC's own function)")
        divide = True
    if "step" in kwargs:
        raise TypeError("synkhronos.pymc.sample() samples with pm.sample's NUTS over the "
                        "divided likelihood; for another step, fork a session "
                        "(synk.fork()), build the step over "
                        "synkhronos.pymc.logp_dlogp_function(model) (e.g. pm.NUTS("
                        "logp_dlogp_func=...)) and call pm.sample(step=..., cores=1)")
    sampler = kwargs.pop("nuts_sampler", None)
    if sampler not in (None, *_SAMPLERS):
        raise ValueError(f"nuts_sampler must be one of {', '.join(map(repr, _SAMPLERS))} "
                         f"(pm.sample's); got {sampler!r}")
    if sampler == "nutpie":
        unknown = sorted(set(kwargs) - _NUTPIE_KEYWORDS)
        if unknown:
            raise TypeError(f"nuts_sampler='nutpie' has no equivalent for "
                            f"{', '.join(unknown)}; use nuts_sampler='pymc' for them")
        if not isinstance(kwargs.get("initvals") or {}, dict):
            raise TypeError("nuts_sampler='nutpie' takes one dict of initvals for every "
                            "chain, not one a chain; use nuts_sampler='pymc' for those")
    if sampler is not None:
        compat.check_sampler(sampler)  # (ImportError before anything is forked)
    if sampler == "nutpie":
        compat.nutpie_options(kwargs)
    minibatch = compat.minibatch_variables(model)
    if minibatch:
        raise ValueError(f"observed variable {minibatch[0]!r} reads pm.Minibatch data: "
                         "sampling needs every row, which synkhronos.pymc divides among "
                         "the processes; sample the full data (pm.Data), or fit "
                         "minibatches with ADVI (pm.fit)")
    # The rows' mode (and PyMC's): PyMC 6 takes backend itself, as its nutpie route
    # needs it (nutpie's own backend); PyMC 5 takes it as compile_kwargs' mode
    compile_kwargs = compat.compile_kwargs(backend, kwargs.get("compile_kwargs"))
    if backend is not None and "backend" in compat.sample_parameters():
        kwargs["backend"] = backend
    elif compile_kwargs:
        kwargs["compile_kwargs"] = compile_kwargs
    discrete = discrete_names(model)
    asked = dict(kwargs, nuts_sampler=sampler) if sampler is not None else dict(kwargs)
    if sampler is None:  # the fastest installed where the keywords allow it
        sampler = "pymc" if discrete else _default_sampler(kwargs, compile_kwargs)
        if sampler == "nutpie":
            compat.nutpie_options(kwargs)
    if "initvals" in kwargs:  # (the rewritten model's variables are named as the user's)
        kwargs["initvals"] = named_keys(kwargs["initvals"])
    jax_mode = linker_of(compile_kwargs.get("mode")) == "JAXLinker"
    cores = _check_count("cores", kwargs.get("cores"))
    chains = _check_count("chains", kwargs.get("chains"))
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
    if (sampler in _JAX_SAMPLERS or jax_mode) and not divide:
        # pm.sample itself: JAX's compiled sampler loop runs PyMC's function faster
        # than timing it alone predicts (docs: "numpyro and blackjax"), and timing a
        # function JAX compiled here would start JAX's runtime, after which no session
        # can fork: no measurement here can say that dividing pays
        log.info("synkhronos.pymc: %s: pm.sample's own JAX function (not divided; "
                 "divide=True divides)", f"nuts_sampler={sampler!r}" if sampler in
                 _JAX_SAMPLERS else "backend JAX")
        return pm.sample(model=model, **asked)
    kwargs["nuts_sampler"] = sampler
    if chains is None:  # pm.sample's default, from its default cores (passed: not ours)
        chains = compat.default_chains(cores)
    kwargs["chains"] = chains
    if size is not None or sampler != "pymc" or jax_mode:
        # (JAX in this process before PyMC forks chain processes would hang them)
        if size is not None and sampler == "pymc" and cores is not None and cores > 1:
            warnings.warn(f"cores={cores}: with a session already forked the chains run "
                          "one after another in the master, whose processes already use "
                          "the cores for the likelihood", stacklevel=2)
        running = 1
        processes = processes or usable
    else:
        running, processes = _layout(chains, cores, processes, usable,
                                     compat.default_cores())
    if sampler == "pymc" and running == 1 and chains > 1:
        stops_all = _OneInterruptStopsAll(_choice.draws_per_chain(kwargs),
                                          kwargs.get("callback"))
        kwargs["callback"] = stops_all  # (divided: the chains one after another here)
        if min(cores or compat.default_cores(), chains) == 1:
            # pm.sample itself too, where it runs the chains one after another
            asked["nuts_sampler"], asked["callback"] = "pymc", stops_all
    measure = divide is None
    own, worth = _before_forking(model, split, grainsize, divide, size, processes,
                                 _choice.expected_evaluations(kwargs, chains, running),
                                 compile_kwargs)
    if not worth:  # pm.sample itself
        return pm.sample(model=model, **asked)
    if running == 1:
        kwargs["cores"] = 1 if sampler == "pymc" else cores
        return _in_master(pm, model, split, grainsize, processes, size, kwargs,
                          functools.partial(pm.sample, model=model, **asked), own, measure,
                          compile_kwargs=compile_kwargs, exact=exact)
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
    rewritten, op = build(pm, model, split, grainsize,
                          open_session=_chain_session(processes, spin), processes=processes,
                          caller="sample", compile_kwargs=compile_kwargs, exact=exact)
    try:
        return _pm_sample(pm, model, rewritten, dict(kwargs, cores=running, mp_ctx="fork"),
                          op)
    except Exception as exc:
        cause = compat.chain_failure(exc)
        if isinstance(cause, ValueError):
            # the model's checks, made in the chain's process: raised as there
            raise cause.with_traceback(None) from exc
        raise
    finally:
        if op is not None:
            op.release()


def _pm_sample(pm, model, rewritten, kwargs: dict, op=None):
    """``pm.sample`` on the rewritten model, with what the rewrite took from the
    InferenceData given back (``compat.complete_idata``: the removed variables'
    observed data and, where asked, their log-likelihood, PyMC's own). An evaluation's error
    is raised as itself (JAX and nutpie report their own)."""
    idata_kwargs = dict(kwargs.get("idata_kwargs") or {})
    log_likelihood = idata_kwargs.pop("log_likelihood", False)
    if log_likelihood:
        kwargs = dict(kwargs, idata_kwargs=idata_kwargs)
    jax_route = kwargs.get("nuts_sampler") in _JAX_SAMPLERS or (
        linker_of((kwargs.get("compile_kwargs") or {}).get("mode")) == "JAXLinker"
        or kwargs.get("backend") == "jax")
    if jax_route:
        register_backends("JAX")
    if kwargs.get("nuts_sampler") == "nutpie":
        register_backends("NUMBA")  # (nutpie compiles with Numba whatever PyTensor's mode)
    if op is not None:
        op.failures.clear()
    try:
        result = pm.sample(model=rewritten, **kwargs)
    except Exception as exc:
        if op is not None and op.failures and op.failures[0] is not exc:
            raise op.failures[0] from exc
        raise
    finally:
        if jax_route:
            # Before the session can close: computations pm.sample started and did not
            # wait for (blackjax leaves some) run their callbacks now, and no compiled
            # sampler holding this callback is reused by a later pm.sample.
            import jax

            try:
                jax.effects_barrier()
            finally:
                jax.clear_caches()
    if op is not None and op.failures:
        # nutpie counts a failed evaluation as a divergence and goes on sampling
        raise op.failures[0]
    return compat.complete_idata(result, model, log_likelihood, idata_kwargs)


def _default_sampler(kwargs: dict, compile_kwargs: dict) -> str:
    """The sampler without ``nuts_sampler``: nutpie where it is installed and every
    keyword has an equivalent there, with ``init`` "auto", InferenceData returned, no
    ``trace`` or ``callback``, one dict of ``initvals`` or none, and a mode that
    compiles with Numba or JAX (nutpie's backends); otherwise PyMC's NUTS."""
    import importlib.util

    initvals = kwargs.get("initvals")
    linker = linker_of(compile_kwargs.get("mode"))
    if initvals is not None and "backend" not in compat.sample_parameters():
        return "pymc"  # (PyMC 5's nutpie route ignores initvals)
    usable = (importlib.util.find_spec("nutpie") is not None
              and kwargs.get("init", "auto") == "auto"
              and kwargs.get("return_inferencedata", True)
              and kwargs.get("trace") is None and kwargs.get("callback") is None
              and (initvals is None or isinstance(initvals, dict))
              and linker in ("NumbaLinker", "JAXLinker")
              and set(kwargs) <= _NUTPIE_KEYWORDS)
    return "nutpie" if usable else "pymc"


def _before_forking(model, split, grainsize, divide, size, processes, evaluations,
                    compile_kwargs: dict) -> tuple[_choice.Own | None, bool]:
    """Step 1 of ``_choice``, where a measured choice is asked and nothing is forked
    yet: ``(own, worth)``, PyMC's own function measured (or None where nothing was
    measured) and whether to go on to build the divided one.
    Nothing is measured with ``divide`` True or a session open (step 2 measures in
    it), or at one process in one block (nothing to divide: not worth it)."""
    if divide or size is not None:
        return None, True
    in_slices = sliced(model, split, grainsize, processes)
    if processes == 1 and not in_slices:
        return None, False
    own = _choice.Own.measure(model, compile_kwargs)
    return own, _choice.worth_forking(own, processes, evaluations, in_slices).divided


def _in_master(pm, model, split, grainsize, processes, size, kwargs, undivided, own,
               measure: bool, compile_kwargs: dict | None = None, exact: bool = False):
    """``pm.sample`` on the rewritten model with the chains in this process: over the
    open session, or over one forked here (``processes``) and closed at the end.
    With ``measure`` the divided function is kept only if it is measured faster than
    PyMC's own (``own``, measured before forking; None: measured now), otherwise the
    session is closed and ``undivided()`` samples (``pm.sample`` itself).
    ``exact``: ``build``'s (never measured: always divided)."""
    own_session = size is None
    if own_session:
        fork(processes)
    try:
        if not measure:
            rewritten, op = build(pm, model, split, grainsize, caller="sample",
                                  compile_kwargs=compile_kwargs, exact=exact)
        else:
            rewritten, op = _choice.build_chosen(pm, model, split, grainsize, own,
                                                 caller="sample",
                                                 compile_kwargs=compile_kwargs)
        if rewritten is not None:
            try:
                return _pm_sample(pm, model, rewritten, kwargs, op)
            finally:
                if op is not None:
                    op.release()
    finally:
        if own_session:
            close()
    return undivided()


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
# callback, _rowsum).
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
