"""The low-precision exchange beside the exact one: ``synk.all_reduce(..., exchange=...)``.

Usage::

    python benchmarks/low_precision.py [--n 2] [--sizes 4,67108864] [--rounds 7]
        [--modes exact,bf16,fp16] [--op avg] [--out benchmarks/results]

One session of ``--n`` processes and one float32 shared variable per size. Each round
runs, for every size, one series of calls per mode (``exact``: ``exchange=None``;
``bf16``, ``fp16``), the modes in a new order each round, so that a change in the
machine's load falls on every mode alike. A series is some warm-up calls, then timed
calls back to back (as between a training loop's steps: the worker runs them from its
lane); its figure is the median call. The report gives, per size and mode, the median
over rounds of the series' medians, and per size and low-precision mode the median over
rounds of the ratio to the exact series of the same round (below 1: faster than
exact).

It also states the bytes each call reads and writes per process (``traffic``), from
the exchanges' shapes (``docs/collectives.rst`` explains them): with ``S`` values of 4
bytes at ``n`` processes, the exact exchange of a large list reads ``4S`` (its piece of
every process's values) plus ``4S(n-1)/n`` (the others' results) and writes
``4S(n-1)/n + 4S/n``; the low-precision one first reads its ``4S`` and writes them as
``2S``, then reads ``2S`` of words (its piece of every process's) and ``4S(n-1)/n`` of
results, and writes the same float32 results as the exact one. What crosses between
processes falls from ``8S(n-1)/n`` to ``6S(n-1)/n``: the values travel as 16 bits, the
results as float32.

``op`` defaults to ``avg`` so that the values stay where they are call after call (a
sum multiplies them by n every time, and fp16 ends at 65504).

Prints the report as JSON and writes ``low_precision.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

MODES = {"exact": None, "bf16": "bf16", "fp16": "fp16"}


def trials_for(nbytes: int) -> int:
    return 2000 if nbytes <= 1 << 10 else 300 if nbytes <= 1 << 20 else 12


def traffic(nbytes: int, n: int) -> dict:
    """Bytes one process reads and writes in one call of each mode (the large path)."""
    s = nbytes  # the values' bytes, 4 per value
    results = s * (n - 1) / n  # the other processes' pieces of the result
    exact = {"read": s + results, "written": results + s / n}
    rounded = {"read": s + s / 2 + results, "written": s / 2 + results + s / n}
    # of which read from the other processes' memory: their pieces of the values (as
    # words, half the bytes) and their pieces of the result
    others = {"exact": 2 * results, "low_precision": results / 2 + results}
    return {"exact": exact, "low_precision": rounded, "from_other_processes": others}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--sizes", default="4,67108864", help="bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--modes", default="exact,bf16,fp16")
    parser.add_argument("--op", default="avg", choices=["avg", "sum"])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    if "exact" not in modes or any(mode not in MODES for mode in modes):
        parser.error(f"--modes takes exact and any of {', '.join(MODES)}")

    import pytensor

    import synkhronos as synk

    synk.fork(args.n)
    try:
        variables = [pytensor.shared(np.ones(max(1, s // 4), "float32"), name=f"v{s}")
                     for s in sizes]
        synk.function([], [v.sum() for v in variables])
        synk.distribute()
        rng = np.random.default_rng(0)
        medians: dict = {size: {mode: [] for mode in modes} for size in sizes}
        for round_ in range(args.rounds):
            order = list(rng.permutation(modes))
            for size, var in zip(sizes, variables, strict=True):
                count = trials_for(size)
                for mode in order:
                    exchange = MODES[mode]
                    for _ in range(min(count, 20)):
                        synk.all_reduce(var, args.op, exchange=exchange)
                    times = []
                    for _ in range(count):
                        start = time.perf_counter()
                        synk.all_reduce(var, args.op, exchange=exchange)
                        times.append(time.perf_counter() - start)
                    medians[size][mode].append(float(np.median(times)))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        synk.close()

    results = []
    for size in sizes:
        row: dict = {"bytes": size, "trials_per_series": trials_for(size),
                     "traffic_bytes": traffic(size, args.n)}
        for mode in modes:
            row[f"{mode}_median_us"] = round(float(np.median(medians[size][mode])) * 1e6, 2)
            row[f"{mode}_round_medians_us"] = [round(t * 1e6, 2) for t in medians[size][mode]]
        for mode in modes:
            if mode != "exact":
                ratios = np.divide(medians[size][mode], medians[size]["exact"])
                row[f"{mode}_over_exact"] = round(float(np.median(ratios)), 3)
        results.append(row)
    report = {"benchmark": "low_precision", "n": args.n, "op": args.op,
              "rounds": args.rounds, "machine": _harness.machine(), "results": results}
    _harness.write_report(report, args.out, "low_precision.json")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
