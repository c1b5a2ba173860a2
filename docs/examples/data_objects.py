"""synk.data: numpy arrays in POSIX shared memory, used by every process without copies."""

import multiprocessing
import pickle

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk


def double_in_place(handle: bytes) -> None:
    """Runs in an unrelated Python process: open the Data by its pickle and write."""
    shared = pickle.loads(handle)
    shared[:] = shared.data * 2


def main() -> None:
    synk.fork(2)
    x = pt.dmatrix("x")
    col_sum = synk.function(inputs=[x], outputs=(x.sum(axis=0), "sum"))
    synk.distribute()

    # From a value; room for 50% more items than the value holds.
    d = synk.data(np.ones((6, 2)), oversize=1.5, name="d")
    print(d, "| visible items:", d.size)
    assert (d.shape, d.size, d.alloc_size) == ((6, 2), 12, 18)

    d.set_length(9)  # grows within the allocation: no new memory
    d[6:] = 2.0  # numpy indexing on the shared memory itself
    print("after set_length(9):", col_sum(d))  # workers see the new rows; no redistribute
    np.testing.assert_array_equal(col_sum(d), [12.0, 12.0])

    d.set_value(np.full((20, 2), 0.5))  # 40 items > 18 allocated: new memory
    print("after set_value:", d)
    np.testing.assert_array_equal(col_sum(d), [10.0, 10.0])

    d.free_memory()  # released in every process; the object stays usable
    assert d.shape == (0, 2) and d.alloc_size == 0
    d.set_value(np.eye(2))  # allocates again

    # Typed but empty, or typed from a PyTensor variable.
    e = synk.data(dtype="float32", ndim=2)
    v = synk.data(var=pt.fmatrix("v"), shape=(3, 4))  # zeros, name "v"
    assert e.shape == (0, 0) and v.dtype == np.float32 and v.name == "v"
    try:
        v.set_value(np.ones((3, 4)))  # float64 into float32: refused unless force_cast
    except TypeError as exc:
        print("TypeError:", exc)
    v.set_value(np.ones((3, 4)), force_cast=True)

    # A pickled Data is a handle: another process on this machine maps the same memory.
    spawn = multiprocessing.get_context("spawn")
    child = spawn.Process(target=double_in_place, args=(pickle.dumps(d),))
    child.start()
    child.join()
    print("after another process doubled it:", d.data.tolist())
    np.testing.assert_array_equal(d.data, 2 * np.eye(2))
    synk.close()


if __name__ == "__main__":  # required by the "spawn" start method
    main()
