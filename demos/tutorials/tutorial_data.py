"""The tutorials' ``load_data``: three (inputs, labels) pairs of shared variables.

As in the Deep Learning Tutorials (``logistic_sgd.load_data``), the data sets live in
shared variables and the labels are stored as floats and handed out as
``T.cast(shared_y, "int32")``. The data come from local files only:

- by default, scikit-learn's 8x8 digits, each image also shifted by one pixel in
  the four directions (8985 images), shuffled once and split 6000 / 1500 / 1485, so
  that the tutorials' minibatch of 600 rows gives 10 / 2 / 2 minibatches (LeNet's
  500: 12 / 3 / 2). ``side=28`` gives them MNIST's shape for LeNet, whose layers
  are sized for 28x28 images: each pixel repeated 3x3 (24x24) inside a blank border
  of 2;
- ``dataset="path/mnist.pkl.gz"``: the tutorials' own MNIST pickle
  (train, valid, test), as they load it;
- ``dataset="path/mnist.npz"``: the common archive (``x_train``, ``y_train``,
  ``x_test``, ``y_test``), the last 10000 training images held out for validation
  (a fifth of a small file).
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as T

__all__ = ["load_data"]


def _digits(side):
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise SystemExit("the digits data set needs scikit-learn: pip install -e .[demos] "
                         "(or pass --dataset path/mnist.pkl.gz)") from exc
    digits = load_digits()
    images, labels = digits.images / 16.0, digits.target
    shifted = [images]
    for axis, step in [(1, 1), (1, -1), (2, 1), (2, -1)]:
        moved = np.roll(images, step, axis=axis)
        edge = [slice(None)] * 3
        edge[axis] = 0 if step == 1 else -1
        moved[tuple(edge)] = 0.0  # what rolled around the border is blank
        shifted.append(moved)
    images = np.concatenate(shifted)
    if side is not None:
        images = _enlarged(images, side)
    x = images.reshape(len(images), -1)
    y = np.tile(labels, len(shifted))
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return (x[:6000], y[:6000]), (x[6000:7500], y[6000:7500]), (x[7500:], y[7500:])


def _enlarged(images, side):
    """8x8 images as ``side`` x ``side``: each pixel repeated, the rest a blank border."""
    scale = side // 8
    if scale < 1:
        raise SystemExit(f"the digits are 8x8: cannot make them {side}x{side}")
    images = np.kron(images, np.ones((scale, scale)))
    border = side - 8 * scale
    return np.pad(images, ((0, 0), (border // 2, border - border // 2),
                           (border // 2, border - border // 2)))


def _mnist(path, side):
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"--dataset: no such file {path!r}")
    if side not in (None, 28):
        raise SystemExit(f"--dataset: MNIST's images are 28x28, not {side}x{side}")
    if file.name.endswith(".pkl.gz"):
        with gzip.open(file, "rb") as f:
            return pickle.load(f, encoding="latin1")
    with np.load(file) as archive:
        x, y = archive["x_train"].reshape(-1, 784), archive["y_train"]
        x_test, y_test = archive["x_test"].reshape(-1, 784), archive["y_test"]
    scale = 255.0 if x.max() > 1 else 1.0
    x, x_test = x / scale, x_test / scale
    held = 10000 if len(x) > 20000 else len(x) // 5  # a fifth of a small file
    return (x[:-held], y[:-held]), (x[-held:], y[-held:]), (x_test, y_test)


def shared_dataset(data_xy, borrow=True):
    """The inputs as a shared variable, the labels as a cast of one (the tutorials'
    "little hack": labels stored as floats, used as int32)."""
    data_x, data_y = data_xy
    shared_x = pytensor.shared(np.asarray(data_x, dtype=pytensor.config.floatX),
                               borrow=borrow)
    shared_y = pytensor.shared(np.asarray(data_y, dtype=pytensor.config.floatX),
                               borrow=borrow)
    return shared_x, T.cast(shared_y, "int32")


def load_data(dataset=None, side=None):
    """``[(train_x, train_y), (valid_x, valid_y), (test_x, test_y)]``, shared.

    Also returns, as the number of inputs per image, ``n_in`` (64 for the digits,
    ``side * side`` for the digits enlarged to ``side``, 784 for MNIST):
    ``datasets, n_in = load_data(...)``.
    """
    train_set, valid_set, test_set = (_digits(side) if dataset is None
                                      else _mnist(dataset, side))
    rval = [shared_dataset(test_set), shared_dataset(valid_set), shared_dataset(train_set)]
    return rval[::-1], int(np.shape(train_set[0])[1])
