"""Collectives on shared variables, with every rank's value shown after each step."""

import numpy as np
import pytensor

import synkhronos as synk

n = synk.fork(3)
w = pytensor.shared(np.zeros(2), name="w")
rows = pytensor.shared(np.zeros((0, 2)), name="rows")
# Collectives act on the shared variables of distributed functions.
use_w = synk.function(inputs=[], outputs=w.sum())
total = synk.function(inputs=[], outputs=(rows.sum(), "sum"), sliceable_shareds=[rows])
synk.distribute()


def show(label, var):
    """Print and return every rank's value of ``var``."""
    values = [synk.get_value(rank, var).tolist() for rank in range(n)]
    print(f"{label:<24}" + "   ".join(f"rank {r}: {v}" for r, v in enumerate(values)))
    return values


for rank in range(n):  # give each rank its own w: [1, 2], [4, 5], [7, 8]
    synk.set_value(rank, w, [3.0 * rank + 1, 3.0 * rank + 2])
assert show("set_value(r, w, ...)", w) == [[1, 2], [4, 5], [7, 8]]

print("gather(w)              ", synk.gather(w).tolist())
print("gather(w, nd_up=0)     ", synk.gather(w, nd_up=0).tolist())
print("reduce(w, 'sum', in_place=False)", synk.reduce(w, op="sum", in_place=False).tolist())

synk.reduce(w, op="max")  # into the master's w only
assert show("reduce(w, 'max')", w) == [[7, 8], [4, 5], [7, 8]]

synk.all_reduce(w)  # op "avg": the plain mean over processes
assert show("all_reduce(w)", w) == [[6, 7]] * 3

synk.broadcast(w, [1.0, 2.0])  # a new value, into every rank
assert show("broadcast(w, [1, 2])", w) == [[1, 2]] * 3

data = np.arange(14.0).reshape(7, 2)
synk.scatter(rows, data)  # 7 rows over 3 ranks: 3, 2, 2
print("scatter(rows, data)     lengths", synk.get_lengths(rows))
assert synk.get_lengths(rows) == [3, 2, 2]
print("a function's sum of its rows, op 'sum':", total())
assert total() == data.sum()

synk.all_gather(rows)  # every rank: all 7 rows, in rank order
print("all_gather(rows)        shapes", synk.get_shapes(rows))
assert synk.get_shapes(rows) == [(7, 2)] * 3
np.testing.assert_array_equal(synk.get_value(2, rows), data)
synk.close()
