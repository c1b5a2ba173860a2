"""How many rows a training step needs before dividing it over processes pays.

The Deep Learning Tutorials' step (data in shared variables, the minibatch sliced by
``givens`` from a scalar ``index``), timed three ways at each minibatch size, in
interleaved rounds on one machine:

- ``serial``: the plain ``pytensor.function`` (one process, BLAS at one thread, as
  every synkhronos process has);
- ``synk``: ``synk.function`` with the same givens, each process on its part of the
  slice, then ``synk.all_reduce`` of the parameters (the tutorials' port);
- the ratio ``serial / synk`` (above 1: the split pays).

Two models, as in the tutorials: logistic regression (784 -> 10, their batch 600) and
the MLP (784 -> 500 -> 10, their batch 20). The batch size is a second broadcast
scalar, so each model compiles once. The break-even is the smallest batch from which
every larger one measured pays.

    python benchmarks/tutorials_split.py [--n-parallel 2] [--rounds 5] [--out DIR]

Prints one JSON object (and writes it to ``--out``/tutorials_split.json).
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

sys.path.insert(0, str(Path(__file__).parent))
import _harness  # noqa: E402

ROWS = 12_000  # rows of generated data every process holds (MNIST-shaped rows)
SIZES = (10, 20, 50, 100, 200, 600, 2000, 6000)


def model(name: str, rng: np.random.Generator, data_x, data_y):
    """(inputs, cost, updates, givens) of one tutorials' model on the shared data."""
    index, size = pt.lscalar("index"), pt.lscalar("size")
    x, y = pt.dmatrix("x"), pt.ivector("y")
    params = []

    def layer(n_in: int, n_out: int, inp):
        bound = np.sqrt(6.0 / (n_in + n_out))
        W = pytensor.shared(rng.uniform(-bound, bound, (n_in, n_out)))
        b = pytensor.shared(np.zeros(n_out))
        params.extend([W, b])
        return inp.dot(W) + b

    hidden = pt.tanh(layer(784, 500, x)) if name == "mlp" else x
    p = pt.special.softmax(layer(500 if name == "mlp" else 784, 10, hidden), axis=-1)
    cost = -pt.log(p[pt.arange(y.shape[0]), y]).mean()
    grads = pytensor.grad(cost, params)
    updates = [(v, v - 0.01 * g) for v, g in zip(params, grads, strict=True)]
    rows = slice(index * size, (index + 1) * size)
    givens = {x: data_x[rows], y: pt.cast(data_y, "int32")[rows]}
    return [index, size], cost, updates, givens, params


def timed(step, sizes_steps: dict, size: int) -> float:
    """Seconds per step of ``step(index, size)`` over the batches of one pass."""
    steps = sizes_steps[size]
    start = time.perf_counter()
    for i in range(steps):
        step(i % (ROWS // size), size)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-parallel", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.4,
                        help="about how long each configuration runs per round")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    n = synk.fork(args.n_parallel)
    rng = np.random.default_rng(0)
    data_x = pytensor.shared(rng.normal(size=(ROWS, 784)), name="data_x")
    data_y = pytensor.shared(rng.integers(0, 10, size=ROWS).astype("float64"), name="data_y")
    steps: dict[str, dict] = {}
    for name in ("logistic", "mlp"):
        inputs, cost, updates, givens, params = model(name, rng, data_x, data_y)
        serial = pytensor.function(inputs, cost, updates=updates, givens=givens)
        parallel = synk.function(inputs=inputs, outputs=cost, updates=updates, givens=givens)

        def synk_step(index, size, parallel=parallel, params=params):
            parallel(index, size)
            synk.all_reduce(params)

        steps[name] = {"serial": serial, "synk": synk_step}
    synk.distribute()

    per_size: dict[str, dict[int, int]] = {}  # steps per timing, from a first pass
    for name, fns in steps.items():
        per_size[name] = {}
        for size in sizes:
            fns["serial"](0, size), fns["synk"](0, size)  # compile, warm
            start = time.perf_counter()
            fns["serial"](1, size)
            once = max(time.perf_counter() - start, 1e-5)
            per_size[name][size] = max(3, int(args.seconds / once))

    times: dict = {name: {size: {"serial": [], "synk": []} for size in sizes}
                   for name in steps}
    for _ in range(args.rounds):
        for name, fns in steps.items():
            for size in sizes:
                for kind in ("serial", "synk"):
                    times[name][size][kind].append(timed(fns[kind], per_size[name], size))
    synk.close()

    results: dict = {}
    for name in steps:
        rows = []
        for size in sizes:
            serial, parallel = times[name][size]["serial"], times[name][size]["synk"]
            ratios = [s / p for s, p in zip(serial, parallel, strict=True)]
            rows.append({"batch": size, "rows_per_process": size / n,
                         "serial_us": float(np.median(serial)) * 1e6,
                         "synk_us": float(np.median(parallel)) * 1e6,
                         "ratio": float(np.median(ratios)), "ratio_rounds": ratios})
        paying = [r["batch"] for i, r in enumerate(rows)
                  if all(later["ratio"] > 1 for later in rows[i:])]
        results[name] = {"steps": rows, "break_even_batch": paying[0] if paying else None}
    report = {"benchmark": "tutorials_split", "n_parallel": n, "rounds": args.rounds,
              "data_rows": ROWS, "machine": _harness.machine(),
              "versions": _harness.versions("pytensor", "numpy"), "models": results}
    if args.out is not None:
        _harness.write_report(report, args.out, "tutorials_split.json")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
