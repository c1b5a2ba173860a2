"""Add-ons built on the public API: data-parallel update rules and a training step.

- :mod:`.updates`: Lasagne's update rules split into a gradient step that writes one
  flat shared vector and an apply step that reads it back (one all-reduce per step),
  with the original Synkhronos' helpers (``flatten_vars``, ``unflatten_vars``, ...).
- :mod:`.train`: :func:`.make_train_function`, the three steps in one callable, exact
  for any split of the minibatch (today's call form and the original's), and its
  serial twin :func:`.make_train_function_pytensor`.
"""

from . import train, updates
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
]
