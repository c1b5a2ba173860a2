"""Demo 3: shared variables, one copy per process, and the collectives that move them.

After ``distribute`` every process holds its own copy of each shared variable its
functions use. This demo keeps a data set in one (``s_x``: each process its block of
rows, placed by ``synk.scatter``) and a parameter in another (``s_y``: the same in
every process, placed by ``synk.broadcast``), and computes with a function that has
no inputs at all. ``s_x`` is declared in ``sliceable_shareds``: it holds data rows,
so its "avg" output is weighted by rows and ``num_slices`` splits it.

Then the inspection and collective calls: ``get_lengths``/``get_shapes``,
``gather`` (stacked per process, ``nd_up=1``, or concatenated, ``nd_up=0``),
``get_value``/``set_value`` on one rank, ``reduce`` and ``all_reduce`` (avg, sum,
max...), and ``all_gather``. Results are checked against the plain PyTensor function
and numpy on the whole data. The number of rows does not divide by the number of
processes: blocks differ by one row, the first ranks taking the extra rows.

A shared variable that no distributed function uses does not exist in the workers:
collectives refuse it, naming it.

    python demos/demo_3.py [--n-parallel N] [--rows R]
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--rows", type=int, default=101)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)
    s_x = pytensor.shared(np.ones((100, 4)), name="s_x")  # data rows
    s_y = pytensor.shared(np.zeros((4, 5)), name="s_y")  # a parameter
    s_unused = pytensor.shared(np.zeros((5, 5)), name="s_unused")  # in no function
    z = s_x.dot(s_y)
    f = synk.function(inputs=[], outputs=[z.mean(axis=0), (z.sum(), "sum")],
                      sliceable_shareds=[s_x])
    x, y = pt.dmatrix("x"), pt.dmatrix("y")
    plain = pytensor.function([x, y], [x.dot(y).mean(axis=0), x.dot(y).sum()])
    synk.distribute()  # the shared variables travel with the function
    print(f"lengths of s_x: {synk.get_lengths(s_x)}, shapes {synk.get_shapes(s_x)}")

    rng = np.random.default_rng(3)
    x_dat, y_dat = rng.normal(size=(args.rows, 4)), rng.normal(size=(4, 5))
    synk.scatter(s_x, x_dat)  # each process: its block of rows
    synk.broadcast(s_y, y_dat)  # each process: all of y_dat
    lengths = synk.get_lengths(s_x)
    print(f"after scatter of {args.rows} rows: lengths {lengths}")
    assert sum(lengths) == args.rows and max(lengths) - min(lengths) <= 1
    np.testing.assert_array_equal(synk.gather(s_x, nd_up=0), x_dat)  # rows back in order
    np.testing.assert_array_equal(synk.get_value(n - 1, s_x), x_dat[-lengths[-1]:])
    for y_rank in synk.gather(s_y):  # nd_up=1: one value per process
        np.testing.assert_array_equal(y_rank, y_dat)
    print("gather(s_x, nd_up=0) equals the data; every rank's s_y equals y_dat")

    for label, kwargs in (("f()", {}), ("f(num_slices=3)", {"num_slices": 3})):
        for got, want in zip(f(**kwargs), plain(x_dat, y_dat), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12)
        print(f"{label}: equals the plain PyTensor function on all rows")

    for rank in range(n):  # make the parameter differ: rank r holds y_dat + r
        synk.set_value(rank, s_y, y_dat + rank)
    stacked = synk.gather(s_y)
    np.testing.assert_array_equal(stacked[-1], y_dat + (n - 1))
    total = synk.reduce(s_y, op="sum", in_place=False)  # returned; no copy changed
    np.testing.assert_allclose(total, stacked.sum(axis=0), rtol=1e-12)
    synk.all_reduce(s_y, op="max")  # every process: the elementwise max over processes
    for y_rank in synk.gather(s_y):
        np.testing.assert_array_equal(y_rank, y_dat + (n - 1))
    synk.set_value(0, s_y, y_dat)
    synk.all_reduce(s_y, op="avg")  # the plain mean over processes
    for y_rank in synk.gather(s_y):
        np.testing.assert_allclose(y_rank, y_dat + (n - 1) * (n - 1) / n, rtol=1e-12)
    print("set_value per rank, reduce(sum), all_reduce(max), all_reduce(avg): as numpy")

    synk.all_gather(s_x)  # every process: all the rows
    assert synk.get_lengths(s_x) == [args.rows] * n
    np.testing.assert_array_equal(synk.get_value(n - 1, s_x), x_dat)
    print(f"after all_gather: lengths of s_x {synk.get_lengths(s_x)}")
    try:
        synk.gather(s_unused)
    except ValueError as exc:
        print(f"gather(s_unused): ValueError: {exc}")
    else:
        raise AssertionError("a shared variable in no function was accepted")
    print(f"demo 3 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
