"""JAX-mode functions built after a JAX update has run still distribute and agree.

Run as its own process: initialising JAX in a test runner would forbid later forks.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions.train import make_train_function

synk.fork(2)
w = pytensor.shared(np.ones(3), name="w")
x = pt.dmatrix("x")
f = synk.function([x], (x.dot(w), "gather"), updates=[(w, w * 2)], mode="JAX")
synk.distribute()
rows = np.arange(12.0).reshape(4, 3)
np.testing.assert_allclose(f(rows), rows.dot(np.ones(3)))
# After the update, w's storage holds a JAX array in every process.
g = synk.function([x], (x.dot(w).sum(), "sum"), mode="JAX")  # distributed on its call
np.testing.assert_allclose(g(rows), rows.dot(np.full(3, 2.0)).sum())
np.testing.assert_allclose(f(rows, num_slices=2), rows.dot(np.full(3, 2.0)))  # sliced variant

p = pytensor.shared(np.zeros(3), name="p")
t = pt.dvector("t")
loss = ((x.dot(p) - t) ** 2).mean()
train = make_train_function(loss, [p], [x, t], "sgd", compile_kwargs={"mode": "JAX"},
                            learning_rate=0.1)
assert not train.sharded  # the default with the JAX backend
q = pytensor.shared(np.zeros(3), name="q")
sharded = make_train_function(((x.dot(q) - t) ** 2).mean(), [q], [x, t], "sgd",
                              compile_kwargs={"mode": "JAX"}, sharded=True,
                              learning_rate=0.1)  # pieces of one length, as on a device
serial = np.zeros(3)
for num_slices in (1, 2):
    train(rows, np.arange(4.0), num_slices=num_slices)
    sharded(rows, np.arange(4.0), num_slices=num_slices)
    serial = serial - 0.1 * 2 * rows.T.dot(rows.dot(serial) - np.arange(4.0)) / 4
for var in (p, q):
    for rank in (0, 1):
        np.testing.assert_allclose(synk.get_value(rank, var), serial, rtol=1e-12)
synk.close()
print("ok")
