"""Where one PyMC evaluation's time goes at small data: synkhronos.pymc at n=2, in parts.

At 10^4 rows a logp + gradient evaluation takes PyMC 100-300 us on these machines, and
``synkhronos.pymc`` at two processes gains less than the machine's ceiling. This script
splits one evaluation into the parts that add up to it, so that the gap has names:

- ``pymc``: PyMC's own compiled function (``model.logp_dlogp_function``) on all rows;
- ``pymc_half``: the same on a model of rows/2 (what one process computes: PyMC's whole
  evaluation of half the data, its graph outside the likelihood included);
- ``ours``: ``synkhronos.pymc.logp_dlogp_function`` at ``--n`` processes, untouched,
  in a session of its own each round, unpinned (``fork()``'s default) and pinned
  (``fork(pin=True)``: each process on its core) in turn;
- ``ours_parts``: the same under ``synk.profile()`` (which times each call's phases on
  the path it takes unprofiled) and a timer around the likelihood Op's call through the
  session (``op``), per call: ``outside_op`` = ours_parts - op (PyMC's graph around the
  likelihood: splitting the parameter vector, the priors, the gradient's assembly);
  ``op_glue`` = op - the call (the Op's own work around the call); ``staging`` (the
  values refilled into shared memory); ``own_share`` (the master's rows through its
  compiled function); ``wait_for_worker`` (after its own share, for a worker slower
  than the master or later to start); ``combining`` (the replies reduced into the
  result); ``post_and_collect`` = the call - the four before (posting the command,
  reading the replies). The ratio ``pymc_over_pymc_half`` is the speedup two processes
  would give if dividing the rows cost nothing and every process were as fast as one
  alone.

All series are interleaved over ``--rounds`` rounds (one block of ``--calls`` calls each),
one BLAS thread everywhere; the JSON has every round's figure and the median over rounds.

``--movie``: instead, a model in the shape of the PyMC gallery's movie ratings (issue
45): parameters shared by six observed variables of six lengths (about 51%, 25%, 13%,
7%, 3% and 0.5% of ``--movie-rows``, default 10^5 rows), each with its own ``pm.Data``
predictors and its own noise, all divided (``split`` names them). Per round, in an
order flipped every round: PyMC's own function and ``synkhronos.pymc``'s at ``--n``
(seconds per evaluation, and the commands one evaluation sends, counted by
``synk.profile()``), then ``pm.sample`` and ``synkhronos.pymc.sample(divide=True,
processes_per_chain=n)``, both with PyMC's NUTS (``nuts_sampler="pymc"``: PyMC 6's
``pm.sample`` otherwise takes nutpie where it is installed), one chain of ``--draws``
draws after as many tuning steps: wall seconds (compile included), PyMC's own
sampling-loop seconds, and the leapfrog steps of tuning and draws, each one
evaluation (the same seed, so the same steps up to rounding; the sampling loop's
seconds per leapfrog step besides, in case rounding takes the chains apart). The
ratios are each round's, their median over rounds. To compare with an earlier
checkout (one parallel call per length there), run this script of this checkout in
both: ``benchmarks/compare_revisions.py --only pymc_parts --scripts .``.

    python benchmarks/pymc_parts.py [--models hierarchical logistic] [--rows 10000 100000]
    python benchmarks/pymc_parts.py --movie [--movie-rows 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

import synkhronos as synk
import synkhronos.pymc as synk_pymc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pymc_sampling  # noqa: E402  (the models and the machine's description)

PARTS = ("op", "call", "staging", "own_share", "wait_for_worker", "combining")


def likelihood_op(vgf):
    """The divided likelihood's Op in PyMC's compiled function (its only ``RowSum``)."""
    nodes = [node for node in vgf._pytensor_function.maker.fgraph.apply_nodes
             if type(node.op).__name__ == "RowSum"]
    assert len(nodes) == 1, "expected one divided likelihood"
    return nodes[0].op


class OpTimer:
    """Seconds spent in the Op's call through the session, summed over calls: a timer
    around its part's ``evaluate`` (which the Op calls at n > 1), on the instance,
    removed on exit."""

    def __init__(self, op) -> None:
        self.part = op.part
        self.spent = 0.0

    def __enter__(self) -> OpTimer:
        inner = self.part.evaluate

        def timed(theta):
            start = time.perf_counter()
            try:
                return inner(theta)
            finally:
                self.spent += time.perf_counter() - start

        self.part.evaluate = timed
        return self

    def __exit__(self, *exc) -> None:
        del self.part.evaluate


def block(fn, points: list[np.ndarray], calls: int) -> float:
    """Mean seconds per call over ``calls`` calls (cycling through ``points``)."""
    start = time.perf_counter()
    for i in range(calls):
        fn(points[i % len(points)])
    return (time.perf_counter() - start) / calls


def pymc_function(model):
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    return fn


def session_round(model, points: list[np.ndarray], n: int, pin: bool, calls: int) -> dict:
    """One round of ``ours`` and ``ours_parts`` in a session of its own (``pin``: each
    process on its core); seconds per call."""
    synk.fork(n, pin=pin)
    try:
        ours = synk_pymc.logp_dlogp_function(model)
        ours.set_extra_values({})
        block(ours, points, max(50, calls // 10))  # warm: staged, caches filled
        got = {"ours": block(ours, points, calls)}
        with OpTimer(likelihood_op(ours)) as timer, synk.profile() as profile:
            block(ours, points, max(50, calls // 10))  # the timed path's first call
            timer.spent, profile.records = 0.0, []
            got["ours_parts"] = block(ours, points, calls)
        got["op"] = timer.spent / calls
        records = profile.records
        assert len(records) == calls and all(r.kind == "call" for r in records)
        got["call"] = statistics.fmean(r.total for r in records)
        got["staging"] = statistics.fmean(r.stage for r in records)
        got["own_share"] = statistics.fmean(r.gather[0] + r.function[0] for r in records)
        got["wait_for_worker"] = statistics.fmean(r.straggler for r in records)
        got["combining"] = statistics.fmean(r.reduce for r in records)
        return got
    finally:
        synk.close()


def parts_of(us: dict[str, list[float]]) -> dict[str, list[float]]:
    """The named parts of each round (see the module docstring)."""
    rounds = range(len(us["ours"]))

    def part(fn) -> list[float]:
        return [round(fn(k), 2) for k in rounds]

    return {
        "outside_op": part(lambda k: us["ours_parts"][k] - us["op"][k]),
        "op_glue": part(lambda k: us["op"][k] - us["call"][k]),
        "staging": us["staging"],
        "post_and_collect": part(lambda k: us["call"][k] - sum(
            us[name][k] for name in ("staging", "own_share", "wait_for_worker",
                                     "combining"))),
        "own_share": us["own_share"],
        "wait_for_worker": us["wait_for_worker"],
        "combining": us["combining"],
    }


def measure(make, rows: int, n: int, rounds: int, calls: int) -> dict:
    model, half = make(rows), make(rows // 2)
    points = pymc_sampling.points_for(model)
    plain, plain_half = pymc_function(model), pymc_function(half)
    for fn in (plain, plain_half):
        block(fn, points, max(50, calls // 10))
    pymc: dict[str, list[float]] = {"pymc": [], "pymc_half": []}
    modes: dict[str, dict[str, list[float]]] = {
        mode: {name: [] for name in ("ours", "ours_parts", *PARTS)}
        for mode in ("unpinned", "pinned")}
    for _ in range(rounds):
        pymc["pymc"].append(block(plain, points, calls))
        pymc["pymc_half"].append(block(plain_half, points, calls))
        for mode, series in modes.items():
            for name, value in session_round(model, points, n, mode == "pinned",
                                             calls).items():
                series[name].append(value)

    def micro(values: list[float]) -> list[float]:
        return [round(value * 1e6, 2) for value in values]

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    base = {name: micro(values) for name, values in pymc.items()}
    record: dict = {"rows": rows, "n": n,
                    "median_us": {name: median(v) for name, v in base.items()},
                    "every_round_us": dict(base),
                    "pymc_over_pymc_half": median(
                        [p / h for p, h in zip(base["pymc"], base["pymc_half"], strict=True)])}
    for mode, series in modes.items():
        us = {name: micro(values) for name, values in series.items()}
        record[mode] = {
            "median_us": {name: median(v) for name, v in us.items()},
            "parts_median_us": {name: median(v) for name, v in parts_of(us).items()},
            "pymc_over_ours": median(
                [p / o for p, o in zip(base["pymc"], us["ours"], strict=True)]),
            "every_round_us": us,
        }
    return record


# -- several likelihoods of different lengths (--movie) ---------------------------------------
MOVIE_SHARES = (0.51, 0.25, 0.13, 0.07, 0.035, 0.005)  # of the rows, one per likelihood


def movie(rows: int, seed: int = 0, movies: int = 200):
    """Ratings of ``movies`` movies from six sources of different sizes: a movie's
    quality and two predictors' slopes shared by all, each source with its own mean
    and noise. Returns the model and the ``split`` that divides every source."""
    import pymc as pm

    rng = np.random.default_rng(seed)
    quality = rng.normal(0, 0.7, size=movies)
    slopes = np.array([0.4, -0.25])
    split = []
    with pm.Model(coords={"movie": range(movies)}) as model:
        spread = pm.HalfNormal("spread", 1)
        # centred: hundreds of ratings a movie pin each quality down
        effect = pm.Normal("quality", 0, spread, dims="movie")
        beta = pm.Normal("beta", 0, 1, shape=2)
        for k, share in enumerate(MOVIE_SHARES):
            length = max(1, round(rows * share))
            which = rng.integers(movies, size=length)
            x = rng.normal(size=(length, 2))
            truth = 3.0 + 0.2 * k + quality[which] + x @ slopes
            scale = 0.5 + 0.1 * k
            movie_k = pm.Data(f"movie_{k}", which)
            x_k = pm.Data(f"x_{k}", x)
            mean = pm.Normal(f"mean_{k}", 3, 2)
            sigma = pm.HalfNormal(f"sigma_{k}", 1)
            pm.Normal(f"rating_{k}", mean + effect[movie_k] + x_k @ beta, sigma,
                      observed=truth + rng.normal(scale=scale, size=length))
            split += [f"rating_{k}", f"movie_{k}", f"x_{k}"]
    return model, split


def movie_evaluations(model, split, points: list[np.ndarray], n: int,
                      calls: int) -> dict:
    """``synkhronos.pymc``'s function at ``n`` in a session of its own: seconds per
    evaluation, and the commands one evaluation sends."""
    synk.fork(n)
    try:
        ours = synk_pymc.logp_dlogp_function(model, split=split)
        ours.set_extra_values({})
        seconds = pymc_sampling.per_call(ours, points, calls)
        with synk.profile() as profile:
            commands = CommandCounter(profile)
            block(ours, points, 20)
        return {"ours_s": seconds, "commands_per_evaluation": commands.count / 20}
    finally:
        synk.close()


class CommandCounter:
    """The commands the session runs while ``profile`` is its instrument (a call, or
    several calls in one command when the rows are balanced: ``synk.steps``), counted
    around the instrument's ``command``, which the session calls once a command."""

    def __init__(self, profile) -> None:
        self.count = 0
        inner = profile.command

        def counted(*args):
            self.count += 1
            return inner(*args)

        profile.command = counted


def movie_sampling(model, split, n: int, draws: int, which: str,
                   sampler: str = "pymc") -> dict:
    """One chain of ``pm.sample`` (``which`` "pymc") or of ``synkhronos.pymc.sample``
    divided over ``n`` processes, both with ``sampler`` (``nuts_sampler``): wall
    seconds (compile included), the sampler's own sampling-loop seconds, and the
    posterior's summary."""
    import pymc as pm

    # the sampler named in both: PyMC 6's pm.sample takes nutpie where it is installed
    options = dict(draws=draws, tune=draws, chains=1, cores=1, random_seed=7,
                   nuts_sampler=sampler, progressbar=False, compute_convergence_checks=False,
                   discard_tuned_samples=False)  # (the tuning steps' leapfrog steps)
    start = time.perf_counter()
    if which == "pymc":
        idata = pm.sample(model=model, **options)
    else:
        idata = synk_pymc.sample(model=model, split=split, divide=True,
                                 processes_per_chain=n, **options)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "sampling_s": pymc_sampling.sampling_time(idata),
            "leapfrog_steps": int(idata.sample_stats["n_steps"].sum()
                                  + idata.warmup_sample_stats["n_steps"].sum()),
            "summary": pymc_sampling.posterior_summary(idata)}


def measure_movie(rows: int, n: int, rounds: int, calls: int, draws: int,
                  sampler: str = "pymc") -> dict:
    """The ``--movie`` figures (see the module docstring)."""
    model, split = movie(rows)
    points = pymc_sampling.points_for(model)
    plain = pymc_function(model)
    series: dict[str, list[float]] = {
        name: [] for name in ("pymc_s", "ours_s", "commands_per_evaluation",
                              "pm_sample_wall_s", "ours_sample_wall_s",
                              "pm_sample_sampling_s", "ours_sample_sampling_s",
                              "pm_sample_leapfrog_steps", "ours_sample_leapfrog_steps")}
    gaps, loads = [], []
    for r in range(rounds):
        loads.append(pymc_sampling.load())
        steps = ["pymc", "ours", "pm_sample", "ours_sample"]
        for step in steps if r % 2 == 0 else steps[::-1]:
            if step == "pymc":
                series["pymc_s"].append(pymc_sampling.per_call(plain, points, calls))
            elif step == "ours":
                for name, value in movie_evaluations(model, split, points, n, calls).items():
                    series[name].append(value)
            else:
                got = movie_sampling(model, split, n, draws,
                                     "pymc" if step == "pm_sample" else "ours", sampler)
                series[f"{step}_wall_s"].append(got["wall_s"])
                series[f"{step}_sampling_s"].append(got["sampling_s"])
                series[f"{step}_leapfrog_steps"].append(got["leapfrog_steps"])
                if step == "pm_sample":
                    want = got["summary"]
                else:
                    mine = got["summary"]
        gaps.append(pymc_sampling.summary_gap(mine, want))

    def ratio(top: str, bottom: str) -> float:
        return round(statistics.median(
            [a / b for a, b in zip(series[top], series[bottom], strict=True)]), 3)

    return {
        "rows": [max(1, round(rows * share)) for share in MOVIE_SHARES], "n": n,
        "nuts_sampler": sampler,
        "draws": draws, "tune": draws, "chains": 1, "calls": calls,
        "median": {name: round(statistics.median(values), 6)
                   for name, values in series.items()},
        "pymc_over_ours_evaluation": ratio("pymc_s", "ours_s"),
        "ours_over_pm_sample_wall": ratio("ours_sample_wall_s", "pm_sample_wall_s"),
        "ours_over_pm_sample_sampling": ratio("ours_sample_sampling_s",
                                              "pm_sample_sampling_s"),
        "ours_over_pm_sample_per_leapfrog_step": round(statistics.median(
            [(a / b) / (c / d) for a, b, c, d in zip(
                series["ours_sample_sampling_s"], series["ours_sample_leapfrog_steps"],
                series["pm_sample_sampling_s"], series["pm_sample_leapfrog_steps"],
                strict=True)]), 3),
        "posterior_gap_mcse": gaps,
        "every_round": series,
        "load_per_round": loads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["hierarchical", "logistic"],
                        choices=sorted(pymc_sampling.MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=[10_000, 100_000])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--movie", action="store_true",
                        help="six likelihoods of six lengths, evaluations and sampling")
    parser.add_argument("--movie-rows", type=int, default=100_000)
    parser.add_argument("--draws", type=int, default=300,
                        help="--movie: draws, and as many tuning steps")
    parser.add_argument("--nuts-sampler", default="pymc", choices=["pymc", "nutpie"],
                        help="--movie: the sampler of both pm.sample and synkhronos's")
    args = parser.parse_args()
    report: dict = {"benchmark": "pymc_parts", "machine": pymc_sampling.machine(),
                    "rounds": args.rounds, "calls": args.calls, "models": {}}
    with threadpool_limits(limits=1):
        if args.movie:
            report["movie"] = measure_movie(args.movie_rows, args.n, args.rounds,
                                            args.calls, args.draws, args.nuts_sampler)
        for name in [] if args.movie else args.models:
            report["models"][name] = [
                measure(pymc_sampling.MODELS[name], rows, args.n, args.rounds, args.calls)
                for rows in args.rows]
    report["load_after"] = pymc_sampling.load()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
