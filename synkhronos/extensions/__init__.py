"""Add-ons built on the public API: data-parallel update rules and a training step.

- :mod:`.updates`: Lasagne's update rules split into a gradient step that writes one
  flat shared vector and an apply step that reads it back (one all-reduce per step).
- :mod:`.train`: :func:`make_train_function`, the three steps in one callable, exact
  for any split of the minibatch.
"""

from . import updates
from .train import TrainFunction, make_train_function

__all__ = ["updates", "make_train_function", "TrainFunction"]
