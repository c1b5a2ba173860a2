"""Demo 4: ``batch`` picks the rows of a call; a minibatch Data supplies its first rows.

``f(..., batch=...)`` selects rows of the scattered inputs before they are split
among the processes: an int ``k`` (the first k rows), a slice, or an array of
indices (a shuffled minibatch, say). Each process copies its own share of the
selected rows out of shared memory itself, in parallel. Broadcast inputs are not
affected.

A Data made with ``minibatch=True`` (here ``w``) is already a minibatch: it is not
indexed by ``batch``; the call takes its first ``len(selection)`` rows, in order,
next to the selected rows of ``x`` (so a program can refill a small buffer for each
step). ``build_inputs`` takes one ``minibatch`` flag per input.

``num_slices=4`` then runs each process's share in four pieces. The "avg" output is
weighted by rows, so it equals the serial mean even when the rows do not split
evenly over processes or slices (the original Synkhronos warned it might not).
Every result is compared with the plain PyTensor function on the selected rows.

    python demos/demo_4.py [--n-parallel N]
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)
    x = pt.dmatrix("x")
    w = pt.dmatrix("w")
    y = pt.dmatrix("y")
    z = (x + w).dot(y)
    outputs = [z.sum(axis=0), z.mean(axis=0)]
    f = synk.function(inputs=[x, w], bcast_inputs=[y], outputs=[(outputs[0], "sum"), outputs[1]])
    plain = pytensor.function([x, w, y], outputs)
    synk.distribute()

    rng = np.random.default_rng(4)
    x_dat = rng.normal(size=(1000, 10))
    w_dat = rng.normal(size=(150, 10))  # a buffer: at least as long as any selection
    y_dat = rng.normal(size=(10, 5))
    x_synk, w_synk, y_synk = f.build_inputs(x_dat, w_dat, y_dat,
                                            minibatch=[False, True, False])
    assert w_synk.minibatch and not x_synk.minibatch

    selections = {
        "batch=100 (the first 100 rows)": (100, np.arange(100)),
        "batch=slice(100, 201)": (slice(100, 201), np.arange(100, 201)),
        "batch=an array of 113 indices": (idx := rng.integers(0, 1000, size=113), idx),
    }
    for label, (batch, rows) in selections.items():
        want = plain(x_dat[rows], w_dat[:len(rows)], y_dat)
        for slices in (1, 4):
            got = f(x_synk, w_synk, y_synk, batch=batch, num_slices=slices)
            for g, wt in zip(got, want, strict=True):
                np.testing.assert_allclose(g, wt, rtol=1e-10, err_msg=f"{label}, {slices}")
        print(f"{label:<32}: sum and avg equal the plain function on x[batch] and "
              f"w[:{len(rows)}], whole and in 4 slices")

    w_synk.set_value(rng.normal(size=(113, 10)))  # refill the buffer for the next step
    order = rng.permutation(1000)[:113]
    got = f(x_synk, w_synk, y_synk, batch=order)
    for g, wt in zip(got, plain(x_dat[order], w_synk.data, y_dat), strict=True):
        np.testing.assert_allclose(g, wt, rtol=1e-10)
    print(f"{'refilled buffer, shuffled batch':<32}: equals the plain function")
    print(f"demo 4 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
