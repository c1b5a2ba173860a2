"""Initial parameter values, as ``lasagne.init``: callables ``spec(shape) -> ndarray`` (floatX).

Fans follow Lasagne: for a dense weight ``(n_in, n_out)`` they are ``n_in`` and
``n_out``; for a convolution weight ``(filters, channels, h, w)`` they are
``channels * h * w`` and ``filters * h * w``. Values are drawn from
:func:`lasagne_like.random.get_rng`.
"""

from __future__ import annotations

import numpy as np
import pytensor

from .random import get_rng

__all__ = ["Initializer", "Constant", "Normal", "Uniform", "GlorotUniform", "GlorotNormal",
           "HeNormal", "HeUniform"]


def _floatx(value) -> np.ndarray:
    return np.asarray(value, dtype=pytensor.config.floatX)


class Initializer:
    """Base class: ``sample(shape)`` draws an array; calling the object does the same."""

    def __call__(self, shape):
        return self.sample(tuple(shape))

    def sample(self, shape):
        raise NotImplementedError


class Constant(Initializer):
    def __init__(self, val=0.0):
        self.val = val

    def sample(self, shape):
        return _floatx(np.full(shape, self.val))


class Normal(Initializer):
    def __init__(self, std=0.01, mean=0.0):
        self.std, self.mean = std, mean

    def sample(self, shape):
        return _floatx(get_rng().normal(self.mean, self.std, size=shape))


class Uniform(Initializer):
    """Uniform on ``range`` (a pair), or on ``(-range, range)`` for a number."""

    def __init__(self, range=0.01):  # noqa: A002 (Lasagne's name)
        self.range = range if isinstance(range, tuple) else (-range, range)

    def sample(self, shape):
        low, high = self.range
        return _floatx(get_rng().uniform(low, high, size=shape))


def _fans(shape):
    if len(shape) < 2:
        raise ValueError(f"this initializer needs a weight of 2 or more axes; got shape {shape}")
    receptive = int(np.prod(shape[2:]))
    return shape[0] * receptive if len(shape) > 2 else shape[0], shape[1] * receptive, receptive


def _gain(gain):
    return np.sqrt(2.0) if gain == "relu" else float(gain)


class GlorotUniform(Initializer):
    """Uniform with variance ``2 gain^2 / (fan_in + fan_out)`` (Lasagne's default weights)."""

    def __init__(self, gain=1.0):
        self.gain = _gain(gain)

    def sample(self, shape):
        n1, n2 = shape[:2]
        receptive = int(np.prod(shape[2:]))
        std = self.gain * np.sqrt(2.0 / ((n1 + n2) * receptive))
        bound = np.sqrt(3.0) * std
        return _floatx(get_rng().uniform(-bound, bound, size=shape))


class GlorotNormal(GlorotUniform):
    def sample(self, shape):
        n1, n2 = shape[:2]
        receptive = int(np.prod(shape[2:]))
        std = self.gain * np.sqrt(2.0 / ((n1 + n2) * receptive))
        return _floatx(get_rng().normal(0.0, std, size=shape))


class HeNormal(Initializer):
    """Normal with variance ``gain^2 / fan_in``; ``gain="relu"`` is sqrt(2)."""

    def __init__(self, gain=1.0):
        self.gain = _gain(gain)

    def sample(self, shape):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else shape[0]
        return _floatx(get_rng().normal(0.0, self.gain * np.sqrt(1.0 / fan_in), size=shape))


class HeUniform(HeNormal):
    def sample(self, shape):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else shape[0]
        bound = np.sqrt(3.0) * self.gain * np.sqrt(1.0 / fan_in)
        return _floatx(get_rng().uniform(-bound, bound, size=shape))
