"""A divided log-likelihood in chunks against the even split, beside busy cores.

The question of issue 62 for ``synkhronos.pymc``: does taking rows as the processes
come free (``f(..., chunks=K)``) pay for a log-likelihood evaluation, whose function
costs little per call beyond its rows (a logistic regression: ten coefficients), when
another program keeps a core busy? One session of ``--n`` processes evaluates the
log-likelihood and its gradient (two ``"sum"`` outputs, no updates: the form of
``synkhronos.pymc``'s row function) on ``--rows`` rows held in a ``synk.data``, three
ways, in rounds of about ``--seconds`` each, in a new random order every round:

- ``even``: each process its block (the replayed call, as the likelihood runs);
- ``chunks K``: for each ``K`` of ``--chunks``, the rows in ``K`` chunks taken as the
  processes come free;
- ``sliced S``: the even split with ``num_slices = K // n``: the same calls on as many
  rows, fixed in advance (a function that runs faster on fewer rows at once, its
  intermediate arrays staying in cache, gains that from chunks too: this tells the
  two gains apart);
- ``plain``: the plain PyTensor function on every row in the master (one process, one
  BLAS thread: what PyMC's own function costs), the figure both divide.

``--busy B`` keeps ``B`` cores busy with pure-Python loops for the whole run
(``--busy-pinned``: each held to one of the last usable cores). Prints JSON: each way's
median microseconds per evaluation, per-round ratios (median, min, max) of time: each
chunked and sliced way over the even one, each chunked way over the sliced one with
as many calls, and the even one over ``plain``; results are checked against
the plain function every round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

SPINNER = "import os\nos.sched_setaffinity(0, {cores})\nwhile True:\n    pass\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--chunks", default="8,32", help="comma-separated K")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--busy-pinned", action="store_true")
    args = parser.parse_args()
    chunk_counts = [int(v) for v in args.chunks.split(",") if v]

    import pytensor
    import pytensor.tensor as pt
    from threadpoolctl import threadpool_limits

    import synkhronos as synk

    usable = sorted(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER.format(
        cores={usable[-1 - i]} if args.busy_pinned else set(usable))])
        for i in range(args.busy)]
    try:
        synk.fork(args.n)
        rng = np.random.default_rng(0)
        features = 10
        x = rng.normal(size=(args.rows, features))
        y = (rng.random(args.rows) < 0.5).astype("float64")
        xs, ys, theta = pt.dmatrix("x"), pt.dvector("y"), pt.dvector("theta")
        z = xs @ theta[:features] + theta[features]
        loglik = (-ys * pt.softplus(-z) - (1 - ys) * pt.softplus(z)).sum()
        grad = pytensor.grad(loglik, theta)
        f = synk.function([xs, ys], [(loglik, "sum"), (grad, "sum")], bcast_inputs=[theta])
        plain = pytensor.function([xs, ys, theta], [loglik, grad])
        synk.distribute()
        xd, yd = synk.data(x), synk.data(y)
        point = np.full(features + 1, 0.01)
        want = plain(x, y, point)

        ways: dict[str, object] = {"even": lambda: f(xd, yd, point)}
        for k in chunk_counts:
            ways[f"chunks {k}"] = (lambda k=k: f(xd, yd, point, chunks=k))
            if k >= 2 * args.n:  # the same calls of the same rows, fixed in advance
                ways[f"sliced {k // args.n}"] = (
                    lambda k=k: f(xd, yd, point, num_slices=k // args.n))
        with threadpool_limits(1):
            ways["plain"] = lambda: plain(x, y, point)
            for call in ways.values():  # warm up, and check
                for _ in range(3):
                    got = call()
                np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
                np.testing.assert_allclose(got[1], want[1], rtol=1e-9, atol=1e-9)
            per_round: dict[str, list[float]] = {name: [] for name in ways}
            order = np.random.default_rng(1)
            for _ in range(args.rounds):
                for i in order.permutation(len(ways)):
                    name = list(ways)[i]
                    call = ways[name]
                    calls, start = 0, time.perf_counter()
                    while time.perf_counter() - start < args.seconds:
                        call()
                        calls += 1
                    per_round[name].append(1e6 * (time.perf_counter() - start) / calls)
    finally:
        synk.close()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()

    def ratio(a: list[float], b: list[float]) -> dict:
        values = [x / y for x, y in zip(a, b, strict=True)]  # time over time
        return {"median": round(float(np.median(values)), 3),
                "min": round(min(values), 3), "max": round(max(values), 3)}

    result = {
        "benchmark": "chunks_call",
        "machine": _harness.machine(),
        "n": args.n, "rows": args.rows, "rounds": args.rounds,
        "seconds_per_turn": args.seconds, "busy": args.busy,
        "busy_pinned": args.busy_pinned,
        "median_us": {name: round(float(np.median(v)), 1) for name, v in per_round.items()},
        "per_round_us": {name: [round(t, 1) for t in v] for name, v in per_round.items()},
        # times: below 1 is faster
        "time_over_even": {name: ratio(per_round[name], per_round["even"])
                           for name in ways if name.startswith(("chunks", "sliced"))},
        "chunks_time_over_sliced": {
            f"chunks {k}": ratio(per_round[f"chunks {k}"], per_round[f"sliced {k // args.n}"])
            for k in chunk_counts if f"sliced {k // args.n}" in per_round},
        "even_time_over_plain": ratio(per_round["even"], per_round["plain"]),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
