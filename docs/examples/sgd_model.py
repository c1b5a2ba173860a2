"""The user's own model code: the same in the serial and the parallel program.

In the paper's Figures 4 and 5 these are ``build_cnn()``, ``setup_training()``,
``load_dataset()`` and ``iter_minibatch_idxs()``; here a small network in plain
PyTensor (Lasagne no longer installs) and random data, to keep the example fast.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt


def build_network():
    """A 20-32-4 network: its output probabilities, input variable and parameters."""
    rng = np.random.default_rng(42)
    W1 = pytensor.shared(rng.normal(0, 0.2, (20, 32)), name="W1")
    b1 = pytensor.shared(np.zeros(32), name="b1")
    W2 = pytensor.shared(rng.normal(0, 0.2, (32, 4)), name="W2")
    b2 = pytensor.shared(np.zeros(4), name="b2")
    input_var = pt.dmatrix("inputs")
    hidden = pt.maximum(input_var.dot(W1) + b1, 0)  # a dense ReLU layer
    network = pt.special.softmax(hidden.dot(W2) + b2, axis=1)
    return network, input_var, [W1, b1, W2, b2]


def setup_training(network, param_vars, learning_rate=0.5):
    """Plain SGD on the mean cross-entropy: the updates, the target variable, the loss."""
    target_var = pt.lvector("targets")
    loss = -pt.log(network[pt.arange(target_var.shape[0]), target_var]).mean()
    grads = pytensor.grad(loss, param_vars)
    updates = [(p, p - learning_rate * g) for p, g in zip(param_vars, grads, strict=True)]
    return updates, target_var, loss


def load_dataset():
    """2000 rows of 20 features; the label is the quadrant of two of them."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 20))
    y = (X[:, 0] > 0).astype("int64") * 2 + (X[:, 1] > 0)
    return X, y


def iter_minibatch_idxs(length, size, shuffle=True, seed=1):
    """Index arrays of ``size`` rows covering ``range(length)``, shuffled if asked."""
    order = np.random.default_rng(seed).permutation(length) if shuffle else np.arange(length)
    for start in range(0, length - size + 1, size):
        yield order[start : start + size]
