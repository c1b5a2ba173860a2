"""Plain PyTensor layers for the deep-learning demos: no Lasagne, nothing hidden.

Each layer holds its parameters as ``pytensor.shared`` variables of static shape
(``layer.params``) and is called on a symbolic tensor to build its part of the
graph. Images are channels-last, ``(rows, height, width, channels)``, so that a
convolution is a product over the last axis and needs no transposes.

- :class:`Dense`: ``x @ W + b``.
- :class:`Conv2D`: 'valid' convolution by im2col: the ``k * k`` shifted views of the
  input are joined along the channel axis and multiplied by one matrix. PyTensor 3
  has no ``tensor.nnet.conv2d``; this form has cheap gradients (slicing and one
  matrix product) in every backend.
- :func:`max_pool`: pooling by reshape and max.
- :func:`relu`, :func:`flatten`, :func:`cross_entropy` (log-softmax, mean over rows)
  and :func:`correct` (a count, for a "sum" reduction).

The same graphs compile with the default (Numba) backend and with the JAX backend,
whatever the number of rows each process gets. JAX needs every shape it is given
to be concrete, so images have static height, width and channels, and every
reshape is ``(x.shape[0], constants...)``: the rows come straight from the input's
shape, never from arithmetic on it (``-1`` would make PyTensor compute the rows in
the gradient, and JAX would then see a traced value where it needs a number).
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.tensor.special import log_softmax

__all__ = ["Dense", "Conv2D", "max_pool", "relu", "flatten", "cross_entropy", "correct",
           "params_of"]


def _static_shape(x: pt.TensorVariable, what: str) -> tuple[int, ...]:
    """The static sizes of every axis of ``x`` but the first (the rows)."""
    shape = x.type.shape[1:]
    if any(size is None for size in shape):
        raise ValueError(f"{what} needs every axis but the rows static, e.g. "
                         f"pt.tensor4(shape=(None, 8, 8, 1)); got {x.type}")
    return tuple(int(size) for size in shape)


def _parameter(value: np.ndarray, name: str) -> pytensor.compile.SharedVariable:
    """A shared variable with a static shape, so every shape downstream is known."""
    return pytensor.shared(value, name=name, shape=value.shape)


def _he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int,
               dtype: str) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)


class Dense:
    """A fully connected layer, ``x @ W + b``, for ``x`` of shape ``(rows, n_in)``.

    ``W`` starts He-normal, ``b`` at zero; both have ``dtype``.
    """

    def __init__(self, n_in: int, n_out: int, rng: np.random.Generator,
                 dtype: str = "float32", name: str = "dense") -> None:
        self.W = _parameter(_he_normal(rng, (n_in, n_out), n_in, dtype), f"{name}.W")
        self.b = _parameter(np.zeros(n_out, dtype=dtype), f"{name}.b")
        self.params = [self.W, self.b]

    def __call__(self, x: pt.TensorVariable) -> pt.TensorVariable:
        return x @ self.W + self.b


class Conv2D:
    """A 'valid' 2-d convolution (cross-correlation) by im2col, channels-last.

    Called on ``x`` of shape ``(rows, height, width, channels)`` whose height, width
    and channels are static (declare ``pt.tensor4(shape=(None, h, w, c))``), it
    returns ``(rows, height - k + 1, width - k + 1, filters)``, again static but for
    the rows. ``W`` has shape ``(k * k * channels, filters)``: row
    ``(i * k + j) * channels + c`` weighs channel ``c`` at offset ``(i, j)``.
    """

    def __init__(self, channels: int, filters: int, k: int, rng: np.random.Generator,
                 dtype: str = "float32", name: str = "conv") -> None:
        self.channels, self.filters, self.k = channels, filters, k
        fan_in = k * k * channels
        self.W = _parameter(_he_normal(rng, (fan_in, filters), fan_in, dtype), f"{name}.W")
        self.b = _parameter(np.zeros(filters, dtype=dtype), f"{name}.b")
        self.params = [self.W, self.b]

    def __call__(self, x: pt.TensorVariable) -> pt.TensorVariable:
        height, width, channels = _static_shape(x, "Conv2D")
        if channels != self.channels:
            raise ValueError(f"Conv2D expects {self.channels} channels; got {channels}")
        k, rows = self.k, x.shape[0]
        out_h, out_w = height - k + 1, width - k + 1
        views = [x[:, i:i + out_h, j:j + out_w, :] for i in range(k) for j in range(k)]
        columns = pt.concatenate(views, axis=3).reshape((rows, out_h * out_w, k * k * channels))
        out = pt.matmul(columns, self.W).reshape((rows, out_h, out_w, self.filters))
        return out + self.b


def max_pool(x: pt.TensorVariable, size: int = 2) -> pt.TensorVariable:
    """Non-overlapping ``size x size`` max pooling of ``(rows, h, w, c)``, h and w static."""
    height, width, channels = _static_shape(x, "max_pool")
    if height % size or width % size:
        raise ValueError(f"max_pool({size}) needs height and width divisible by {size}; "
                         f"got {height}x{width}")
    blocks = x.reshape((x.shape[0], height // size, size, width // size, size, channels))
    return blocks.max(axis=(2, 4))


def relu(x: pt.TensorVariable) -> pt.TensorVariable:
    """``max(x, 0)`` (PyTensor 3 has no ``pt.relu``)."""
    return pt.maximum(x, 0)


def flatten(x: pt.TensorVariable) -> pt.TensorVariable:
    """``(rows, *shape)`` -> ``(rows, prod(shape))``, the trailing shape static."""
    return x.reshape((x.shape[0], int(np.prod(_static_shape(x, "flatten")))))


def cross_entropy(logits: pt.TensorVariable, labels: pt.TensorVariable) -> pt.TensorVariable:
    """Mean over rows of ``-log_softmax(logits)[row, label]`` (labels int64).

    The label's column is picked by a one-hot mask, ``labels[:, None] == classes``,
    rather than by ``log_p[arange(rows), labels]``: the gradient of that indexing
    allocates a ``(rows, classes)`` array from a computed size, which the JAX
    backend cannot trace, while the mask's gradient is elementwise. ``classes`` is
    ``arange(int64(0), n)``: a plain ``pt.arange(n)`` starts from an int8 constant
    that overflows from 128 on in the JAX backend.
    """
    log_p = log_softmax(logits, axis=1)
    n_classes = logits.type.shape[1]
    classes = pt.arange(np.int64(0), logits.shape[1] if n_classes is None else n_classes)
    mask = pt.eq(labels[:, None], classes[None, :])
    return -pt.switch(mask, log_p, 0).sum(axis=1).mean()


def correct(logits: pt.TensorVariable, labels: pt.TensorVariable) -> pt.TensorVariable:
    """How many rows the arg-max of ``logits`` gets right (an int64 count)."""
    return pt.sum(pt.eq(pt.argmax(logits, axis=1), labels), dtype="int64")


def params_of(*layers) -> list:
    """All the layers' parameters, in order."""
    return [p for layer in layers for p in layer.params]
