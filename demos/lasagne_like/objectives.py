"""Losses and scores, as ``lasagne.objectives``: one value per row.

``categorical_crossentropy`` picks each row's target class with a one-hot mask,
``targets[:, None] == classes``, rather than by indexing ``p[arange(rows), targets]``:
the gradient of that indexing allocates an array from a computed size, which the JAX
backend cannot trace, while the mask's gradient is elementwise. PyTensor rewrites
``log(softmax(z))`` into the stable ``log_softmax(z)``.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt

__all__ = ["categorical_crossentropy", "categorical_accuracy", "aggregate"]


def _one_hot(targets, n_classes):
    # arange from an int64 start: a plain arange(n) starts from an int8 constant,
    # which overflows from 128 classes on in the JAX backend.
    classes = pt.arange(np.int64(0), n_classes)
    return pt.eq(targets[:, None], classes[None, :])


def categorical_crossentropy(predictions, targets):
    """``-log(predictions[row, target])`` for each row.

    Parameters
    ----------
    predictions : 2-d tensor
        Class probabilities, one row per example (a softmax output).
    targets : 1-d int tensor or 2-d tensor
        The class of each row, or one probability row per example.
    """
    if targets.ndim == predictions.ndim:
        return -pt.sum(targets * pt.log(predictions), axis=1)
    n_classes = predictions.type.shape[1]
    mask = _one_hot(targets, predictions.shape[1] if n_classes is None else n_classes)
    return -pt.switch(mask, pt.log(predictions), 0).sum(axis=1)


def categorical_accuracy(predictions, targets):
    """1 where the row's most probable class is its target, else 0 (floatX)."""
    if targets.ndim == predictions.ndim:
        targets = pt.argmax(targets, axis=-1)
    return pt.cast(pt.eq(pt.argmax(predictions, axis=-1), targets), "floatX")


def aggregate(loss, mode="mean"):
    """``loss.mean()`` or ``loss.sum()``."""
    if mode not in ("mean", "sum"):
        raise ValueError(f"aggregate mode must be 'mean' or 'sum'; got {mode!r}")
    return loss.mean() if mode == "mean" else loss.sum()
