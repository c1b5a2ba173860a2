"""Calling a synk.Function: batch, num_slices, output_subset, updates, batch_s."""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(2)
rng = np.random.default_rng(0)

# -- batch: select rows of the scattered inputs before they are split --------------
x = pt.dmatrix("x")
f = synk.function(inputs=[x], outputs=[x.mean(axis=0), (x.sum(), "sum"), (x, "gather")])
synk.distribute()
data = synk.data(rng.normal(size=(100, 3)))

shuffled = rng.permutation(100)[:32]
for batch, rows in [
    (None, data.data),
    (10, data.data[:10]),
    (slice(20, 50), data.data[20:50]),
    (shuffled, data.data[shuffled]),
]:
    got = f(data, batch=batch)
    want = f.as_pytensor(rows)  # the serial function on the selected rows
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)

# -- num_slices: each process runs its rows in consecutive slices -----------------
np.testing.assert_allclose(f(data, num_slices=7)[0], f(data)[0], rtol=1e-12)

# -- output_subset: compute and return only some outputs ---------------------------
(total,) = f(data, output_subset=[1])  # a list of outputs returns a list
np.testing.assert_allclose(total, data.data.sum(), rtol=1e-12)

# -- updates are applied in every process, each from its own rows -----------------
seen = pytensor.shared(np.int64(0), name="seen")
count = synk.function(inputs=[x], outputs=(x.shape[0], "sum"), updates=[(seen, seen + x.shape[0])])
print("rows counted:", count(data))  # 100
print("the master's `seen`:", seen.get_value())  # 50: only the master's own rows
assert seen.get_value() == 50

# -- updates with num_slices: computed from the original values, applied once -----
w = pytensor.shared(np.zeros(3), name="w")
step = synk.function(inputs=[x], updates=[(w, w - 0.1 * x.mean(axis=0))])  # op "avg"
step(data, num_slices=4)
sliced = w.get_value()
synk.broadcast(w, np.zeros(3))  # reset w in every process
step(data)
np.testing.assert_allclose(sliced, w.get_value(), rtol=1e-12)

# -- sliceable_shareds and batch_s: rows already held by each process --------------
table = pytensor.shared(np.arange(12.0).reshape(6, 2), name="table")
table_sum = synk.function(inputs=[], outputs=(table.sum(), "sum"), sliceable_shareds=[table])
# Every process holds the whole table here (nothing was scattered into it), so:
print("all rows, in each of 2 processes:", table_sum())  # 2 * 66
print("rows 0-1 in each process:", table_sum(batch_s=slice(0, 2)))  # 2 * (0+1+2+3)
print("rank 0 rows [0], rank 1 rows [4, 5]:", table_sum(batch_s=[[0], [4, 5]]))
assert table_sum() == 132.0
assert table_sum(batch_s=slice(0, 2)) == 12.0
assert table_sum(batch_s=[[0], [4, 5]]) == 1.0 + 8 + 9 + 10 + 11

# -- invalid calls fail in the master, before any worker moves ---------------------
try:
    f(data, batch=[0, 100])
except ValueError as exc:
    print("ValueError:", exc)
y = pt.dvector("y")
residual = synk.function(inputs=[x, y], outputs=((x.sum(axis=1) - y) ** 2).mean())
try:
    residual(rng.normal(size=(1000, 3)), rng.normal(size=998))
except ValueError as exc:
    print("ValueError:", exc)
synk.close()
