"""Call overhead: a tiny synk.function against the plain pytensor.function.

Both are timed in the same run on the same few rows, in ``--rounds`` rounds; each
round is a fresh session, so a change of load or of core placement falls on every
series alike. Two patterns per round:

- *mixed*: call by call in turn, plain, synk with a numpy input, synk with a ``Data``
  input: each synk call is another command than the one before (``numpy``, ``data``);
- *repeated*, a training loop's: plain and synk with one kind of input in turn, so
  that each synk call repeats the command before it, which the master posts again as
  it stood and each worker runs through its lane (``numpy_repeated`` beside
  ``plain_beside_numpy``, then ``data_repeated`` beside ``plain_beside_data``);
- *two sizes*, a loop that alternates a training and a validation batch: numpy rows of
  ``--rows`` and of four times as many in turn, each size repeating its own earlier
  call (``numpy_two_sizes`` beside ``plain_beside_two_sizes``).

The overhead is the difference of the medians of a synk series and the plain series
timed in turn with it. Reported per series: the median and p99 over every call, and
every round's median (``_harness.rounds_summary``).

At ``--n 2`` on PyTensor's Numba backend, each round also times the compiled floor
(``_compiled.lane``, not the library): the same call's round with its graph run inside
compiled code in both processes, after the session closed, each of its calls followed
by a plain call timed in turn. ``ratio_compiled_lane_over_plain`` is how far below (or
above) the plain PyTensor call a compiled command path could take a tiny call.

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
from _compiled import lane, run_pair  # noqa: E402
from _harness import machine, rounds_summary  # noqa: E402

SERIES = ("plain", "numpy", "data", "plain_beside_numpy", "numpy_repeated",
          "plain_beside_data", "data_repeated", "plain_beside_two_sizes", "numpy_two_sizes")


def in_turn(calls: int, series: list[tuple]) -> None:
    """``calls`` times: each of ``series`` (function, argument, list of seconds) called
    on its argument and timed, in turn."""
    clock = time.perf_counter
    for _ in range(calls):
        for fn, arg, timings in series:
            start = clock()
            fn(arg)
            timings.append(clock() - start)


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
        times: dict[str, list[float]] = {name: [] for name in SERIES}
        in_turn(calls, [(plain, values, times["plain"]), (parallel, values, times["numpy"]),
                        (parallel, shared_values, times["data"])])
        for kind, value in (("numpy", values), ("data", shared_values)):
            for _ in range(200):
                parallel(value)
            in_turn(calls, [(plain, values, times[f"plain_beside_{kind}"]),
                            (parallel, value, times[f"{kind}_repeated"])])
        bigger = np.ones((4 * rows, 3))
        for _ in range(200):
            parallel(values)
            parallel(bigger)
        in_turn(calls, [(plain, values, times["plain_beside_two_sizes"]),
                        (parallel, values, times["numpy_two_sizes"]),
                        (plain, bigger, times["plain_beside_two_sizes"]),
                        (parallel, bigger, times["numpy_two_sizes"])])
        return times
    finally:
        synk.close()


def lane_round(calls: int, rows: int) -> dict[str, list[float]] | None:
    """The compiled floor at n=2 (see the module docstring): its calls and the plain
    call's, in turn; None where PyTensor's function is not Numba's or Numba is absent."""
    x = pt.matrix("x", dtype="float64")
    plain = pytensor.function([x], (x * 2.0).sum(axis=0))
    graph = getattr(plain.vm, "jit_fn", None)
    if graph is None:
        return None
    values = np.ones((rows, 3))
    half = (rows + 1) // 2
    built = lane(graph, values[:half], values[half:])
    if built is None:
        return None
    plain_times: list[float] = []
    clock = time.perf_counter

    def between() -> None:
        start = clock()
        plain(values)
        plain_times.append(clock() - start)

    times, result = run_pair(*built, calls, 200, width=values.shape[1], mine=values[:half],
                             theirs=values[half:], between=between)
    np.testing.assert_allclose(result, plain(values))  # the floor computes the call
    return {"lane": times, "plain": plain_times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--calls", type=int, default=3000, help="per round and series")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4)
    args = parser.parse_args()

    rounds: dict[str, list[list[float]]] = {name: [] for name in SERIES}
    lanes: dict[str, list[list[float]]] = {"lane": [], "plain": []}
    for _ in range(args.rounds):
        for name, times in one_round(args.n, args.calls, args.rows).items():
            rounds[name].append(times)
        floor = lane_round(args.calls, args.rows) if args.n == 2 else None
        if floor is not None:
            for name, times in floor.items():
                lanes[name].append(times)
    summary = {name: rounds_summary(rounds[name]) for name in SERIES}
    med = {name: summary[name]["median_us"] for name in SERIES}
    per_round = {name: summary[name]["round_medians_us"] for name in SERIES}
    compiled: dict = {"compiled_lane": "not measured: --n is not 2, or PyTensor's "
                                       "functions are not Numba's, or Numba is absent"}
    if lanes["lane"]:
        floor = {name: rounds_summary(lanes[name]) for name in lanes}
        compiled = {
            "compiled_lane_median_us": floor["lane"]["median_us"],
            "plain_beside_lane_median_us": floor["plain"]["median_us"],
            "ratio_compiled_lane_over_plain": round(
                floor["lane"]["median_us"] / floor["plain"]["median_us"], 2),
            "compiled_lane_series": floor,
        }
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
        "repeated_overhead_numpy_input_us": round(
            med["numpy_repeated"] - med["plain_beside_numpy"], 2),
        "repeated_overhead_data_input_us": round(
            med["data_repeated"] - med["plain_beside_data"], 2),
        "two_sizes_overhead_numpy_input_us": round(
            med["numpy_two_sizes"] - med["plain_beside_two_sizes"], 2),
        "repeated_overhead_numpy_input_every_round_us": [
            round(a - b, 2) for a, b in zip(per_round["numpy_repeated"],
                                            per_round["plain_beside_numpy"], strict=True)],
        "repeated_overhead_data_input_every_round_us": [
            round(a - b, 2) for a, b in zip(per_round["data_repeated"],
                                            per_round["plain_beside_data"], strict=True)],
        "series": summary,
        **compiled,
        "machine": machine(),
    }, indent=2))


if __name__ == "__main__":
    main()
