"""The introductory example: fork, function, distribute, data, close.

Every result is checked against the plain PyTensor function on the whole data.
"""

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk

n = synk.fork()  # 1. before building graphs: one process per core, this one is rank 0

x = pt.dmatrix("x")  # rows of data: scattered along axis 0
w = pt.dvector("w")  # a weight vector: every process uses it whole
y = x.dot(w)
f = synk.function(
    inputs=[x],
    bcast_inputs=[w],
    outputs=[y.mean(), (y.sum(), "sum"), (y.max(), "max"), (y, "gather")],
)
synk.distribute()  # 2. ship f to every worker

rng = np.random.default_rng(0)
x_data = synk.data(rng.normal(size=(1001, 4)))  # 3. 1001 rows in shared memory
w_value = np.array([1.0, -2.0, 0.5, 3.0])

mean, total, largest, rows = f(x_data, w_value)  # 4. every process runs its rows
print(f"{n} processes; {rows.shape[0]} rows gathered")
print(f"mean {mean:.6f}   sum {total:.6f}   max {largest:.6f}")

serial = f.as_pytensor(x_data, w_value)  # the plain function, in the master alone
for parallel, plain in zip([mean, total, largest, rows], serial, strict=True):
    np.testing.assert_allclose(parallel, plain, rtol=1e-12)
print("all four equal the serial function's results")

synk.close()  # 5. stop the workers, free the shared memory (also runs at exit)
