"""Whether dividing the rows pays: PyMC's own log-density against the divided one, measured.

This module owns the choice between the divided log-density and PyMC's own function
(``model.logp_dlogp_function``: "do not divide"), made when the function is built, by
measurement, so that ``sample`` is never slower than ``pm.sample`` on the same machine
at any data size. Two steps:

1. before any process is forked (``sample`` without a session): PyMC's own function is
   compiled (``compiled``: the model's ``logp_dlogp_function``) and timed per
   evaluation at a jittered start (``Own.measure``); ``worth_forking`` predicts what dividing
   would save over the whole run (the evaluations NUTS is expected to make,
   ``expected_evaluations``, each cut to ``1/(n * efficiency)`` of PyMC's plus a fixed
   cost of the parallel call) against what building it costs (forking, compiling the
   rows' function in every process, copying the rows: taken as one more compile of
   PyMC's function plus a constant). Below that, PyMC's own function is used and
   nothing is forked;
2. once the divided function is built (in a session: the user's, or one ``sample``
   forked after step 1 said yes), both are timed at the same point, alternately, and
   the divided one is kept only if it is faster (``keep_divided``; ``build_chosen``
   builds and decides). A machine whose cores are busy with other work shows here:
   the divided evaluation waits for its slowest process, PyMC's own runs on whichever
   core is free.

Where it is not divided, ``sample`` is ``pm.sample`` on the user's model.

The figures and the choice are logged (logger ``"synkhronos"``, INFO).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from . import _pymc_compat as compat

__all__ = ["Own", "Choice", "worth_forking", "expected_evaluations", "keep_divided",
           "build_chosen", "seconds_per_evaluation", "initial_vector", "measuring_point",
           "compiled"]

log = logging.getLogger("synkhronos")

# Timing: evaluations until this many seconds (at least _FEWEST), in _ROUNDS rounds,
# the median of the rounds' means: noise from one interruption counts for one round.
_PROBE_S = 0.03
_FEWEST = 2
_ROUNDS = 3
# The prediction of step 1. A divided evaluation at n processes takes PyMC's time over
# n * _EFFICIENCY, plus _CALL_S + n * _CALL_PER_PROCESS_S (a command, the reduction of
# n replies, the Op's boundary): at 10^3 rows on 2 cores PyMC's evaluation took 37 us
# and the divided one 29 us; at 10^5 rows the divided one reached 0.89 of the ceiling
# (docs/figures/pymc_small_data_pymc6.json, pymc_sampling.json). NUTS makes about
# _LEAPFROGS evaluations a draw (a tree of depth 4: with 8, depth 3, the prediction
# kept PyMC's function where dividing gave 1.23-1.25x, the logistic model at 10^4 rows
# and the hierarchical one at 10^5, one chain; docs/figures/pymc_peers_2core.json);
# building costs about one compile of the model's function more, plus _BUILD_S
# (forking, copying the rows, the check): at 10^4 rows of the logistic model the
# divided run spent 0.86 s more outside its sampling loop where pm.init_nuts took 0.78.
_EFFICIENCY = 0.8
_CALL_S = 20e-6
_CALL_PER_PROCESS_S = 3e-6
_LEAPFROGS = 16
_BUILD_S = 0.1


def initial_vector(model: Any) -> np.ndarray:
    """The model's initial point, raveled as a ``ValueGradFunction`` takes it."""
    point = model.initial_point()
    values = model.continuous_value_vars
    return np.concatenate([np.ravel(point[v.name]) for v in values]).astype("float64")


def measuring_point(model: Any) -> np.ndarray:
    """Where both functions are timed: the initial point jittered as ``pm.init_nuts``
    jitters a chain's start (uniform in [-1, 1] in the transformed space; a fixed
    seed). At the initial point itself the rows' terms can be uncommonly cheap: a
    logistic regression's zero coefficients give every row the same softplus argument
    (Numba, 10^5 rows: 3.4 ms there, 5.6 ms at the posterior), while a function
    compiled with JAX costs the same everywhere."""
    x = initial_vector(model)
    return x + np.random.default_rng(0).uniform(-1.0, 1.0, size=x.shape)


def seconds_per_evaluation(fns: list[Any], x: np.ndarray) -> list[float]:
    """Each function's seconds per call at ``x``, timed in alternating rounds (so a
    change of the machine's load hits them alike): the median over rounds of each
    round's mean. Each call's results are read (``np.asarray``): a function compiled
    with JAX returns before its computation ends, and timed unread it would look
    faster than it is while its backlog ran beside the next one's calls."""
    for fn in fns:
        _read(fn(x))  # first-call costs (allocations, caches) stay out of the timing
    rounds: list[list[float]] = [[] for _ in fns]
    for _ in range(_ROUNDS):
        for times, fn in zip(rounds, fns, strict=True):
            calls, start = 0, time.perf_counter()
            while True:
                _read(fn(x))
                calls += 1
                took = time.perf_counter() - start
                if calls >= _FEWEST and took >= _PROBE_S / _ROUNDS:
                    break
            times.append(took / calls)
    return [float(np.median(times)) for times in rounds]


def _read(results: Any) -> None:
    """Waits for a function's results (a value, or a tuple of them)."""
    for result in results if isinstance(results, tuple | list) else (results,):
        np.asarray(result)


@dataclasses.dataclass
class Own:
    """PyMC's own function of the model (``jacobian`` as asked), its compile seconds
    and seconds per evaluation at ``x`` (``measuring_point``)."""

    vgf: Any
    compile_s: float
    seconds: float
    x: np.ndarray

    @classmethod
    def measure(cls, model: Any, compile_kwargs: dict | None = None) -> Own:
        """PyMC's own function compiled here (its first call, where Numba compiles,
        counted in the compile), then timed at ``measuring_point(model)``."""
        start = time.perf_counter()
        vgf = compiled(model, compile_kwargs)
        vgf(initial_vector(model))
        compile_s = time.perf_counter() - start
        x = measuring_point(model)
        (seconds,) = seconds_per_evaluation([vgf], x)
        return cls(vgf, compile_s, seconds, x)


def compiled(model: Any, compile_kwargs: dict | None = None) -> Any:
    """``model``'s own ``logp_dlogp_function`` (raveled point in, ``(logp, dlogp)`` out),
    compiled with ``compile_kwargs``."""
    vgf = model.logp_dlogp_function(ravel_inputs=True, **(compile_kwargs or {}))
    vgf.set_extra_values({})
    return vgf


@dataclasses.dataclass(frozen=True)
class Choice:
    """What was chosen and the figures it was chosen on (seconds)."""

    divided: bool
    processes: int
    pymc_s: float | None
    divided_s: float | None = None
    predicted_saving_s: float | None = None
    predicted_cost_s: float | None = None

    def __str__(self) -> str:
        said = f"divided over {self.processes} processes" if self.divided else (
            "PyMC's own function (not divided)")
        figures = [f"{name} {value * 1e6:.1f} us" for name, value in
                   (("PyMC's evaluation", self.pymc_s), ("divided", self.divided_s))
                   if value is not None]
        if self.predicted_saving_s is not None:
            figures.append(f"dividing predicted to save {self.predicted_saving_s:.2f} s "
                           f"for {self.predicted_cost_s:.2f} s of building")
        return f"{said}: {', '.join(figures)}"


def worth_forking(own: Own, processes: int, evaluations: int, sliced: bool) -> Choice:
    """Step 1: whether dividing over ``processes`` is predicted to pay over a run of
    ``evaluations`` evaluations of one running chain. ``sliced``: each process would
    run its rows in slices, where they outgrow the cache; that pays even at one
    process (1.2-1.6x at 10^6 rows on 2 cores), so it is always tried (step 2
    decides)."""
    divided_s = (own.seconds / (processes * _EFFICIENCY) + _CALL_S
                 + processes * _CALL_PER_PROCESS_S)
    saving = evaluations * (own.seconds - divided_s)
    cost = _BUILD_S + own.compile_s
    choice = Choice(sliced or (processes > 1 and saving > cost), processes, own.seconds,
                    None, saving, cost)
    log.info("synkhronos.pymc: before forking, %s", choice)
    return choice


def draws_per_chain(sample_kwargs: dict) -> int:
    """The draws, tuning included, of one chain of a ``pm.sample`` run of these
    keywords."""
    tune = sample_kwargs.get("tune", compat.sample_parameters()["tune"].default)
    if tune is None:  # PyMC 6: the step's own default, 1000 for NUTS
        tune = 1000
    draws = sample_kwargs.get("draws", compat.sample_parameters()["draws"].default)
    return int(draws) + int(tune)


def expected_evaluations(sample_kwargs: dict, chains: int, running: int) -> int:
    """The evaluations one running chain's function is expected to make in a
    ``pm.sample`` run of these keywords, ``chains`` of them ``running`` at once."""
    return -(-chains // running) * draws_per_chain(sample_kwargs) * _LEAPFROGS


def keep_divided(own: Own, divided: Any, processes: int) -> Choice:
    """Step 2: the built divided function against PyMC's own, at the same point."""
    pymc_s, divided_s = seconds_per_evaluation([own.vgf, divided], own.x)
    choice = Choice(divided_s < pymc_s, processes, pymc_s, divided_s)
    log.info("synkhronos.pymc: measured, %s", choice)
    return choice


def build_chosen(pm: Any, model: Any, split: Any, grainsize: int | None,
                 own: Own | None = None, caller: str = "sample",
                 compile_kwargs: dict | None = None) -> tuple[Any, Any]:
    """The divided model built in the open session (``_likelihood.build``), kept only if
    its function is measured faster than PyMC's own (``own``, measured here if None):
    ``(rewritten model, op)`` where it was kept, ``(None, None)`` where not."""
    from ._likelihood import build, session_size

    processes = session_size() or 1
    rewritten, op = build(pm, model, split, grainsize, caller=caller,
                          compile_kwargs=compile_kwargs)
    if op is None:  # one process, one block: the model itself
        return None, None
    try:
        own = own if own is not None else Own.measure(model, compile_kwargs)
        choice = keep_divided(own, compiled(rewritten, compile_kwargs), processes)
    except BaseException:
        op.release()
        raise
    if choice.divided:
        return rewritten, op
    op.release()
    return None, None
