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
train(rows, np.arange(4.0))
train(rows, np.arange(4.0), num_slices=2)
values = synk.get_value(1, p)
np.testing.assert_allclose(values, synk.get_value(0, p))
synk.close()
print("ok")
