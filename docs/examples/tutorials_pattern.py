"""The Theano tutorials' pattern: data in shared variables, minibatches sliced by givens."""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(2)
rng = np.random.default_rng(0)

# -- the pattern: every process holds the whole data; index picks the minibatch ----
data_x = pytensor.shared(rng.normal(size=(1000, 5)), name="data_x")
data_y = pytensor.shared(rng.integers(0, 3, size=1000).astype("float64"), name="data_y")
W = pytensor.shared(np.zeros((5, 3)), name="W")
index, x, y = pt.lscalar("index"), pt.dmatrix("x"), pt.ivector("y")
batch_size = 25
p = pt.special.softmax(x.dot(W), axis=-1)
cost = -pt.log(p[pt.arange(y.shape[0]), y]).mean()
givens = {x: data_x[index * batch_size:(index + 1) * batch_size],
          y: pt.cast(data_y, "int32")[index * batch_size:(index + 1) * batch_size]}
train = synk.function(inputs=[index], outputs=[cost, (p.argmax(axis=1), "gather")],
                      updates=[(W, W - 0.1 * pytensor.grad(cost, W))], givens=givens)
serial = pytensor.function([index], [cost, p.argmax(axis=1)], givens=givens)
synk.distribute()

for i in range(40):
    want = serial(i)                  # the serial function, before the step
    got = train(i)                    # process 0: rows 0-12 of the slice, process 1: 13-24
    synk.all_reduce(W, op="avg")      # the parameters, identical again
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_array_equal(got[1], want[1])
# -- end of the pattern ---------------------------------------------------------------
print("index is broadcast:", train.bcast_inputs)   # [index]
print("cost:", round(float(train(0)[0]), 10))  # PyTensor versions differ in the last digits
synk.close()
