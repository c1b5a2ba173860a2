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

    python benchmarks/pymc_parts.py [--models hierarchical logistic] [--rows 10000 100000]
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
    around that one Op's method (the compiled graph holds its bound ``perform``, which
    calls this method at n > 1), on the instance, removed on exit."""

    def __init__(self, op) -> None:
        self.op = op
        self.spent = 0.0

    def __enter__(self) -> OpTimer:
        inner = self.op._evaluate_commands

        def timed(theta):
            start = time.perf_counter()
            try:
                return inner(theta)
            finally:
                self.spent += time.perf_counter() - start

        self.op._evaluate_commands = timed
        return self

    def __exit__(self, *exc) -> None:
        del self.op._evaluate_commands


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["hierarchical", "logistic"],
                        choices=sorted(pymc_sampling.MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=[10_000, 100_000])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    report: dict = {"benchmark": "pymc_parts", "machine": pymc_sampling.machine(),
                    "rounds": args.rounds, "calls": args.calls, "models": {}}
    with threadpool_limits(limits=1):
        for name in args.models:
            report["models"][name] = [
                measure(pymc_sampling.MODELS[name], rows, args.n, args.rounds, args.calls)
                for rows in args.rows]
    report["load_after"] = pymc_sampling.load()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
