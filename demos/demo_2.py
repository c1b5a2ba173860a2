"""Demo 2: synk.data, numpy arrays in shared memory that every process maps.

Writes, grows past the allocation, shrinks within it, frees and reuses a Data while
a function keeps using it, and opens it from an unrelated Python process. Results
are checked against the plain PyTensor function.

    python demos/demo_2.py [--n-parallel N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import pickle

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk


def _double_in_place(handle: bytes) -> None:
    """Runs in a separate 'spawn' process: open the Data by its pickle and write."""
    shared = pickle.loads(handle)
    shared[:] = shared.data * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)
    x = pt.dmatrix("x")
    f = synk.function([x], [(x.sum(axis=0), "sum"), (x.max(), "max")])
    synk.distribute()

    def check(d: synk.Data) -> None:
        got, want = f(d), f.as_pytensor(d.data)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w)

    d = synk.data(np.arange(12.0).reshape(4, 3), oversize=2)  # room for 8 rows
    print(d, "| alloc_size", d.alloc_size)
    check(d)
    d.set_value(np.ones((7, 3)))  # fits: no reallocation
    check(d)
    d.set_value(np.ones((50, 3)))  # does not fit: a new segment every process maps
    check(d)
    d.set_length(5)  # shrink within the allocation
    check(d)
    d[:] = np.arange(15.0).reshape(5, 3)
    check(d)

    context = multiprocessing.get_context("spawn")
    other = context.Process(target=_double_in_place, args=(pickle.dumps(d),))
    other.start()
    other.join()
    np.testing.assert_array_equal(d.data, np.arange(15.0).reshape(5, 3) * 2)
    print("another process wrote into it:", d.data[:2].tolist(), "...")
    check(d)

    d.free_memory()  # released in every process; the object stays usable
    d.set_value(np.full((3, 3), 9.0))
    check(d)
    print(f"demo 2 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
