"""Call overhead: a tiny synk.function against the plain pytensor.function.

Both are timed in the same run on the same few rows, call by call in turn (plain,
synk with a numpy input, synk with a ``Data`` input), in ``--rounds`` rounds; each
round is a fresh session, so a change of load or of core placement falls on every
series alike. The overhead is the difference of the medians. Reported per series: the
median and p99 over every call, and every round's median (``_harness.rounds_summary``).

    python benchmarks/call_overhead.py [--n 2] [--calls 3000] [--rounds 5] [--rows 4]

Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine, rounds_summary  # noqa: E402

SERIES = ("plain", "numpy", "data")


def one_round(n: int, calls: int, rows: int) -> dict[str, list[float]]:
    """One session of ``n``: ``calls`` timings of each series, taken in turn."""
    synk.fork(n)
    try:
        x = pt.matrix("x", dtype="float64")
        out = (x * 2.0).sum(axis=0)
        plain = pytensor.function([x], out)
        parallel = synk.function([x], (out, "sum"))
        synk.distribute()
        values = np.ones((rows, 3))
        shared_values = synk.data(values)
        for _ in range(200):
            plain(values)
            parallel(values)
            parallel(shared_values)
        clock = time.perf_counter
        times: dict[str, list[float]] = {name: [] for name in SERIES}
        plain_t, numpy_t, data_t = times["plain"], times["numpy"], times["data"]
        for _ in range(calls):
            start = clock()
            plain(values)
            plain_t.append(clock() - start)
            start = clock()
            parallel(values)
            numpy_t.append(clock() - start)
            start = clock()
            parallel(shared_values)
            data_t.append(clock() - start)
        return times
    finally:
        synk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--calls", type=int, default=3000, help="per round and series")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4)
    args = parser.parse_args()

    rounds: dict[str, list[list[float]]] = {name: [] for name in SERIES}
    for _ in range(args.rounds):
        for name, times in one_round(args.n, args.calls, args.rows).items():
            rounds[name].append(times)
    summary = {name: rounds_summary(rounds[name]) for name in SERIES}
    med = {name: summary[name]["median_us"] for name in SERIES}
    per_round = {name: summary[name]["round_medians_us"] for name in SERIES}
    print(json.dumps({
        "n_parallel": args.n,
        "rows": args.rows,
        "calls": args.calls,
        "rounds": args.rounds,
        "plain_pytensor_median_us": med["plain"],
        "synk_numpy_input_median_us": med["numpy"],
        "synk_data_input_median_us": med["data"],
        "overhead_numpy_input_us": round(med["numpy"] - med["plain"], 2),
        "overhead_data_input_us": round(med["data"] - med["plain"], 2),
        "overhead_numpy_input_every_round_us": [
            round(a - b, 2) for a, b in zip(per_round["numpy"], per_round["plain"], strict=True)],
        "series": summary,
        "machine": machine(),
    }, indent=2))


if __name__ == "__main__":
    main()
