"""Demo 5: ``batch_s`` picks rows of scattered shared variables, inside each process.

Where ``batch`` selects rows of a call's inputs before they are split, ``batch_s``
applies after the split, to the rows each process already holds in its
``sliceable_shareds`` (here a data set scattered once with ``synk.scatter``). It is
either one selection that every process applies to its own block (a slice or an
index array) or a list of selections, one per process. ``num_slices`` splits the
selected rows further, within each process.

The same function can be written on an ordinary input variable and pointed at the
shared data with ``givens=[(x, s_x)]``: the pattern of the MNIST demo
``train_mnist_gpu_data.py``, where the network's input variable is replaced by the
scattered training set. Both forms are run and compared with the plain PyTensor
function on the rows they select.

    python demos/demo_5.py [--n-parallel N] [--rows-per-process R]
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--rows-per-process", type=int, default=200)
    args = parser.parse_args()
    per = args.rows_per_process

    n = synk.fork(args.n_parallel)
    s_x = pytensor.shared(np.zeros((per, 10)), name="s_x")
    s_y = pytensor.shared(np.zeros((10, 5)), name="s_y")
    z = s_x.dot(s_y)
    f = synk.function(inputs=[], outputs=[(z.sum(axis=0), "sum"), z.mean(axis=0)],
                      sliceable_shareds=[s_x])
    x = pt.dmatrix("x")  # the same graph on an input variable, fed from s_x by givens
    zx = x.dot(s_y)
    g = synk.function(inputs=[], outputs=[(zx.sum(axis=0), "sum"), zx.mean(axis=0)],
                      givens=[(x, s_x)], sliceable_shareds=[s_x])
    plain = pytensor.function([x], [zx.sum(axis=0), zx.mean(axis=0)])  # reads s_y
    synk.distribute()

    rng = np.random.default_rng(5)
    x_dat = rng.normal(size=(per * n, 10))
    synk.scatter(s_x, x_dat)  # process r holds rows r*per .. (r+1)*per - 1
    synk.broadcast(s_y, rng.normal(size=(10, 5)))
    s_y.set_value(synk.get_value(0, s_y))  # the master's copy, for the plain function
    blocks = [x_dat[r * per:(r + 1) * per] for r in range(n)]

    half = per // 2
    selections = {
        f"slice({half}, {per}) in every process": slice(half, per),
        "one index array for all": rng.integers(0, per, size=per // 2),
        "one slice per process": [slice(r, half + r) for r in range(n)],
        "one index array per process": [rng.integers(0, per, size=half + r) for r in range(n)],
    }
    for label, batch_s in selections.items():
        per_rank = batch_s if isinstance(batch_s, list) else [batch_s] * n
        rows = np.concatenate([block[sel] for block, sel in zip(blocks, per_rank, strict=True)])
        want = plain(rows)
        for function, name in ((f, "f"), (g, "g (givens)")):
            for slices in (1, 4):
                got = function(batch_s=batch_s, num_slices=slices)
                for got_i, want_i in zip(got, want, strict=True):
                    np.testing.assert_allclose(got_i, want_i, rtol=1e-10,
                                               err_msg=f"{label}, {name}, {slices} slices")
        print(f"batch_s = {label:<34}: {len(rows):>4} rows; f and g, whole and in 4 slices, "
              "equal the plain function")
    print(f"demo 5 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
