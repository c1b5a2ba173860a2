"""PyMC with the likelihood on every core (synkhronos.pymc) against the samplers a PyMC
user would otherwise pick.

Two unmodified PyMC models of a large data set: a logistic regression (10 features) and
a hierarchical GLM (100 groups, 5 features, a Normal likelihood). In one run:

- **whole sampling against the peers** (``--sample-rows``, default 10^3 .. 10^6 rows;
  ``--no-peers`` skips it): ``synkhronos.pymc.sample`` as a PyMC user calls it (no
  session of one's own), with its default ``divide=None`` (it measures whether dividing
  pays and otherwise runs ``pm.sample`` itself) and with ``divide=True`` (always
  divided; also with nutpie's, numpyro's or blackjax's NUTS driving the divided
  function), against ``pm.sample(nuts_sampler="pymc")``, ``"nutpie"``, ``"numpyro"`` and
  ``"blackjax"``, each with its own defaults (cores, BLAS and JAX threads); a sampler that is not
  installed (or an earlier synkhronos without ``divide``) is skipped with the reason
  recorded (``--samplers`` picks some). Each at every ``--chains`` (default 2 and 1)
  and, with ``--busy``, also with one busy core beside it: a separate process spinning
  a pure-Python loop, started before the timed call and stopped after it (``--busy
  on``: only busy runs; ``--busy`` alone: idle and busy runs, both in every round).
  The figure of merit is the minimum bulk ESS (ArviZ ``ess(method="bulk")``, the
  smallest over every scalar of the posterior) per second of wall time (the whole call:
  compiling and initialisation included) and per second of sampling alone (the time
  the sampler itself records in the posterior's ``sampling_time``: PyMC's loop over
  tuning and draws; nutpie's ``nutpie.sample`` call, after its compile; numpyro's and
  blackjax's whole sampler call, JAX's compiling of it included; where a sampler records none,
  the JSON says so and that figure is null). The clock stops once every array of the
  InferenceData is computed: PyMC 6's blackjax route returns while its sampler still
  runs (JAX's asynchronous dispatch), and its ``sampling_time`` stops there too, so for
  such a run the JSON keeps that figure as ``sampling_time_stopped_at_return`` and
  sampling alone is null. Every run of a row count (every sampler x
  chains x busy) is made once per round (``--rounds``), in a random order drawn per
  round (recorded), each with its load average before and after, the busy process's
  CPU seconds, the divergences, the posterior means' gap to ``pm.sample``'s of the same
  round (in MCSE) and, for synkhronos, its ``"synkhronos.pymc:"`` INFO log lines
  (logger ``"synkhronos"``: what it measured and chose) and the choice they say.
  Draws and tuning: ``--draws`` / ``--tune`` (default 1000 each) below 10^6 rows,
  ``--large-draws`` / ``--large-tune`` (default 200 each) from 10^6 rows, so that a run
  fits in hours: on 2 cores one round of the defaults (both models, 10^3 .. 10^6 rows,
  2 chains and 1, five samplers) takes about 1.5-2 hours, most of it at 10^5 and 10^6
  rows; ``--busy`` doubles it. The JSON's ``headline`` has one entry per model x rows x chains x
  busy: each sampler's median ESS/s over rounds (wall and sampling), the best peer
  (PyMC, nutpie, numpyro, blackjax) and synkhronos's ratio to it (> 1: synkhronos gives more
  effective draws a second), and what synkhronos chose in each round;
- **per evaluation of logp + gradient** (``--rows``, default 10^3 .. 10^6;
  ``--no-evaluations`` skips it): PyMC's own compiled function
  (``model.logp_dlogp_function``) at one BLAS thread and at its default threads,
  ``synkhronos.pymc.logp_dlogp_function`` at n_parallel = 1 .. cores (its default
  slices of about 1 MiB of rows, and one block a process: ``grainsize=rows``), and the
  machine's ceiling at each n: PyMC's own function on rows/n in n independent processes
  at once (one per core), the slowest's time; in interleaved rounds (``--rounds``),
  each series with its median over rounds, its 99th percentile over every call and
  every round's median; and per model the break-even row count at each n, against PyMC
  at one BLAS thread and at its defaults (from the sweep, interpolated in log rows);
- **chains x processes layouts** (only with ``--layouts``, e.g. ``1x16,2x8,4x4``, or
  ``--layouts fill``: those that fill the machine), at every ``--sample-rows``, with
  PyMC's default chains (or the first ``--chains``): ``pm.sample`` with PyMC's defaults,
  its own NUTS at one BLAS thread (chains one after another) and with its chains at
  once, and ``synkhronos.pymc.sample(divide=True)`` in each layout, the default layout
  marked; wall and sampling-loop seconds, posterior means checked against the
  one-thread run (max gap in MCSE).

The machine's load average is recorded next to every figure: on a busy machine, rerun.
Prints JSON; ``--out DIR`` also writes DIR/pymc_sampling.json and DIR/pymc_sampling.png
(per-evaluation speed-ups, and per model the wall-time ESS/s by rows, a line per
sampler: solid at the first ``--chains``, dashed at the others, crosses for busy runs).

    python benchmarks/pymc_sampling.py [--quick] [--out docs/figures]
    python benchmarks/pymc_sampling.py --no-evaluations --rounds 3 --busy \
        --out docs/figures                      # the peers comparison, 10^3 .. 10^6 rows
    python benchmarks/pymc_sampling.py --no-evaluations --sample-rows 1000 --draws 50 \
        --tune 50 --rounds 1 --chains 1         # seconds: a check that it runs
    python benchmarks/pymc_sampling.py --models logistic --rows 1000000 --no-sampling \
        --sizes 1,2,4,8,16
    python benchmarks/pymc_sampling.py --no-evaluations --no-peers --sample-rows 1000000 \
        --layouts 1x16,2x8,4x4,4x1
    python benchmarks/pymc_sampling.py --many-cores --out docs/figures   # 16 cores

``--many-cores`` is the configuration for a 16-core machine (``device_check.py``'s
``pymc_peers`` part): both models at 10^6 rows, 4 chains, ``synkhronos.pymc.sample``
as 4 chains x 4 processes (``divide=True``) against numpyro (its 4 chains at once on 4
XLA host devices, XLA free to use its threads), nutpie and PyMC's NUTS (``cores=4``),
minimum bulk ESS per second of wall time. ``--cores`` and ``--processes-per-chain``
set those for any run.

``--sizes`` lists the n_parallel to run (default 1 .. ``--max-n``); ``--no-sampling``
measures the evaluations only (``benchmarks/device_check.py`` uses both).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import logging
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import xarray as xr
from threadpoolctl import threadpool_limits

import synkhronos as synk
import synkhronos.pymc as synk_pymc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402


# -- the models, as a PyMC user writes them ----------------------------------------------------
def logistic(rows: int, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 10))
    beta = rng.normal(scale=0.5, size=10)
    y = (rng.random(rows) < 1 / (1 + np.exp(-(x @ beta - 0.5)))).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("beta", 0, 1, shape=10)
        a = pm.Normal("intercept", 0, 2)
        pm.Bernoulli("y", logit_p=a + x @ b, observed=y)
    return model


def hierarchical(rows: int, seed: int = 0, groups: int = 100) -> pm.Model:
    rng = np.random.default_rng(seed)
    group = rng.integers(groups, size=rows)
    x = rng.normal(size=(rows, 5))
    y = (rng.normal(1.0, 0.5, size=groups)[group] + x @ rng.normal(size=5)
         + rng.normal(scale=0.8, size=rows))
    with pm.Model(coords={"group": range(groups)}) as model:
        mu_a = pm.Normal("mu_a", 0, 2)
        sigma_a = pm.HalfNormal("sigma_a", 1)
        a = pm.Normal("a", mu_a, sigma_a, dims="group")
        b = pm.Normal("beta", 0, 1, shape=5)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a[group] + x @ b, sigma, observed=y)
    return model


MODELS = {"logistic": logistic, "hierarchical": hierarchical}


# -- measuring ------------------------------------------------------------------------------------
load = _harness.load


def machine() -> dict:
    return _harness.machine(
        cores=len(os.sched_getaffinity(0)), pytensor=pytensor.__version__,
        pymc=pm.__version__,
        pytensor_linker=type(pytensor.compile.mode.get_mode(None).linker).__name__)


# Before timing a function: calls until this long has passed (at least 2, at most 200).
# A function just built runs its first tens of calls slower: synkhronos.pymc's, at 10^4
# rows and two processes, from 48 us (second call) to a steady 33 us by the thirtieth,
# where PyMC's own function, built once and called in every round, is always warm. A
# sampler makes thousands of calls: the steady figure is the one that counts.
WARM_UP_S = 0.05
WARM_UP_CALLS = 200


def call_times(fn, points: list[np.ndarray], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` ``fn(point)`` calls, after warming up
    (``WARM_UP_S``)."""
    fn(points[0])
    warm_until = time.perf_counter() + WARM_UP_S
    for i in range(1, WARM_UP_CALLS):
        fn(points[i % len(points)])
        if time.perf_counter() > warm_until:
            break
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(points[i % len(points)])
        times.append(time.perf_counter() - start)
    return times


def per_call(fn, points: list[np.ndarray], repeats: int) -> float:
    """Median seconds of one ``fn(point)`` call (after warming up)."""
    return statistics.median(call_times(fn, points, repeats))


def points_for(model: pm.Model, count: int = 4) -> list[np.ndarray]:
    size = sum(np.size(v) for v in model.initial_point().values())
    rng = np.random.default_rng(1)
    return [rng.normal(scale=0.1, size=size) for _ in range(count)]


def mcse(draws: xr.DataArray) -> np.ndarray:
    """ArviZ's Monte Carlo standard error of each component's posterior mean (draws
    with ``chain`` and ``draw`` dimensions), flattened."""
    return az.mcse(xr.Dataset({"draws": draws}), method="mean")["draws"].values.ravel()


def posterior_summary(idata) -> dict:
    """Per variable of the posterior: its components' means and MCSEs (flattened)."""
    posterior = idata.posterior
    return {name: {"mean": posterior[name].values.mean(axis=(0, 1)).ravel().tolist(),
                   "mcse": mcse(posterior[name]).tolist()}
            for name in posterior.data_vars}


def summary_gap(got: dict, want: dict) -> float:
    """The largest gap between two posteriors' means (``posterior_summary``), in units
    of their combined MCSE."""
    worst = 0.0
    for name in want:
        gap = np.abs(np.subtract(got[name]["mean"], want[name]["mean"]))
        error = np.hypot(got[name]["mcse"], want[name]["mcse"])
        worst = max(worst, float(np.max(gap / error)))
    return round(worst, 3)


def mcse_gap(got, want) -> float:
    return summary_gap(posterior_summary(got), posterior_summary(want))


def _part_timer(model: pm.Model, core: int, repeats: int, barrier, results) -> None:
    """In a forked process: PyMC's own function on its part of the rows, pinned to
    ``core`` at one BLAS thread, timed once every process is ready."""
    os.sched_setaffinity(0, {core})
    with threadpool_limits(limits=1):
        fn = model.logp_dlogp_function(ravel_inputs=True)
        fn.set_extra_values({})
        points = points_for(model)
        fn(points[0])
        barrier.wait()
        results.put(per_call(fn, points, repeats))


def ceiling(make, rows: int, n: int, repeats: int) -> float:
    """The machine's ceiling for n processes: PyMC's own function on rows/n in n
    independent processes at once (one per core, one BLAS thread each); the median
    seconds per call of the slowest, as a synchronous evaluation waits for it."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    part = make(rows // n)
    barrier, results = context.Barrier(n), context.Queue()
    cores = sorted(os.sched_getaffinity(0))
    workers = [context.Process(target=_part_timer,
                               args=(part, cores[k % len(cores)], repeats, barrier, results))
               for k in range(n)]
    for worker in workers:
        worker.start()
    times = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    return max(times)


def evaluations(model: pm.Model, make, rows: int, sizes: list[int], repeats: int,
                rounds: int) -> dict:
    """Per-evaluation logp + gradient seconds: PyMC's function (one BLAS thread and its
    default threads), the machine's ceiling (PyMC's function on rows/n in n processes at
    once) and synkhronos at each n, in ``rounds`` interleaved rounds.

    Each series keeps every round's median (``every_round``), the median over rounds
    and the 99th percentile over every call of every round (``p99_s``); the ratios are
    each round's own, their median over rounds. The load average is recorded at every
    round."""
    points = points_for(model)
    serial = model.logp_dlogp_function(ravel_inputs=True)
    serial.set_extra_values({})
    record: dict = {"rows": rows, "load_before": load(), "load_per_round": []}
    series: dict = {"pymc_1_thread_s": [], "pymc_default_threads_s": []}
    for n in sizes:
        series[f"synkhronos_n{n}_s"] = []
        series[f"synkhronos_one_block_n{n}_s"] = []  # grainsize=rows: one slice a process
        if n > 1:
            series[f"ceiling_n{n}_s"] = []
    calls: dict = {key: [] for key in series}  # every call's seconds, for the p99

    def timed(key: str, fn) -> None:
        times = call_times(fn, points, repeats)
        calls[key] += times
        series[key].append(statistics.median(times))

    for _ in range(rounds):
        record["load_per_round"].append(load())
        with threadpool_limits(limits=1):
            timed("pymc_1_thread_s", serial)
        timed("pymc_default_threads_s", serial)
        for n in sizes:
            if n > 1:
                series[f"ceiling_n{n}_s"].append(ceiling(make, rows, n, repeats))
            synk.fork(n)
            try:
                for grainsize, key in ((None, f"synkhronos_n{n}_s"),
                                       (rows, f"synkhronos_one_block_n{n}_s")):
                    fn = synk_pymc.logp_dlogp_function(model, grainsize=grainsize)
                    fn.set_extra_values({})
                    timed(key, fn)
                    del fn
            finally:
                synk.close()
    del serial
    median = statistics.median

    def by_n(prefix: str, values: dict) -> dict:
        return {str(n): values[f"{prefix}_n{n}_s"] for n in sizes
                if f"{prefix}_n{n}_s" in values}

    medians = {key: median(times) for key, times in series.items()}
    p99 = {key: float(np.percentile(times, 99)) for key, times in calls.items() if times}
    record["pymc_1_thread_s"] = medians["pymc_1_thread_s"]
    record["pymc_default_threads_s"] = medians["pymc_default_threads_s"]
    record["ceiling_s"] = by_n("ceiling", medians)
    record["synkhronos_s"] = by_n("synkhronos", medians)
    record["synkhronos_one_block_s"] = by_n("synkhronos_one_block", medians)
    record["p99_s"] = {"pymc_1_thread_s": p99["pymc_1_thread_s"],
                       "pymc_default_threads_s": p99["pymc_default_threads_s"],
                       "synkhronos_s": by_n("synkhronos", p99),
                       "synkhronos_one_block_s": by_n("synkhronos_one_block", p99)}
    record["every_round"] = {"pymc_1_thread_s": series["pymc_1_thread_s"],
                             "pymc_default_threads_s": series["pymc_default_threads_s"],
                             "ceiling_s": by_n("ceiling", series),
                             "synkhronos_s": by_n("synkhronos", series),
                             "synkhronos_one_block_s": by_n("synkhronos_one_block", series)}
    record["load_after"] = load()

    def ratios(base: list[float], times: dict) -> dict:
        """Per n, the median over rounds of base / time, each ratio within a round."""
        return {n: round(median([a / b for a, b in zip(base, t, strict=True)]), 3)
                for n, t in times.items()}

    one, default = series["pymc_1_thread_s"], series["pymc_default_threads_s"]
    synks, ceilings = by_n("synkhronos", series), by_n("ceiling", series)
    record["speedup_vs_pymc_1_thread"] = ratios(one, synks)
    record["one_block_speedup_vs_pymc_1_thread"] = ratios(one, by_n("synkhronos_one_block",
                                                                    series))
    record["ceiling_speedup_vs_pymc_1_thread"] = ratios(one, ceilings)
    record["fraction_of_ceiling"] = {
        n: round(median([c / s for c, s in zip(t, synks[n], strict=True)]), 3)
        for n, t in ceilings.items()}
    record["speedup_vs_pymc_default_threads"] = ratios(default, synks)
    return record


def break_even(records: dict, key: str) -> dict:
    """Per n, the row count from which synkhronos is at least as fast as PyMC (``key``:
    the speed-up series of the ``evaluations`` records, by row count), interpolated
    between the swept sizes in log rows; None if it never is, the smallest size if it
    always is. With the bracketing sizes and their ratios; empty without evaluations."""
    rows = sorted(records, key=int)
    out: dict = {}
    if not rows:  # --no-evaluations
        return out
    for n in records[rows[0]][key]:
        pairs = [(int(r), records[r][key][n]) for r in rows if n in records[r][key]]
        found: dict = {"rows": None, "between": None}
        for i, (r, ratio) in enumerate(pairs):
            if ratio < 1.0:
                continue
            if i == 0:
                found = {"rows": r, "between": [r, r, ratio, ratio]}
            else:
                (r0, q0), (r1, q1) = pairs[i - 1], (r, ratio)
                x = np.log(r0) + (1.0 - q0) / (q1 - q0) * (np.log(r1) - np.log(r0))
                found = {"rows": int(round(float(np.exp(x)))), "between": [r0, r1, q0, q1]}
            break
        out[n] = found
    return out


def sampling_time(idata) -> float | None:
    """PyMC's (or nutpie's) own sampling-loop seconds, kept in the posterior's attrs."""
    value = idata.posterior.attrs.get("sampling_time")
    return None if value is None else float(value)


def computed(idata) -> bool:
    """Waits until every array of ``idata`` is computed, and says whether all were
    when it was called. PyMC 6's blackjax route returns while its sampler still runs
    (JAX's asynchronous dispatch: the InferenceData holds JAX arrays not yet computed),
    so a clock stopped at its return misses the sampling, and the ``sampling_time`` it
    records stops as early."""
    groups = idata.groups() if callable(idata.groups) else idata.groups
    arrays = [var.data for name in groups for var in idata[name].data_vars.values()]
    ready = all(getattr(array, "is_ready", lambda: True)() for array in arrays)
    for array in arrays:
        np.asarray(array)
    return ready


def layouts_for(cores: int, chains: int) -> list[tuple[int, int]]:
    """The chains x processes layouts that fill the machine: each number of chains at
    once that divides ``chains`` (no round half empty), up to the cores, with the cores
    divided among them."""
    return [(running, cores // running) for running in range(1, min(chains, cores) + 1)
            if chains % running == 0]


def default_layout(cores: int, chains: int) -> tuple[int, int]:
    """What ``synkhronos.pymc.sample`` chooses without ``cores`` and
    ``processes_per_chain`` (docs/likelihoods.rst): PyMC's default ``cores`` (half the
    logical CPUs, at most 4), at most ``chains`` and the usable cores, and the usable
    cores divided among them."""
    running = max(1, min(4, (os.cpu_count() or 2) // 2, chains, cores))
    return running, max(1, cores // running)


def layout_runs(model: pm.Model, layouts: list[tuple[int, int]] | None, options: dict) -> dict:
    """Whole sampling runs: PyMC at one BLAS thread (chains one after another, the peer
    the posteriors are compared with), PyMC's defaults (its default sampler -- nutpie on
    PyMC 6 where it is installed -- chains and cores), PyMC's NUTS with its chains at
    once, and ``synkhronos.pymc.sample`` in each chains x processes layout, always
    divided (``divide=True`` where it takes it: a layout is what is measured), each
    without a session of the user (as a PyMC user calls it). ``layouts``: ``(chains at once,
    processes per chain)`` pairs (default: ``layouts_for`` the machine)."""
    cores = len(os.sched_getaffinity(0))
    record: dict = {"load_before": load(), "options": dict(options), "wall_s": {},
                    "sampling_loop_s": {}, "mcse_gap_vs_pymc_1_thread": {}}

    def run(label, call):
        start = time.perf_counter()
        idata = call()
        ready = computed(idata)
        record["wall_s"][label] = round(time.perf_counter() - start, 3)
        record["sampling_loop_s"][label] = sampling_time(idata) if ready else None
        if not ready:  # as in peer_run: PyMC's figure, which stopped at the return
            record.setdefault("sampling_time_stopped_at_return", {})[label] = (
                sampling_time(idata))
        record.setdefault("load", {})[label] = load()
        return idata

    # PyMC's defaults first: its chains, unless --chains named them, are everyone's.
    defaults = {k: v for k, v in options.items() if v is not None}
    default = run("pymc_defaults", lambda: pm.sample(model=model, **defaults))
    record["pymc_defaults_sampler"] = default.posterior.attrs.get("inference_library")
    chains = int(default.posterior.sizes["chain"])
    options = dict(options, chains=chains)
    record["chains"] = chains
    with threadpool_limits(limits=1):
        peer = run("pymc_1_thread", lambda: pm.sample(
            model=model, nuts_sampler="pymc", cores=1, **options))
    record["mcse_gap_vs_pymc_1_thread"]["pymc_defaults"] = mcse_gap(default, peer)
    at_once = min(chains, cores)
    if at_once > 1:
        label = f"pymc_nuts_{at_once}_at_once"
        got = run(label, lambda: pm.sample(model=model, nuts_sampler="pymc", cores=at_once,
                                           **options))
        record["mcse_gap_vs_pymc_1_thread"][label] = mcse_gap(got, peer)
    if layouts is None:
        layouts = layouts_for(cores, chains)
    record["layouts"] = [f"{running}x{processes}" for running, processes in layouts]
    running, processes = default_layout(cores, chains)
    record["synkhronos_default_layout"] = f"{running}x{processes}"
    divided = {"divide": True} if takes_divide() else {}
    for running, processes in layouts:
        label = f"synkhronos_{running}x{processes}"
        got = run(label, lambda r=running, p=processes: synk_pymc.sample(
            model=model, cores=r, processes_per_chain=p, **divided, **options))
        record["mcse_gap_vs_pymc_1_thread"][label] = mcse_gap(got, peer)
    for kind in ("wall_s", "sampling_loop_s"):
        times = record[kind]
        record[f"speedup_{kind}_vs_pymc_1_thread"] = {
            label: round(times["pymc_1_thread"] / t, 3) for label, t in times.items() if t}
        record[f"speedup_{kind}_vs_pymc_defaults"] = {
            label: round(times["pymc_defaults"] / t, 3) for label, t in times.items() if t}
    return record


# -- against the peers: effective draws a second --------------------------------------------------
# The samplers compared (their labels): synkhronos.pymc.sample choosing by measurement
# whether to divide (its default), always dividing, always dividing with nutpie's,
# numpyro's or blackjax's NUTS driving it (nuts_sampler=...), and the NUTS samplers
# pm.sample offers.
SYNKHRONOS = ("synkhronos", "synkhronos_divide", "synkhronos_nutpie", "synkhronos_numpyro",
              "synkhronos_blackjax")
PEERS = ("pymc", "nutpie", "numpyro", "blackjax")
SAMPLERS = SYNKHRONOS + PEERS
# What each sampler's own sampling_time covers (``ess_per_s_sampling`` divides by it).
SAMPLING_TIME_COVERS = {
    "synkhronos": "pm.sample's loop over tuning and draws, driving the divided "
                  "function (or PyMC's own, where synkhronos chose not to divide); "
                  "measuring, forking and building before it are excluded",
    "synkhronos_divide": "pm.sample's loop over tuning and draws, driving the divided "
                         "function; forking and building before it are excluded",
    "synkhronos_nutpie": "the nutpie.sample call (tuning and draws) over the divided "
                         "function; forking and building before it are excluded",
    "synkhronos_numpyro": "PyMC's sample_jax_nuts around numpyro's sampler, its "
                          "log-density a callback into the divided function; forking "
                          "and building before it are excluded",
    "synkhronos_blackjax": "PyMC's sample_jax_nuts around blackjax's sampler, its "
                           "log-density a callback into the divided function; forking "
                           "and building before it are excluded. PyMC 6 stops this "
                           "clock once the sampler is dispatched, with chains at once "
                           "before it ends (sample waits for it after): compare wall "
                           "times",
    "pymc": "PyMC's loop over tuning and draws, after compiling and initialisation",
    "nutpie": "the nutpie.sample call (tuning and draws), after nutpie.compile_pymc_model",
    "numpyro": "PyMC's sample_jax_nuts around numpyro's sampler: JAX's compiling of the "
               "sampler is included, the model's conversion to JAX is not",
    "blackjax": "PyMC's sample_jax_nuts around blackjax's sampler: JAX's compiling of the "
                "sampler is included, the model's conversion to JAX is not. PyMC 6 "
                "stops this clock before the sampler ends (then null: the run's "
                "sampling_time_stopped_at_return)",
}
# The sampler library each synkhronos label drives (pm.sample's nuts_sampler).
DRIVES = {"synkhronos_nutpie": "nutpie", "synkhronos_numpyro": "numpyro",
          "synkhronos_blackjax": "blackjax"}
# Rows from which --large-draws / --large-tune apply.
LARGE_ROWS = 1_000_000
# The busy core: a process spinning a pure-Python loop for as long as it lives.
SPIN = "while True:\n    pass\n"


def takes_divide() -> bool:
    """Whether this synkhronos.pymc.sample takes ``divide`` (earlier revisions always
    divided)."""
    return "divide" in inspect.signature(synk_pymc.sample).parameters


def unavailable(sampler: str) -> str | None:
    """Why ``sampler`` cannot run here, or None."""
    if sampler in DRIVES and importlib.util.find_spec(DRIVES[sampler]) is None:
        return f"{DRIVES[sampler]} is not installed (PyMC {pm.__version__})"
    if sampler in SYNKHRONOS:
        return None if takes_divide() else (
            "this synkhronos.pymc.sample takes no divide= (an earlier revision: it always "
            "divides)")
    if sampler == "pymc":
        return None
    if importlib.util.find_spec(sampler) is None:
        return f"{sampler} is not installed (PyMC {pm.__version__})"
    return None


def call_for(sampler: str, model: pm.Model, options: dict):
    """The call of ``sampler`` on ``model`` as its user would make it
    (``processes_per_chain``, where ``options`` has it, for synkhronos alone)."""
    options = dict(options)
    per_chain = options.pop("processes_per_chain", None)
    if sampler in SYNKHRONOS and per_chain is not None:
        options["processes_per_chain"] = per_chain
    if sampler == "synkhronos":
        return lambda: synk_pymc.sample(model=model, **options)
    if sampler == "synkhronos_divide":
        return lambda: synk_pymc.sample(model=model, divide=True, **options)
    if sampler in DRIVES:
        return lambda: synk_pymc.sample(model=model, divide=True,
                                        nuts_sampler=DRIVES[sampler], **options)
    return lambda: pm.sample(model=model, nuts_sampler=sampler, **options)


def min_bulk_ess(idata) -> float:
    """ArviZ's bulk ESS of every scalar of the posterior, the smallest."""
    posterior = idata.posterior
    draws = xr.Dataset({name: posterior[name] for name in posterior.data_vars})
    ess = az.ess(draws, method="bulk")
    return float(min(np.min(ess[name].values) for name in ess.data_vars))


def divergences(idata) -> int | None:
    stats = getattr(idata, "sample_stats", None)
    if stats is None or "diverging" not in stats:
        return None
    return int(stats["diverging"].values.sum())


class SynkLines(logging.Handler):
    """Keeps the ``"synkhronos.pymc:"`` INFO lines of logger ``"synkhronos"`` while
    attached (``with SynkLines() as lines``): what ``sample`` measured and chose."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._logger = logging.getLogger("synkhronos")
        self._level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("synkhronos.pymc:"):
            self.lines.append(message)

    def __enter__(self) -> SynkLines:
        self._logger.addHandler(self)
        self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def chosen(lines: list[str]) -> str:
    """What synkhronos's log lines say it chose: "divided" or "not divided" (on the
    nutpie route, with what nutpie sampled: "over PyMC's function" or "pm.sample")."""
    over = [line for line in lines if "not divided, " in line]
    if over:
        return ("not divided, over PyMC's function" if "nutpie over PyMC's" in over[-1]
                else "not divided, pm.sample")
    for line in reversed(lines):  # the last choice stands (measured after building)
        if "measured," in line or "before forking," in line:
            return "not divided" if "(not divided)" in line else "divided"
    if any(" divided over " in line for line in lines):
        return "divided"  # divide=True: built without a choice
    return "not divided (nothing logged: nothing to divide at one process)"


class BusyCore:
    """One core kept busy (``with BusyCore():``): a separate process spinning a
    pure-Python loop, started on entry and killed on exit; ``cpu_s``: the CPU seconds
    it used (from /proc), the check that it spun."""

    def __init__(self) -> None:
        self.cpu_s: float | None = None

    def __enter__(self) -> BusyCore:
        self._process = subprocess.Popen([sys.executable, "-c", SPIN])
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{self._process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            self.cpu_s = round((int(fields[11]) + int(fields[12]))
                               / os.sysconf("SC_CLK_TCK"), 2)
        self._process.kill()
        self._process.wait()


def peer_run(sampler: str, model: pm.Model, options: dict, busy: bool) -> tuple[dict, object]:
    """One timed run of ``sampler``: its figures, and its draws (None if it failed)."""
    record: dict = {"sampler": sampler, "chains": options["chains"], "busy": busy,
                    "load_before": load()}
    spinner = BusyCore() if busy else None
    idata = None
    with SynkLines() as lines:
        try:
            with spinner or contextlib.nullcontext():
                start = time.perf_counter()
                idata = call_for(sampler, model, options)()
                ready = computed(idata)
                wall = time.perf_counter() - start
        except Exception as exc:  # a peer's failure is a figure to record, not the end
            record["error"] = f"{type(exc).__name__}: {exc}"
    record["load_after"] = load()
    if spinner is not None:
        record["busy_cpu_s"] = spinner.cpu_s
    if sampler in SYNKHRONOS:
        record["log"] = lines.lines
    if idata is None:
        return record, None
    if sampler in SYNKHRONOS:
        record["chose"] = chosen(lines.lines)
    ess = min_bulk_ess(idata)
    sampling_s = sampling_time(idata)
    if not ready:
        record["sampling_time_stopped_at_return"] = sampling_s
        sampling_s = None  # (the sampler's clock stopped before its work ended)
    record.update(
        wall_s=round(wall, 3), sampling_s=None if sampling_s is None else round(sampling_s, 3),
        min_bulk_ess=round(ess, 1), ess_per_s_wall=round(ess / wall, 3),
        ess_per_s_sampling=None if not sampling_s else round(ess / sampling_s, 3),
        divergences=divergences(idata),
        inference_library=idata.posterior.attrs.get("inference_library"))
    return record, idata


def _run_in_child(send, model_name: str, rows: int, sampler: str, options: dict,
                  busy: bool) -> None:
    """In a process of its own: the model built, one ``peer_run``, its record and
    posterior summary sent back. numpyro's chains at once need as many XLA host
    devices (``XLA_FLAGS``, read when JAX starts: here, before any import of it)."""
    if sampler.endswith("numpyro") and options.get("cores", 1) > 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_"
                                   f"platform_device_count={options['chains']}").strip()
    record, idata = peer_run(sampler, MODELS[model_name](rows), options, busy)
    send.send((record, None if idata is None else posterior_summary(idata)))
    send.close()


def isolated_run(model_name: str, rows: int, sampler: str, options: dict,
                 busy: bool) -> tuple[dict, dict | None]:
    """``peer_run`` in a fresh process (spawned), as a user's script runs it: numpyro
    initialises JAX, after which no process may fork (synkhronos would refuse), and no
    sampler finds another's compiled functions in memory. Returns the run's record and
    its posterior summary (None if it failed)."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_run_in_child,
                            args=(send, model_name, rows, sampler, options, busy))
    child.start()
    send.close()
    try:
        record, summary = receive.recv()
    except EOFError:
        record = {"sampler": sampler, "chains": options["chains"], "busy": busy,
                  "load_before": None, "load_after": load(), "log": [],
                  "error": "its process ended without a result"}
        summary = None
    child.join()
    if "error" in record:
        record["error"] += f" (exit code {child.exitcode})" if child.exitcode else ""
        print(f"{sampler} failed: {record['error']}", file=sys.stderr)
    return record, summary


def peer_runs(model_name: str, rows: int, samplers: list[str], chains: list[int],
              busy: list[bool], rounds: int, options: dict, seed: int) -> dict:
    """Every sampler x chains x busy run on the model once per round, each in its own
    process, in a random order per round; posterior means compared with
    ``pm.sample``'s of the same round, chains and busy (max gap in MCSE), where it
    ran."""
    order = random.Random(seed)
    runs: list[dict] = []
    record: dict = {"rows": rows, "options": dict(options), "orders": [], "runs": runs}
    configs = [(s, c, b) for s in samplers for c in chains for b in busy]
    for round_ in range(rounds):
        order.shuffle(configs)
        record["orders"].append([f"{s} chains={c}{' busy' if b else ''}"
                                 for s, c, b in configs])
        got: dict = {}
        for sampler, n_chains, on in configs:
            run, summary = isolated_run(
                model_name, rows, sampler,
                dict(options, chains=n_chains, random_seed=options["random_seed"] + round_),
                on)
            run["round"] = round_
            runs.append(run)
            got[sampler, n_chains, on] = (run, summary)
        for (sampler, n_chains, on), (run, summary) in got.items():
            peer = got.get(("pymc", n_chains, on), (None, None))[1]
            if summary is not None and peer is not None and sampler != "pymc":
                run["mcse_gap_vs_pymc"] = summary_gap(summary, peer)
    return record


def headline(model_name: str, record: dict, samplers: list[str], chains: list[int],
             busy: list[bool]) -> list[dict]:
    """Per chains x busy: each sampler's median ESS/s over rounds (wall, sampling), the
    best peer's, synkhronos's ratio to it (the median over rounds of each round's ratio
    beside the ratio of the medians) and what synkhronos chose in each round."""
    entries = []
    for n_chains in chains:
        for on in busy:
            runs = [r for r in record["runs"] if r["chains"] == n_chains and r["busy"] == on]
            entry: dict = {"model": model_name, "rows": record["rows"], "chains": n_chains,
                           "busy": on, "draws": record["options"]["draws"],
                           "tune": record["options"]["tune"]}
            for kind in ("wall", "sampling"):
                key = f"ess_per_s_{kind}"
                per_round: dict = {}
                for run in runs:
                    if run.get(key) is not None:
                        per_round.setdefault(run["sampler"], {})[run["round"]] = run[key]
                medians = {s: round(statistics.median(v.values()), 3)
                           for s, v in per_round.items()}
                entry[key] = {s: medians.get(s) for s in samplers}
                peers = {s: m for s, m in medians.items() if s in PEERS}
                best = max(peers, key=peers.__getitem__) if peers else None
                entry[f"best_peer_{kind}"] = best
                ratios: dict = {}
                for synk_label in SYNKHRONOS:
                    if best is None or synk_label not in medians:
                        continue
                    rounds_ratio = [
                        value / max(per_round[p][r] for p in peers if r in per_round[p])
                        for r, value in per_round[synk_label].items()
                        if any(r in per_round[p] for p in peers)]
                    ratios[synk_label] = {
                        "of_medians": round(medians[synk_label] / medians[best], 3),
                        "median_of_rounds": round(statistics.median(rounds_ratio), 3)
                        if rounds_ratio else None}
                entry[f"synkhronos_over_best_peer_{kind}"] = ratios
            entry["synkhronos_chose"] = {
                s: [r["chose"] for r in runs if r["sampler"] == s] for s in SYNKHRONOS
                if s in samplers}
            entry["synkhronos_log"] = {
                s: [r["log"] for r in runs if r["sampler"] == s] for s in SYNKHRONOS
                if s in samplers}
            entry["failed"] = {r["sampler"]: r["error"] for r in runs if "error" in r}
            entry["load_per_run"] = [[r["sampler"], r["load_before"][0]] for r in runs]
            entries.append(entry)
    return entries


# -- the figure -----------------------------------------------------------------------------------
def draw(report: dict, path: Path) -> None:
    """The per-evaluation speed-ups (where measured) and, per model, the wall-time ESS/s
    by rows, a line per sampler (solid: the first --chains, dashed: the others; crosses:
    with a busy core)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    with_evaluations = any(result["evaluations"] for result in models.values())
    with_peers = [name for name, result in models.items() if result.get("peers")]
    panels = int(with_evaluations) + len(with_peers)
    if not panels:
        return
    # the ESS panels keep their legend on their right: 5 samplers x chains x busy lines
    widths = [5.5] * int(with_evaluations) + [8.0] * len(with_peers)
    fig, axes = plt.subplots(1, panels, figsize=(sum(widths), 4.6), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    axes = list(axes[0])
    if with_evaluations:
        left = axes.pop(0)
        for name, result in models.items():
            for rows, record in result["evaluations"].items():
                speedups = record["speedup_vs_pymc_1_thread"]
                left.plot([int(n) for n in speedups], list(speedups.values()), marker="o",
                          label=f"{name}, {rows} rows")
                color = left.lines[-1].get_color()
                blocks = record.get("one_block_speedup_vs_pymc_1_thread", {})
                if blocks:
                    left.plot([int(n) for n in blocks], list(blocks.values()), marker=".",
                              linestyle="-.", color=color, linewidth=1)
                ceilings = record.get("ceiling_speedup_vs_pymc_1_thread", {})
                if ceilings:
                    left.plot([1] + [int(n) for n in ceilings], [1.0, *ceilings.values()],
                              linestyle="--", color=color, linewidth=1)
                left.axhline(record["pymc_1_thread_s"] / record["pymc_default_threads_s"],
                             linestyle=":", color=color, linewidth=1)
        left.set_xticks(report["settings"]["n_parallel"])
        left.axhline(1, color="grey", linewidth=0.8)
        left.set_xlabel("processes (n_parallel)")
        left.set_ylabel("speed-up over PyMC at one BLAS thread")
        left.set_title("logp + gradient, one evaluation (dash-dot: one block a process;\n"
                       "dashed: the ceiling, n PyMC programs on rows/n at once;\n"
                       "dotted: PyMC at its default threads)", fontsize=9)
        left.legend(fontsize=8)
    colors = {s: f"C{k}" for k, s in enumerate(SAMPLERS)}
    chains = report["settings"]["chains"]
    for axis, name in zip(axes, with_peers, strict=True):
        entries = report["headline"][name]
        for sampler in SAMPLERS:
            for n_chains in chains:
                for on in (False, True):
                    points = sorted((e["rows"], e["ess_per_s_wall"].get(sampler))
                                    for e in entries
                                    if e["chains"] == n_chains and e["busy"] == on
                                    and e["ess_per_s_wall"].get(sampler))
                    if not points:
                        continue
                    label = f"{sampler}, {n_chains} chain{'s' if n_chains > 1 else ''}"
                    axis.plot(*zip(*points, strict=True), color=colors[sampler],
                              marker="x" if on else "o", alpha=0.6 if on else 1.0,
                              linestyle="-" if n_chains == chains[0] else "--",
                              label=label + (", busy core" if on else ""))
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("rows")
        axis.set_ylabel("minimum bulk ESS per second of wall time")
        axis.set_title(f"{name}: whole sampling, compiling included", fontsize=9)
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    m = report["machine"]
    fig.suptitle(f"synkhronos.pymc vs PyMC {m['pymc']} (PyTensor {m['pytensor']}), "
                 f"{m['cores']} cores, load {report['load_at_start']} at start", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draws_for(rows: int, args: argparse.Namespace) -> tuple[int, int]:
    """Draws and tuning of a whole-sampling run at ``rows``."""
    if rows >= LARGE_ROWS:
        return args.large_draws, args.large_tune
    return args.draws, args.tune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="20,000 rows, short chains: a check that it runs, not figures")
    parser.add_argument("--rows", type=int, nargs="+", default=None,
                        help="rows of the per-evaluation sweep (10^3 .. 10^6)")
    parser.add_argument("--sample-rows", type=int, nargs="+", default=None,
                        help="rows of whole sampling (10^3 .. 10^6)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--max-n", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--draws", type=int, default=None,
                        help="draws of whole sampling below 10^6 rows (1000)")
    parser.add_argument("--tune", type=int, default=None,
                        help="tuning of whole sampling below 10^6 rows (1000)")
    parser.add_argument("--large-draws", type=int, default=None,
                        help="draws of whole sampling from 10^6 rows (200)")
    parser.add_argument("--large-tune", type=int, default=None,
                        help="tuning of whole sampling from 10^6 rows (200)")
    parser.add_argument("--chains", type=int, nargs="+", default=None,
                        help="chains of the peers comparison (2 1); the first is the "
                        "layouts' (default there: PyMC's default chains)")
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS,
                        help="the samplers of the peers comparison (all)")
    parser.add_argument("--busy", nargs="?", const="both", default="off",
                        choices=("off", "on", "both"),
                        help="runs with one busy core beside them: off (default), on "
                        "(only those), both (--busy alone: idle and busy runs)")
    parser.add_argument("--layouts", default=None,
                        help="comma-separated chains-at-once x processes-per-chain layouts "
                        "of synkhronos.pymc.sample, e.g. 1x16,2x8,4x4, or 'fill' (those "
                        "that fill the machine): compare them (not run without)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds of the per-evaluation figures and of the "
                        "peers comparison (3)")
    parser.add_argument("--seed", type=int, default=3,
                        help="the samplers' seed (plus the round) and the orders' seed")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sizes", default=None,
                        help="comma-separated n_parallel to run (default 1 .. --max-n)")
    parser.add_argument("--no-sampling", action="store_true",
                        help="per-evaluation figures only, no whole sampling")
    parser.add_argument("--no-peers", action="store_true",
                        help="no comparison with the peers (with --layouts: the layouts only)")
    parser.add_argument("--no-evaluations", action="store_true",
                        help="whole sampling only, no per-evaluation figures")
    parser.add_argument("--cores", type=int, default=None,
                        help="pm.sample's cores (chains at once) for every sampler of the "
                        "peers comparison (default: each one's own)")
    parser.add_argument("--processes-per-chain", type=int, default=None,
                        help="synkhronos.pymc.sample's processes_per_chain in the peers "
                        "comparison (default: its own)")
    parser.add_argument("--many-cores", action="store_true",
                        help="the 16-core configuration (the GPU machine's): both models "
                        "at 10^6 rows, 4 chains, synkhronos 4 x 4 processes (divide=True, "
                        "PyMC's NUTS) against numpyro (4 chains at once, XLA free to use "
                        "its threads), nutpie and PyMC's NUTS, one round, sampling only; "
                        "the options above still apply where given")
    args = parser.parse_args()
    if args.many_cores:
        args.no_evaluations = True
        args.sample_rows = args.sample_rows or [1_000_000]
        args.chains = args.chains or [4]
        args.cores = args.cores or 4
        args.processes_per_chain = args.processes_per_chain or 4
        args.rounds = args.rounds or 1
        if args.samplers == list(SAMPLERS):
            args.samplers = ["synkhronos_divide", "numpyro", "nutpie", "pymc"]
    decades = [1_000, 10_000, 100_000, 1_000_000]
    rows = [] if args.no_evaluations else (args.rows or ([20_000] if args.quick else decades))
    sample_rows = [] if args.no_sampling else (
        args.sample_rows or ([20_000] if args.quick else decades))
    repeats = args.repeats or (5 if args.quick else 30)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.draws = args.draws or (50 if args.quick else 1000)
    args.tune = args.tune or (50 if args.quick else 1000)
    args.large_draws = args.large_draws or (50 if args.quick else 200)
    args.large_tune = args.large_tune or (50 if args.quick else 200)
    chains = args.chains or ([2] if args.quick else [2, 1])
    busy = {"off": [False], "on": [True], "both": [False, True]}[args.busy]
    sizes = (list(range(1, args.max_n + 1)) if args.sizes is None
             else sorted({int(v) for v in args.sizes.split(",")}))
    if sizes[0] < 1:
        parser.error(f"--sizes must list positive integers; got {args.sizes!r}")
    if min(chains) < 1:
        parser.error(f"--chains must list positive integers; got {chains}")
    layouts = None
    if args.layouts not in (None, "fill"):
        layouts = [tuple(int(v) for v in item.split("x")) for item in args.layouts.split(",")]
    common = dict(random_seed=args.seed, progressbar=False, compute_convergence_checks=False)
    if args.cores is not None:
        common["cores"] = args.cores
    if args.processes_per_chain is not None:
        common["processes_per_chain"] = args.processes_per_chain
    skipped = {s: why for s in args.samplers if (why := unavailable(s)) is not None}
    samplers = [s for s in args.samplers if s not in skipped]
    peers_on = bool(sample_rows) and not args.no_peers
    report: dict = {"benchmark": "pymc_sampling", "machine": machine(),
                    "load_at_start": load(), "quick": args.quick,
                    "settings": {"rows": rows, "sample_rows": sample_rows,
                                 "repeats": repeats, "warm_up_s": WARM_UP_S,
                                 "rounds": args.rounds, "n_parallel": sizes,
                                 "draws_tune": {str(r): draws_for(r, args) for r in sample_rows},
                                 "chains": chains, "busy": busy, "samplers": samplers,
                                 "skipped_samplers": skipped, "layouts": args.layouts,
                                 "sampling_time_covers": {
                                     s: SAMPLING_TIME_COVERS[s] for s in samplers},
                                 "busy_core": "a separate process spinning a pure-Python "
                                 "loop (not pinned), started before each timed call and "
                                 "killed after it", **common},
                    "versions": _harness.versions("pymc", "pytensor", "nutpie", "numpyro",
                                                  "blackjax", "jax", "arviz", "numba"),
                    "models": {}, "headline": {}}
    for name in args.models:
        result: dict = {"evaluations": {}, "peers": {}, "layouts": {}}
        for n_rows in rows:
            model = MODELS[name](n_rows)
            result["evaluations"][str(n_rows)] = evaluations(
                model, MODELS[name], n_rows, sizes, repeats, args.rounds)
            del model
        result["break_even_rows"] = {
            "vs_pymc_1_thread": break_even(result["evaluations"], "speedup_vs_pymc_1_thread"),
            "vs_pymc_default_threads": break_even(result["evaluations"],
                                                  "speedup_vs_pymc_default_threads")}
        report["headline"][name] = []
        for n_rows in sample_rows:
            draws, tune = draws_for(n_rows, args)
            options = dict(common, draws=draws, tune=tune)
            if peers_on:
                record = peer_runs(name, n_rows, samplers, chains, busy, args.rounds,
                                   options, seed=args.seed + n_rows)
                result["peers"][str(n_rows)] = record
                report["headline"][name] += headline(name, record, samplers, chains, busy)
            if args.layouts is not None:
                result["layouts"][str(n_rows)] = {"rows": n_rows, **layout_runs(
                    MODELS[name](n_rows), layouts,
                    {key: value for key, value in options.items()
                     if key not in ("cores", "processes_per_chain")}
                    | {"chains": args.chains and args.chains[0]})}
        report["models"][name] = result
    report["load_at_end"] = load()
    two = str(2 if 2 in sizes else sizes[-1])
    empty: dict = {}
    top = str(max(rows)) if rows else None
    top_sample = str(max(sample_rows)) if sample_rows else None

    def by_default(result: dict, kind: str) -> float | None:
        """A layouts figure of the layout sample() chooses by default."""
        layout = result["layouts"].get(top_sample, empty)
        label = f"synkhronos_{layout.get('synkhronos_default_layout')}"
        return layout.get(kind, empty).get(label)

    report["targets"] = {
        name: {
            "rows": max(rows) if rows else None, "n_parallel": int(two),
            "per_eval_speedup_vs_pymc_1_thread": result["evaluations"].get(top, empty).get(
                "speedup_vs_pymc_1_thread", empty).get(two),
            "per_eval_target": 1.8,
            "per_eval_ceiling_speedup": result["evaluations"].get(top, empty).get(
                "ceiling_speedup_vs_pymc_1_thread", empty).get(two),
            "per_eval_fraction_of_ceiling": result["evaluations"].get(top, empty).get(
                "fraction_of_ceiling", empty).get(two),
            # whole sampling (with --layouts): the layout sample() chooses by default
            "sampling_layout": result["layouts"].get(top_sample, empty).get(
                "synkhronos_default_layout"),
            "sampling_loop_speedup_vs_pymc_1_thread": by_default(
                result, "speedup_sampling_loop_s_vs_pymc_1_thread"),
            "sampling_wall_speedup_vs_pymc_1_thread": by_default(
                result, "speedup_wall_s_vs_pymc_1_thread"),
            "sampling_wall_speedup_vs_pymc_defaults": by_default(
                result, "speedup_wall_s_vs_pymc_defaults"),
            "sampling_target": 1.6,
        }
        for name, result in report["models"].items()
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pymc_sampling.json").write_text(text + "\n")
        draw(report, args.out / "pymc_sampling.png")
        print(f"wrote {args.out / 'pymc_sampling.json'} and .png", file=sys.stderr)


if __name__ == "__main__":
    main()
