"""Demo 1: one PyTensor graph computed on every core, its outputs reduced as the serial function's.

The program flow of every synkhronos program:

1. ``synk.fork()`` starts the worker processes (before any graph is built);
2. build the graph as usual and make the function with ``synk.function``: ``inputs``
   are split by rows (axis 0) across the processes, ``bcast_inputs`` are used whole
   by every process, and each output names how the processes' results combine:
   ``"avg"`` (the default; weighted by each process's rows), ``"sum"``, ``"max"``,
   ``"min"``, ``"prod"``, ``"gather"`` (the rows put back together in order) or
   ``None`` (no reduction: the master's own result);
3. ``synk.distribute()`` gives the functions to the workers;
4. put the data in shared memory (``f.build_inputs``, or ``synk.data``) and call.

Each result is compared with the plain PyTensor function on the whole data; the
``None`` output with the plain function on the master's own rows. ``num_slices=4``
then runs each process's rows in four pieces (less memory) for the same results
(``output_subset`` picks the outputs to compute, as in PyTensor).

    python demos/demo_1.py [--n-parallel N] [--rows R]
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def check(label, got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=label)
    print(f"{label}: equals the plain PyTensor function")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--rows", type=int, default=1003, help="rows of x (need not divide)")
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)  # 1. workers first
    x = pt.dmatrix("x")
    y = pt.dmatrix("y")
    z = x.dot(y)  # each row of x gives one row of z: parallel over the rows of x
    reduced = [z.mean(axis=0), z.sum(axis=0), z.max(axis=0), z.min(axis=0), z[:, 0]]
    f = synk.function(inputs=[x], bcast_inputs=[y],  # 2.
                      outputs=[reduced[0], (reduced[1], "sum"), (reduced[2], "max"),
                               (reduced[3], "min"), (reduced[4], "gather"), (z.sum(), None)])
    plain = pytensor.function([x, y], reduced + [z.sum()])  # the serial program
    synk.distribute()  # 3.

    rng = np.random.default_rng(1)
    x_dat, y_dat = rng.normal(size=(args.rows, 10)), rng.normal(size=(10, 5))
    x_synk, y_synk = f.build_inputs(x_dat, y_dat)  # 4. two synk.Data in shared memory

    master_rows = args.rows // n + (args.rows % n > 0)  # rank 0's block: one extra row
    want = plain(x_dat, y_dat)
    want[-1] = plain(x_dat[:master_rows], y_dat)[-1]  # None: the master's own result
    check(f"avg, sum, max, min, gather, None on {n} processes", f(x_synk, y_synk), want)
    reduced_only = list(range(len(reduced)))  # output_subset: compute only these outputs
    check("avg ... gather in 4 slices per process",
          f(x_synk, y_synk, num_slices=4, output_subset=reduced_only), want[:-1])
    check("f.as_pytensor (the master alone, all rows)", f.as_pytensor(x_dat, y_dat)[:-1],
          plain(x_dat, y_dat)[:-1])
    check("numpy arrays as arguments (copied for the call)", f(x_dat, y_dat), want)
    print(f"demo 1 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
