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
- ``ours_parts``: the same with timers around three nested pieces of the master's
  evaluation: the likelihood Op (``RowSum``'s call through the session: staging the
  values, the command, combining the replies), the command on this machine
  (``LocalGroup.round``: post, the master's own share, waiting for the workers,
  collecting their replies) and the master's own share (its rows through its
  compiled function). The timers cost about a microsecond; ``ours_parts`` is the
  total with them on.

From those, per round and mode: ``outside_op`` (PyMC's graph around the likelihood: splitting the
parameter vector, the priors, the gradient's assembly) = ours_parts - op;
``staging_and_combining`` = op - round; ``post_wait_collect`` = round - own_share
(includes waiting for a worker slower than the master); ``own_share``. The ratio
``pymc_over_pymc_half`` is the speedup two processes would give if dividing the rows cost
nothing and every process were as fast as one alone.

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
from synkhronos._core import group as _group
from synkhronos.pymc import _likelihood

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pymc_sampling  # noqa: E402  (the models and the machine's description)

PARTS = ("op", "round", "own_share")


class Timers:
    """Seconds spent in the Op, the round and the master's own share, summed over calls;
    installed around the library's methods only while ``ours_parts`` runs."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PARTS, 0.0)
        self._saved: list = []

    def __enter__(self) -> Timers:
        spent = self.spent
        # (the compiled graph holds the Op's bound ``perform``: the method it calls on
        # every evaluation at n > 1 is wrapped instead)
        perform, round_ = _likelihood.RowSum._perform_commands, _group.LocalGroup.round

        def timed_perform(op, inputs, output_storage):
            start = time.perf_counter()
            try:
                return perform(op, inputs, output_storage)
            finally:
                spent["op"] += time.perf_counter() - start

        def timed_round(group, message, own_share, *args, **kwargs):
            def own(message):
                start = time.perf_counter()
                try:
                    return own_share(message)
                finally:
                    spent["own_share"] += time.perf_counter() - start

            start = time.perf_counter()
            try:
                return round_(group, message, own, *args, **kwargs)
            finally:
                spent["round"] += time.perf_counter() - start

        self._saved = [(_likelihood.RowSum, "_perform_commands", perform),
                       (_group.LocalGroup, "round", round_)]
        for (owner, name, _), timed in zip(self._saved, (timed_perform, timed_round),
                                           strict=True):
            setattr(owner, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)


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
        with Timers() as timers:
            got["ours_parts"] = block(ours, points, calls)
        got.update({name: timers.spent[name] / calls for name in PARTS})
        return got
    finally:
        synk.close()


def parts_of(us: dict[str, list[float]]) -> dict[str, list[float]]:
    """The named parts of each round (see the module docstring), from the timers."""
    def minus(a: str, b: str) -> list[float]:
        return [round(x - y, 2) for x, y in zip(us[a], us[b], strict=True)]

    return {"outside_op": minus("ours_parts", "op"),
            "staging_and_combining": minus("op", "round"),
            "post_wait_collect": minus("round", "own_share"),
            "own_share": us["own_share"]}


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
