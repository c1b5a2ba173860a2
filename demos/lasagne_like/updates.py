"""Serial update rules, as ``lasagne.updates``: ``{shared: new_value}`` for ``pytensor.function``.

These serve the serial twins of the demos (``train_mnist_pytensor.py``), as Lasagne's
served the original's ``train_mnist_theano.py``. The data-parallel demos use
``synkhronos.extensions.updates`` instead, whose rules split the same formulas into a
gradient step and an apply step around an all-reduce.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytensor

__all__ = ["sgd", "apply_momentum", "momentum", "apply_nesterov_momentum",
           "nesterov_momentum", "adam"]


def _zeros_like(param):
    value = param.get_value(borrow=True)
    return pytensor.shared(np.zeros(value.shape, dtype=value.dtype), shape=value.shape)


def sgd(loss_or_grads, params, learning_rate):
    """``param - learning_rate * grad``."""
    grads = _grads(loss_or_grads, params)
    return OrderedDict((p, p - learning_rate * g) for p, g in zip(params, grads, strict=True))


def apply_momentum(updates, params=None, momentum=0.9):
    """Add classical momentum to ``updates`` (velocity ``v = momentum * v + step``)."""
    params = list(updates) if params is None else params
    updates = OrderedDict(updates)
    for param in params:
        velocity = _zeros_like(param)
        x = momentum * velocity + updates[param]
        updates[velocity] = x - param
        updates[param] = x
    return updates


def momentum(loss_or_grads, params, learning_rate, momentum=0.9):
    return apply_momentum(sgd(loss_or_grads, params, learning_rate), params, momentum)


def apply_nesterov_momentum(updates, params=None, momentum=0.9):
    """Add Nesterov momentum to ``updates``."""
    params = list(updates) if params is None else params
    updates = OrderedDict(updates)
    for param in params:
        velocity = _zeros_like(param)
        x = momentum * velocity + updates[param] - param
        updates[velocity] = x
        updates[param] = momentum * x + updates[param]
    return updates


def nesterov_momentum(loss_or_grads, params, learning_rate, momentum=0.9):
    return apply_nesterov_momentum(sgd(loss_or_grads, params, learning_rate), params, momentum)


def adam(loss_or_grads, params, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8):
    """Adam, with Lasagne's bias correction folded into the step size."""
    grads = _grads(loss_or_grads, params)
    t_prev = pytensor.shared(np.asarray(0.0, dtype=pytensor.config.floatX))
    t = t_prev + 1
    step = learning_rate * (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t)
    updates = OrderedDict()
    for param, g in zip(params, grads, strict=True):
        m_prev, v_prev = _zeros_like(param), _zeros_like(param)
        m = beta1 * m_prev + (1 - beta1) * g
        v = beta2 * v_prev + (1 - beta2) * g ** 2
        updates[m_prev], updates[v_prev] = m, v
        updates[param] = param - step * m / (v ** 0.5 + epsilon)
    updates[t_prev] = t
    return updates


def _grads(loss_or_grads, params):
    if isinstance(loss_or_grads, list):
        if len(loss_or_grads) != len(params):
            raise ValueError(f"got {len(loss_or_grads)} gradients for {len(params)} params")
        return loss_or_grads
    return pytensor.grad(loss_or_grads, params)
