"""Demo 1: a serial PyTensor function, run on every core, reduced like the serial one.

Shows the output reductions (avg weighted by rows, sum, max, gather), a shuffled
``batch`` of row indices, and ``num_slices``; every result is checked against the
plain PyTensor function on the full data.

    python demos/demo_1.py [--n-parallel N] [--rows R]
"""

from __future__ import annotations

import argparse

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--rows", type=int, default=1003)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)  # 1. fork before building graphs
    x, y = pt.dmatrix("x"), pt.dmatrix("y")
    z = x.dot(y)
    f = synk.function(
        inputs=[x],  # scattered along axis 0
        bcast_inputs=[y],  # used whole by every process
        outputs=[z.mean(axis=0), (z.sum(), "sum"), (z.max(), "max"), (z.sum(axis=1), "gather")],
    )
    synk.distribute()  # 2. ship the functions to the workers

    rng = np.random.default_rng(1)
    x_data = synk.data(rng.normal(size=(args.rows, 10)))  # in shared memory, zero copy
    y_data = rng.normal(size=(10, 5))

    checks = {
        "whole": ({}, slice(None)),
        "shuffled batch": ({"batch": rng.permutation(args.rows)[:257]}, None),
        "4 slices": ({"num_slices": 4}, slice(None)),
    }
    for label, (kwargs, rows) in checks.items():
        got = f(x_data, y_data, **kwargs)
        rows = kwargs["batch"] if rows is None else rows
        want = f.as_pytensor(x_data.data[rows], y_data)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-10)
        print(f"{label:>15}: mean {np.round(got[0][:3], 4)}..., sum {got[1]:.4f}, "
              f"max {got[2]:.4f}, gathered {got[3].shape} rows; equals serial")
    print(f"demo 1 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
