"""Data-parallel training: make_train_function, and the same three steps by hand.

Both are checked against the same update rule run in one plain PyTensor process.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import make_train_function, updates

n = synk.fork(3)
rng = np.random.default_rng(0)
X = rng.normal(size=(600, 10))
Y = rng.integers(0, 3, size=600)


def mlp(seed):
    """A 10-16-3 network in plain PyTensor: parameters, inputs, mean cross-entropy."""
    init = np.random.default_rng(seed)
    params = [
        pytensor.shared(init.normal(0, 0.3, (10, 16)), name="W1"),
        pytensor.shared(np.zeros(16), name="b1"),
        pytensor.shared(init.normal(0, 0.3, (16, 3)), name="W2"),
        pytensor.shared(np.zeros(3), name="b2"),
    ]
    x, y = pt.dmatrix("x"), pt.lvector("y")
    hidden = pt.tanh(x.dot(params[0]) + params[1])
    logits = hidden.dot(params[2]) + params[3]
    logp = logits - pt.logsumexp(logits, axis=1, keepdims=True)
    loss = -logp[pt.arange(y.shape[0]), y].mean()  # a mean over rows
    return params, [x, y], loss


# -- one call per step: make_train_function -----------------------------------------
params, inputs, loss = mlp(seed=1)
train = make_train_function(loss, params, inputs, "adam", learning_rate=0.01)

# The reference: the same rule in one plain PyTensor process.
ref_params, ref_inputs, ref_loss = mlp(seed=1)
grad_updates, param_updates, _ = updates.adam(ref_loss, ref_params, learning_rate=0.01)
ref_grad = pytensor.function(ref_inputs, ref_loss, updates=grad_updates)
ref_apply = pytensor.function([], updates=param_updates)

x_data, y_data = synk.data(X), synk.data(Y)
for epoch in range(3):
    order = rng.permutation(len(X))
    for idx in np.array_split(order, 9):  # 67 or 66 rows: uneven over 3 processes
        loss_value = train(x_data, y_data, batch=idx)
        ref_value = ref_grad(X[idx], Y[idx])
        ref_apply()
        np.testing.assert_allclose(loss_value, ref_value, rtol=1e-9)
    print(f"epoch {epoch}: loss {loss_value:.4f}")

for p, q in zip(params, ref_params, strict=True):
    np.testing.assert_allclose(p.get_value(), q.get_value(), rtol=1e-9, atol=1e-12)
    for rank in range(n):  # every process holds the same parameters
        np.testing.assert_array_equal(synk.get_value(rank, p), p.get_value())
print("parameters equal the serial run's, in every process")

# -- the three steps by hand ----------------------------------------------------------
params, inputs, loss = mlp(seed=2)
grad_updates, param_updates, grad_shared = updates.sgd(loss, params, learning_rate=0.1)
f_grad = synk.function(inputs, loss, updates=grad_updates)  # 1. local gradients
f_apply = synk.function([], updates=param_updates)  # 3. the rule, from grad_shared
synk.distribute()
for idx in np.array_split(rng.permutation(len(X)), 10):
    f_grad(x_data, y_data, batch=idx)  # each process: the mean gradient of its 20 rows
    synk.all_reduce(grad_shared, op="avg")  # 2. equal weights: exact for an even split
    f_apply()
print(f"after one epoch by hand: loss {f_grad(x_data, y_data):.4f}")
synk.close()
