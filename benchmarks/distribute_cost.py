"""What distribute() costs: the master's compile against each worker's unpickle.

Builds the gradient of a 3-layer MLP (784-256-128-10, softmax cross-entropy) with
synk.function, distributes it, and reports each worker's unpickle time and the
master's compile time (Numba, as the cache is: run twice to see cold and warm; it
compiles at the function's first call), then checks that call against the plain
function. Prints JSON.

    python benchmarks/distribute_cost.py [--n 2]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import testing


def build_mlp_gradient():
    rng = np.random.default_rng(0)
    sizes = [784, 256, 128, 10]
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        params.append(pytensor.shared(rng.normal(0, fan_in**-0.5, (fan_in, fan_out))))
        params.append(pytensor.shared(np.zeros(fan_out)))
    x, y = pt.dmatrix("x"), pt.lvector("y")
    h = x
    for i in range(0, len(params) - 2, 2):
        h = pt.maximum(h.dot(params[i]) + params[i + 1], 0)
    logits = h.dot(params[-2]) + params[-1]
    logp = logits - pt.log(pt.exp(logits).sum(axis=1, keepdims=True))
    loss = -logp[pt.arange(y.shape[0]), y].mean()
    grads = pytensor.grad(loss, params)
    return x, y, loss, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2)
    args = parser.parse_args()
    synk.fork(args.n)
    x, y, loss, grads = build_mlp_gradient()
    start = time.perf_counter()
    f = synk.function([x, y], [loss] + grads)
    build = time.perf_counter() - start
    start = time.perf_counter()
    synk.distribute()
    total = time.perf_counter() - start
    rng = np.random.default_rng(1)
    xs, ys = rng.normal(size=(64, 784)), rng.integers(0, 10, 64)
    start = time.perf_counter()
    got = f(xs, ys)  # (compiled in the master at its first call, then run)
    first_call = time.perf_counter() - start
    seconds = testing.distribute_seconds()
    want = f.as_pytensor(xs, ys)
    agree = all(np.allclose(g, w, rtol=1e-9, atol=1e-12) for g, w in zip(got, want, strict=True))
    synk.close()
    print(json.dumps({
        "n_parallel": args.n,
        "build_seconds": round(build, 3),
        "master_compile_seconds": round(seconds["compile"], 3),
        "distribute_total_seconds": round(total, 3),
        "worker_unpickle_seconds": [round(s, 3) for s in seconds["unpickle"]],
        "first_parallel_call_seconds": round(first_call, 3),
        "matches_serial": agree,
    }, indent=2))


if __name__ == "__main__":
    main()
