"""Activation functions, as ``lasagne.nonlinearities``: plain functions of a tensor."""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.tensor.special import softmax as _softmax

__all__ = ["rectify", "softmax", "sigmoid", "tanh", "linear", "identity"]


def rectify(x):
    """``max(x, 0)``."""
    return pt.maximum(x, 0)


def softmax(x):
    """Softmax over the last axis (the classes of each row)."""
    return _softmax(x, axis=-1)


def sigmoid(x):
    return pt.sigmoid(x)


def tanh(x):
    return pt.tanh(x)


def linear(x):
    """The identity (no nonlinearity)."""
    return x


identity = linear
