"""Add-ons built on the public API: data-parallel update rules, a training step, Theano's conv.

- :mod:`.updates`: Lasagne's update rules split into a gradient step that writes one
  flat shared vector and an apply step that reads it back (one all-reduce per step),
  with the original Synkhronos' helpers (``flatten_vars``, ``unflatten_vars``, ...).
- :mod:`.train`: :func:`.make_train_function`, the three steps in one callable, exact
  for any split of the minibatch (today's call form and the original's), and its
  serial twin :func:`.make_train_function_pytensor`.
- :mod:`.conv`: Theano's ``conv2d`` and ``pool_2d``, which PyTensor 3 does not have,
  built from PyTensor's own ops (im2col and one matrix product; slices or a
  reshape), so a Theano-era program is ported by changing its import.
"""

from . import conv, train, updates
from .conv import conv2d, pool_2d
from .train import (
    TrainFunction,
    make_train_function,
    make_train_function_pytensor,
    make_train_function_theano,
)

__all__ = [
    "updates",
    "train",
    "make_train_function",
    "make_train_function_pytensor",
    "make_train_function_theano",
    "TrainFunction",
    "conv",
    "conv2d",
    "pool_2d",
]
