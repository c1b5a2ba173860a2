"""Data sets for the deep-learning demos, from local files only (nothing is downloaded).

By default :func:`load` returns scikit-learn's bundled handwritten digits
(``sklearn.datasets.load_digits``: 1797 images of 8x8 pixels, 10 classes), shuffled
once and split 80/20 into training and validation. With a path to the common
``mnist.npz`` (arrays ``x_train``, ``y_train``, ``x_test``, ``y_test``; 28x28
images) it returns MNIST instead: the first 50000 training images for training and
the last 10000 for validation (the test set stays untouched).

Pixels are scaled to [0, 1] in one float dtype (float32 by default) and labels are
int64. Images come flat, ``(rows, height * width)``, or channels-last,
``(rows, height, width, 1)``, for a convolutional network.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Dataset", "load", "add_data_arguments"]


@dataclass(frozen=True)
class Dataset:
    """Training and validation arrays, and what they hold."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    image_shape: tuple[int, int, int]  # (height, width, channels)
    n_classes: int = 10

    @property
    def n_features(self) -> int:
        return int(np.prod(self.image_shape))

    def __str__(self) -> str:
        h, w, _ = self.image_shape
        return (f"{self.name}: {len(self.x_train)} training and {len(self.x_val)} validation "
                f"images of {h}x{w}, {self.x_train.dtype}")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--mnist PATH`` flag every training demo takes."""
    parser.add_argument("--mnist", metavar="PATH", default=None,
                        help="a local mnist.npz (x_train, y_train, x_test, y_test) to train "
                             "on instead of scikit-learn's 8x8 digits")


def _digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise SystemExit("the digits data set needs scikit-learn: pip install -e .[demos] "
                         "(or pass --mnist PATH)") from exc
    digits = load_digits()
    x = digits.images / 16.0  # pixel values are 0..16
    y = digits.target
    order = np.random.default_rng(seed).permutation(len(x))
    cut = len(x) * 4 // 5
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]], 8


def _mnist(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"--mnist: no such file {path!r} (expected mnist.npz with x_train, "
                         "y_train, x_test, y_test)")
    with np.load(file) as archive:
        missing = {"x_train", "y_train"} - set(archive.files)
        if missing:
            raise SystemExit(f"--mnist: {path!r} lacks {sorted(missing)}; it has "
                             f"{archive.files}")
        x, y = archive["x_train"], archive["y_train"]
    side = int(round(np.sqrt(x[0].size)))
    x = x.reshape(len(x), side, side).astype(np.float64)
    if x.max() > 1.0:
        x /= 255.0
    cut = len(x) - 10000 if len(x) > 20000 else len(x) * 4 // 5
    return x[:cut], y[:cut], x[cut:], y[cut:], side


def load(mnist: str | None = None, images: bool = False, dtype: str = "float32",
         seed: int = 0) -> Dataset:
    """Digits (default) or MNIST from ``mnist``, split into training and validation.

    Parameters
    ----------
    mnist : str, optional
        Path of a local ``mnist.npz``; None for scikit-learn's digits.
    images : bool
        True: ``x`` has shape ``(rows, height, width, 1)``; False: ``(rows, h * w)``.
    dtype : str
        The float dtype of ``x``.
    seed : int
        The shuffle of the digits before the split.
    """
    x_train, y_train, x_val, y_val, side = _digits(seed) if mnist is None else _mnist(mnist)
    shape = (side, side, 1) if images else (side * side,)

    def prepare(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.ascontiguousarray(x.reshape((len(x), *shape)), dtype=dtype)
        return x, np.ascontiguousarray(y, dtype=np.int64)

    x_train, y_train = prepare(x_train, y_train)
    x_val, y_val = prepare(x_val, y_val)
    name = "digits" if mnist is None else "MNIST"
    return Dataset(name, x_train, y_train, x_val, y_val, (side, side, 1))
