"""A small synkhronos program for the install and temporary-file checks.

Usage: ``python private_program.py``

It forks 2 processes (``fork()`` pre-imports PyTensor's Numba backend, as in any
program), builds one function in ``FAST_COMPILE`` mode (nothing for Numba to
compile: PyTensor's own compile cache and its generated-source temporary files are
PyTensor's business, not this check's), distributes it, calls it on a ``synk.data``
with a shuffled batch and on a numpy array, runs ``all_reduce`` on its shared
variable, closes, and prints one JSON line: ``{"module": <where synkhronos was
imported from>, "prefix": <its segment prefix>, "ok": true}``. Any failure raises
(non-zero exit status).

The checks run it with the package copied to a read-only directory, with HOME,
TMPDIR and the working directory pointed at fresh empty directories, and look at
what it left behind.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import testing


def main() -> None:
    n = synk.fork(2)
    prefix = testing.program_prefix()
    w = pytensor.shared(np.ones(3), name="w")
    x = pt.dmatrix("x")
    f = synk.function([x], [(x.dot(w), "gather"), (x.sum(), "sum")], mode="FAST_COMPILE")
    synk.distribute()
    values = np.arange(24.0).reshape(8, 3)
    batch = [7, 2, 5, 0, 1]
    rows, total = f(synk.data(values), batch=batch)
    np.testing.assert_allclose(rows, values[batch].dot(np.ones(3)))
    assert total == values[batch].sum()
    assert f(values)[1] == values.sum()
    synk.all_reduce(w, op="sum")
    np.testing.assert_allclose(synk.get_value(n - 1, w), np.full(3, float(n)))
    synk.close()
    sys.stdout.write(json.dumps({"module": synk.__file__, "prefix": prefix, "ok": True}) + "\n")


if __name__ == "__main__":
    main()
