"""Call overhead: a tiny synk.function at n=2 against the plain pytensor.function.

Both are timed in the same run, interleaved, on the same few rows; the overhead is
the difference of the medians. Prints JSON.

    python benchmarks/call_overhead.py [--n 2] [--calls 3000] [--rows 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=4)
    args = parser.parse_args()

    synk.fork(args.n)
    x = pt.matrix("x", dtype="float64")
    out = (x * 2.0).sum(axis=0)
    plain = pytensor.function([x], out)
    parallel = synk.function([x], (out, "sum"))
    synk.distribute()
    values = np.ones((args.rows, 3))
    shared_values = synk.data(values)
    for _ in range(200):
        plain(values)
        parallel(values)
        parallel(shared_values)
    plain_t, numpy_t, data_t = [], [], []
    for _ in range(args.calls):
        plain_t.append(timed(plain, values))
        numpy_t.append(timed(parallel, values))
        data_t.append(timed(parallel, shared_values))
    synk.close()
    med = {k: statistics.median(v) * 1e6 for k, v in
           (("plain", plain_t), ("numpy", numpy_t), ("data", data_t))}
    print(json.dumps({
        "n_parallel": args.n,
        "rows": args.rows,
        "calls": args.calls,
        "plain_pytensor_median_us": round(med["plain"], 2),
        "synk_numpy_input_median_us": round(med["numpy"], 2),
        "synk_data_input_median_us": round(med["data"], 2),
        "overhead_numpy_input_us": round(med["numpy"] - med["plain"], 2),
        "overhead_data_input_us": round(med["data"] - med["plain"], 2),
    }, indent=2))


if __name__ == "__main__":
    main()
