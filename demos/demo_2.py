"""Demo 2: synk.Data, numpy arrays in OS shared memory that every process reads.

A ``synk.Data`` is made any time after ``fork`` (before or after ``distribute``) and
passed to functions without copying. It reads and writes like a numpy array
(``x.data`` is the array itself), and its memory is managed like a buffer:

- ``set_value`` writes a new value, reallocating only when it does not fit
  (``oversize=1.1`` reserves 10% room to grow); a smaller value reuses the memory;
- ``set_length`` / ``set_shape`` change the visible rows within the allocation;
- ``free_memory`` releases it in every process (the object stays usable);
- the dtype is fixed: safe casts (float32 into float64) happen by themselves,
  others need ``force_cast=True``;
- a ``Data`` pickles to a handle that another Python process opens.

After each step a function reads the Data, and its result is compared with the
plain PyTensor function on ``x.data``.

    python demos/demo_2.py [--n-parallel N]
"""

import argparse
import multiprocessing
import pickle

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def _double_in_place(handle):
    """Runs in an unrelated ('spawn') Python process: open the Data and write into it."""
    shared = pickle.loads(handle)
    shared[:] = shared.data * 2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)
    x = pt.dmatrix("x")
    outputs = [x.sum(axis=0), x.max(), pt.cast(x.shape[0], "float64")]
    f = synk.function([x], [(outputs[0], "sum"), (outputs[1], "max"), (outputs[2], "sum")])
    plain = pytensor.function([x], outputs)
    synk.distribute()

    def check(label, d):
        for got, want in zip(f(d), plain(d.data), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=label)
        print(f"{label:<46} shape {str(d.shape):<9} alloc_size {d.alloc_size:>5}: "
              "f equals the plain function")

    rng = np.random.default_rng(2)
    d = synk.data(rng.normal(size=(5, 4)))
    print(f"{d}: dtype {d.dtype}, ndim {d.ndim}, len {len(d)}, type(d.data) "
          f"{type(d.data).__name__}")
    check("made from a (5, 4) array", d)

    d[3] = 0  # numpy-style writes and reads, in place
    np.testing.assert_array_equal(d[3], np.zeros(4))
    d[:] = rng.normal(size=(5, 4))
    check("row 3 zeroed, then all rows overwritten", d)

    d.set_value(rng.normal(size=(200, 4)), oversize=1.1)  # too big: reallocate, 10% extra
    assert d.alloc_size == 880
    check("set_value 200 rows, oversize 1.1 (new memory)", d)
    d.set_value(rng.normal(size=(210, 4)))  # fits in the 220 rows reserved
    assert d.alloc_size == 880
    check("set_value 210 rows (fits: same memory)", d)
    d.set_length(100)  # fewer visible rows; fill them
    d[:] = np.arange(400.0).reshape(100, 4)
    check("set_length 100, filled in place", d)

    d.set_value(np.ones((3, 4), dtype=np.float32))  # float32 -> float64: a safe cast
    assert d.dtype == np.float64 and d.alloc_size == 880
    check("set_value float32 rows (safe cast)", d)
    d.free_memory()  # released in every process
    d.set_value(np.full((6, 4), 7.0))  # allocates again, just enough
    assert d.alloc_size == 24
    check("free_memory, then set_value 6 rows", d)
    try:
        d.set_value(np.arange(24).reshape(6, 4) + 0.5j)
    except TypeError as exc:
        print(f"complex into float64 is refused: {exc}")
    d.set_value(np.arange(24, dtype=np.int64).reshape(6, 4), force_cast=True)
    check("set_value int64 rows with force_cast", d)

    context = multiprocessing.get_context("spawn")
    other = context.Process(target=_double_in_place, args=(pickle.dumps(d),))
    other.start()
    other.join()
    np.testing.assert_array_equal(d.data, np.arange(24.0).reshape(6, 4) * 2)
    check("doubled by another Python process", d)
    print(f"demo 2 passed on {n} processes")
    synk.close()


if __name__ == "__main__":
    main()
