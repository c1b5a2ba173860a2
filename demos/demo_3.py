"""Demo 3: shared variables, one copy per process: scatter, batch_s, and collectives.

Every process holds its own copy of each shared variable of the distributed
functions. This demo scatters a data set into one of them (each process keeps its
block of rows), broadcasts a parameter into another, and runs a function with no
inputs that reads the data variable, declared in ``sliceable_shareds``: whole, in
``num_slices`` pieces, with one ``batch_s`` selection used by every process, and
with one selection per process. Then it inspects per-rank values (``get_lengths``,
``gather``, ``get_value``), makes the parameter differ per rank (``set_value``) and
averages it back (``all_reduce``), and finally gives every process all the rows
(``all_gather``). Every result is checked against numpy on the whole data set.

    python demos/demo_3.py [--n-parallel N] [--rows R]
"""

from __future__ import annotations

import argparse

import numpy as np
import pytensor

import synkhronos as synk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--rows", type=int, default=101)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)
    x_s = pytensor.shared(np.zeros((1, 4)), name="x_s")  # data rows, scattered below
    w = pytensor.shared(np.zeros((4, 3)), name="w")  # a parameter, the same everywhere
    z = x_s.dot(w)
    f = synk.function(
        inputs=[],
        outputs=[z.mean(axis=0), (z.sum(), "sum"), (z[:, 0], "gather")],
        sliceable_shareds=[x_s],  # subject to batch_s and num_slices
    )
    synk.distribute()  # the shared variables travel with the functions
    print("lengths of x_s before scatter:", synk.get_lengths(x_s))

    rng = np.random.default_rng(3)
    x_data, w_data = rng.normal(size=(args.rows, 4)), rng.normal(size=(4, 3))
    synk.scatter(x_s, x_data)  # each process: its block of rows, in rank order
    synk.broadcast(w, w_data)  # each process: all of w_data

    lengths = synk.get_lengths(x_s)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    base, extra = divmod(args.rows, n)
    assert lengths == [base + (rank < extra) for rank in range(n)], lengths
    np.testing.assert_array_equal(synk.gather(x_s, nd_up=0), x_data)  # concatenated
    np.testing.assert_array_equal(synk.get_value(n - 1, x_s), x_data[starts[-2]:])
    for rank_w in synk.gather(w):  # stacked: one w per rank
        np.testing.assert_array_equal(rank_w, w_data)
    print(f"lengths of x_s after scatter of {args.rows} rows: {lengths}; gather equals "
          "the data; w equals w_data in every rank")

    def check(label: str, rows: np.ndarray, **kwargs) -> None:
        """f(**kwargs) against numpy on the rows it should have selected."""
        mean, total, column = f(**kwargs)
        want = x_data[rows] @ w_data
        np.testing.assert_allclose(mean, want.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(total, want.sum(), rtol=1e-12)
        np.testing.assert_allclose(column, want[:, 0], rtol=1e-12)
        print(f"{label:>28}: {len(rows):>3} rows, sum {total:9.4f}; equals numpy")

    everything = np.arange(args.rows)
    check("whole", everything)
    check("3 slices per process", everything, num_slices=3)
    first_four = np.concatenate([starts[r] + np.arange(min(4, lengths[r])) for r in range(n)])
    check("batch_s=slice(0, 4), all", first_four, batch_s=slice(0, 4))
    pick = np.array([2, 0])  # the same local rows in every process (all hold >= 3)
    check("batch_s=[2, 0], all", np.concatenate([starts[r] + pick for r in range(n)]),
          batch_s=pick)
    per_rank = [rng.permutation(lengths[r])[:r + 2] for r in range(n)]  # one per process
    check("batch_s one per process", np.concatenate([starts[r] + per_rank[r]
                                                     for r in range(n)]), batch_s=per_rank)
    check("batch_s per process, sliced", np.concatenate([starts[r] + per_rank[r]
                                                         for r in range(n)]),
          batch_s=per_rank, num_slices=2)

    for rank in range(n):  # make w differ: rank r holds w_data + r
        synk.set_value(rank, w, w_data + rank)
    np.testing.assert_array_equal(synk.get_value(n - 1, w), w_data + (n - 1))
    synk.all_reduce(w, op="avg")  # every process: the mean over processes
    for rank_w in synk.gather(w):
        np.testing.assert_allclose(rank_w, w_data + (n - 1) / 2, rtol=1e-12)
    print(f"after set_value(rank, w, w_data + rank) and all_reduce(avg): every w equals "
          f"w_data + {(n - 1) / 2}")

    synk.all_gather(x_s)  # every process now holds every row
    assert synk.get_lengths(x_s) == [args.rows] * n
    np.testing.assert_array_equal(synk.get_value(n - 1, x_s), x_data)
    print(f"after all_gather: lengths of x_s {synk.get_lengths(x_s)}")
    print(f"demo 3 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
