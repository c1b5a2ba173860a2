"""PyMC with the likelihood on every core (synkhronos.pymc) against PyMC itself.

Two unmodified PyMC models of a large data set: a logistic regression (10 features) and
a hierarchical GLM (100 groups, 5 features, a Normal likelihood). For each, in one run:

- per evaluation of logp + gradient, swept over 10^3 .. 10^6 rows (``--rows``): PyMC's
  own compiled function (``model.logp_dlogp_function``) at one BLAS thread and at its
  default threads, ``synkhronos.pymc.logp_dlogp_function`` at n_parallel = 1 .. cores
  (its default slices of about 1 MiB of rows, and one block a process:
  ``grainsize=rows``), and the machine's ceiling at each n: PyMC's own function on
  rows/n in n independent processes at once (one per core), the slowest's time; in
  interleaved rounds (``--rounds``), each series with its median over rounds, its 99th
  percentile over every call and every round's median; and per model the break-even
  row count at each n, against PyMC at one BLAS thread and at its defaults (from the
  sweep, interpolated in log rows);
- whole sampling (``--sample-rows`` rows), every run with PyMC's default number of
  chains (or ``--chains``): ``pm.sample`` with PyMC's defaults (its default sampler:
  nutpie on PyMC 6 where it is installed; its cores and BLAS threads), ``pm.sample``'s
  own NUTS at one BLAS thread (chains one after another: the peer) and with its chains
  at once, and ``synkhronos.pymc.sample`` (no session of the user) in each chains x
  processes layout that fills the machine (``--layouts``, e.g. ``1x16,2x8,4x4``), the
  default layout marked; wall time (with compiling and initialisation) and the
  sampler's own sampling-loop time; the posterior means are checked against the peer
  (max gap in MCSE).

Ratios are PyMC's time over synkhronos's (> 1: synkhronos is faster). The machine's
load average is recorded next to every figure: on a busy machine, rerun. Prints JSON;
``--out DIR`` also writes DIR/pymc_sampling.json and DIR/pymc_sampling.png.

    python benchmarks/pymc_sampling.py [--quick] [--out docs/figures]
    python benchmarks/pymc_sampling.py --rows 100000 1000000 --sample-rows 1000000
    python benchmarks/pymc_sampling.py --models logistic --rows 1000000 --no-sampling \
        --sizes 1,2,4,8,16
    python benchmarks/pymc_sampling.py --no-evaluations --sample-rows 1000000 \
        --layouts 1x16,2x8,4x4,4x1

``--sizes`` lists the n_parallel to run (default 1 .. ``--max-n``); ``--no-sampling``
measures the evaluations only (``benchmarks/device_check.py`` uses both).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def mcse_gap(got, want, model: pm.Model) -> float:
    worst = 0.0
    for rv in model.free_RVs:
        a, b = got.posterior[rv.name].values, want.posterior[rv.name].values
        error = np.sqrt(mcse(got.posterior[rv.name]) ** 2 + mcse(want.posterior[rv.name]) ** 2)
        gap = np.abs(a.mean(axis=(0, 1)) - b.mean(axis=(0, 1))).ravel()
        worst = max(worst, float(np.max(gap / error)))
    return round(worst, 3)


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


def samplings(model: pm.Model, layouts: list[tuple[int, int]] | None, options: dict) -> dict:
    """Whole sampling runs: PyMC at one BLAS thread (chains one after another, the peer
    the posteriors are compared with), PyMC's defaults (its default sampler -- nutpie on
    PyMC 6 where it is installed -- chains and cores), PyMC's NUTS with its chains at
    once, and ``synkhronos.pymc.sample`` in each chains x processes layout, each without
    a session of the user (as a PyMC user calls it). ``layouts``: ``(chains at once,
    processes per chain)`` pairs (default: ``layouts_for`` the machine)."""
    cores = len(os.sched_getaffinity(0))
    record: dict = {"load_before": load(), "options": dict(options), "wall_s": {},
                    "sampling_loop_s": {}, "mcse_gap_vs_pymc_1_thread": {}}

    def run(label, call):
        start = time.perf_counter()
        idata = call()
        record["wall_s"][label] = round(time.perf_counter() - start, 3)
        record["sampling_loop_s"][label] = sampling_time(idata)
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
    record["mcse_gap_vs_pymc_1_thread"]["pymc_defaults"] = mcse_gap(default, peer, model)
    at_once = min(chains, cores)
    if at_once > 1:
        label = f"pymc_nuts_{at_once}_at_once"
        got = run(label, lambda: pm.sample(model=model, nuts_sampler="pymc", cores=at_once,
                                           **options))
        record["mcse_gap_vs_pymc_1_thread"][label] = mcse_gap(got, peer, model)
    if layouts is None:
        layouts = layouts_for(cores, chains)
    record["layouts"] = [f"{running}x{processes}" for running, processes in layouts]
    running, processes = default_layout(cores, chains)
    record["synkhronos_default_layout"] = f"{running}x{processes}"
    for running, processes in layouts:
        label = f"synkhronos_{running}x{processes}"
        got = run(label, lambda r=running, p=processes: synk_pymc.sample(
            model=model, cores=r, processes_per_chain=p, **options))
        record["mcse_gap_vs_pymc_1_thread"][label] = mcse_gap(got, peer, model)
    for kind in ("wall_s", "sampling_loop_s"):
        times = record[kind]
        record[f"speedup_{kind}_vs_pymc_1_thread"] = {
            label: round(times["pymc_1_thread"] / t, 3) for label, t in times.items() if t}
        record[f"speedup_{kind}_vs_pymc_defaults"] = {
            label: round(times["pymc_defaults"] / t, 3) for label, t in times.items() if t}
    return record


# -- the figure -----------------------------------------------------------------------------------
def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, result in report["models"].items():
        for rows, record in result["evaluations"].items():
            speedups = record["speedup_vs_pymc_1_thread"]
            ns = [int(n) for n in speedups]
            left.plot(ns, list(speedups.values()), marker="o", label=f"{name}, {rows} rows")
            blocks = record.get("one_block_speedup_vs_pymc_1_thread", {})
            if blocks:
                left.plot([int(n) for n in blocks], list(blocks.values()), marker=".",
                          linestyle="-.", color=left.lines[-1].get_color(), linewidth=1)
            ceilings = record.get("ceiling_speedup_vs_pymc_1_thread", {})
            if ceilings:
                left.plot([1] + [int(n) for n in ceilings], [1.0, *ceilings.values()],
                          linestyle="--", color=left.lines[-1].get_color(), linewidth=1)
            left.axhline(record["pymc_1_thread_s"] / record["pymc_default_threads_s"],
                         linestyle=":", color=left.lines[-1].get_color(), linewidth=1)
        sampling = result.get("sampling")
        if sampling:
            loop = sampling["speedup_sampling_loop_s_vs_pymc_1_thread"]
            labels = [k for k in loop if k != "pymc_1_thread"]
            right.plot(range(len(labels)), [loop.get(k, np.nan) for k in labels], marker="s",
                       label=f"{name}, {sampling['rows']} rows")
            right.set_xticks(range(len(labels)))
            right.set_xticklabels([k.replace("synkhronos_", "synk ").replace("_", " ")
                                   for k in labels], rotation=20)
    left.set_xticks(report["settings"]["n_parallel"])
    left.axhline(1, color="grey", linewidth=0.8)
    right.axhline(1, color="grey", linewidth=0.8)
    left.set_xlabel("processes (n_parallel)")
    left.set_ylabel("speed-up over PyMC at one BLAS thread")
    left.set_title("logp + gradient, one evaluation (dash-dot: one block a process;\n"
                   "dashed: the ceiling, n PyMC programs on rows/n at once;\n"
                   "dotted: PyMC at its default threads)", fontsize=9)
    right.set_ylabel("speed-up over pm.sample at one BLAS thread")
    right.set_title("sampling loop (pm.sample's sampling_time)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    m = report["machine"]
    fig.suptitle(f"synkhronos.pymc vs PyMC {m['pymc']} (PyTensor {m['pytensor']}), "
                 f"{m['cores']} cores, load {report['load_at_start']} at start", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="20,000 rows, short chains: a check that it runs, not figures")
    parser.add_argument("--rows", type=int, nargs="+", default=None)
    parser.add_argument("--sample-rows", type=int, default=None)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--max-n", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--draws", type=int, default=None)
    parser.add_argument("--tune", type=int, default=None)
    parser.add_argument("--chains", type=int, default=None,
                        help="chains of every sampling (default: PyMC's default chains)")
    parser.add_argument("--layouts", default=None,
                        help="comma-separated chains-at-once x processes-per-chain layouts "
                        "of synkhronos.pymc.sample, e.g. 1x16,2x8,4x4 (default: those "
                        "that fill the machine)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds of the per-evaluation figures (3)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sizes", default=None,
                        help="comma-separated n_parallel to run (default 1 .. --max-n)")
    parser.add_argument("--no-sampling", action="store_true",
                        help="per-evaluation figures only, no pm.sample")
    parser.add_argument("--no-evaluations", action="store_true",
                        help="whole sampling only (at --sample-rows), no per-evaluation figures")
    args = parser.parse_args()
    rows = args.rows or ([20_000] if args.quick else [1_000, 10_000, 100_000, 1_000_000])
    sample_rows = args.sample_rows or max(rows)
    repeats = args.repeats or (5 if args.quick else 30)
    args.rounds = args.rounds or (1 if args.quick else 3)
    draws = args.draws or (50 if args.quick else 100)
    tune = args.tune or (50 if args.quick else 100)
    sizes = (list(range(1, args.max_n + 1)) if args.sizes is None
             else sorted({int(v) for v in args.sizes.split(",")}))
    if sizes[0] < 1:
        parser.error(f"--sizes must list positive integers; got {args.sizes!r}")
    options = dict(draws=draws, tune=tune, chains=args.chains, random_seed=3,
                   progressbar=False, compute_convergence_checks=False)
    layouts = None if args.layouts is None else [
        tuple(int(v) for v in item.split("x")) for item in args.layouts.split(",")]
    if args.no_evaluations:
        rows = [sample_rows]

    report: dict = {"benchmark": "pymc_sampling", "machine": machine(),
                    "load_at_start": load(), "quick": args.quick,
                    "settings": {"rows": rows, "sample_rows": sample_rows,
                                 "repeats": repeats, "warm_up_s": WARM_UP_S, "rounds": args.rounds,
                                 "n_parallel": sizes, **options},
                    "models": {}}
    for name in args.models:
        result: dict = {"evaluations": {}}
        for n_rows in rows:
            model = MODELS[name](n_rows)
            if not args.no_evaluations:
                result["evaluations"][str(n_rows)] = evaluations(
                    model, MODELS[name], n_rows, sizes, repeats, args.rounds)
            if n_rows == sample_rows and not args.no_sampling:
                result["sampling"] = {"rows": n_rows, **samplings(model, layouts, options)}
            del model
        result["break_even_rows"] = {
            "vs_pymc_1_thread": break_even(result["evaluations"], "speedup_vs_pymc_1_thread"),
            "vs_pymc_default_threads": break_even(result["evaluations"],
                                                  "speedup_vs_pymc_default_threads")}
        if "sampling" not in result and not args.no_sampling:
            result["sampling"] = {"rows": sample_rows,
                                  **samplings(MODELS[name](sample_rows), layouts, options)}
        report["models"][name] = result
    report["load_at_end"] = load()
    two = str(2 if 2 in sizes else sizes[-1])
    empty: dict = {}
    top = str(max(rows))

    def by_default(result: dict, kind: str) -> float | None:
        """A whole-sampling figure of the layout sample() chooses by default."""
        sampling = result.get("sampling", empty)
        label = f"synkhronos_{sampling.get('synkhronos_default_layout')}"
        return sampling.get(kind, empty).get(label)

    report["targets"] = {
        name: {
            "rows": max(rows), "n_parallel": int(two),
            "per_eval_speedup_vs_pymc_1_thread": result["evaluations"].get(top, empty).get(
                "speedup_vs_pymc_1_thread", empty).get(two),
            "per_eval_target": 1.8,
            "per_eval_ceiling_speedup": result["evaluations"].get(top, empty).get(
                "ceiling_speedup_vs_pymc_1_thread", empty).get(two),
            "per_eval_fraction_of_ceiling": result["evaluations"].get(top, empty).get(
                "fraction_of_ceiling", empty).get(two),
            # whole sampling: the layout sample() chooses by default
            "sampling_layout": result.get("sampling", empty).get("synkhronos_default_layout"),
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
