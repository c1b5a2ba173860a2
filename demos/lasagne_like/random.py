"""The random generator that initializers and dropout layers draw from (as ``lasagne.random``).

By default it is the ``numpy.random`` module itself, so ``np.random.seed(0)`` before
building a network makes its initial weights and dropout seeds reproducible, as in
Lasagne; :func:`set_rng` installs a ``numpy.random.RandomState`` instead.
"""

from __future__ import annotations

import numpy as np

__all__ = ["get_rng", "set_rng"]

_rng = np.random


def get_rng():
    """The generator in use (``numpy.random`` or a ``RandomState``)."""
    return _rng


def set_rng(new_rng) -> None:
    """Draw all later initial weights and dropout seeds from ``new_rng``."""
    global _rng
    _rng = new_rng
