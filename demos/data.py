"""Image data sets for the training demos, from local files only (nothing is downloaded).

:func:`load_dataset` returns six arrays, as the original demos' ``load_dataset`` did:
``X_train, y_train, X_val, y_val, X_test, y_test``, with images shaped
``(rows, 1, height, width)`` (Lasagne's layout), pixels in [0, 1] as float32, and
labels as uint8 (MNIST's own label type; the demos' int32 targets accept them, as a
safe cast).

- By default: scikit-learn's bundled handwritten digits (``load_digits``: 1797 images
  of 8x8 pixels, 10 classes), shuffled once and split 1197 / 300 / 300.
- With ``mnist="path/mnist.npz"`` (the common archive with ``x_train``, ``y_train``,
  ``x_test``, ``y_test``): MNIST, the last 10000 training images held out for
  validation as in the original demos (a fifth of them for a small file), and the
  test set as test.

``image_size`` resizes the images (nearest neighbour) to ``size x size``, for
networks that need larger inputs than the digits' 8x8 (the ResNet demo).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

__all__ = ["load_dataset", "resize", "add_data_arguments", "describe"]


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--mnist PATH`` flag every training demo takes."""
    parser.add_argument("--mnist", metavar="PATH", default=None,
                        help="a local mnist.npz (x_train, y_train, x_test, y_test) to train "
                             "on instead of scikit-learn's 8x8 digits")


def _digits(seed: int) -> tuple[np.ndarray, ...]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise SystemExit("the digits data set needs scikit-learn: pip install -e .[demos] "
                         "(or pass --mnist PATH)") from exc
    digits = load_digits()
    x, y = digits.images / 16.0, digits.target  # pixel values are 0..16
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1197], y[:1197], x[1197:1497], y[1197:1497], x[1497:], y[1497:]


def _mnist(path: str) -> tuple[np.ndarray, ...]:
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"--mnist: no such file {path!r} (expected mnist.npz with x_train, "
                         "y_train, x_test, y_test)")
    with np.load(file) as archive:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(archive.files)
        if missing:
            raise SystemExit(f"--mnist: {path!r} lacks {sorted(missing)}; it has "
                             f"{archive.files}")
        x, y = archive["x_train"], archive["y_train"]
        x_test, y_test = archive["x_test"], archive["y_test"]
    scale = 255.0 if x.max() > 1 else 1.0
    held = 10000 if len(x) > 20000 else len(x) // 5
    x, x_test = x / scale, x_test / scale
    return x[:-held], y[:-held], x[-held:], y[-held:], x_test, y_test


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """Nearest-neighbour resize of ``(rows, channels, h, w)`` images to ``size x size``."""
    rows = np.arange(size) * images.shape[2] // size
    cols = np.arange(size) * images.shape[3] // size
    return np.ascontiguousarray(images[:, :, rows][:, :, :, cols])


def load_dataset(mnist: str | None = None, image_size: int | None = None,
                 seed: int = 0) -> tuple[np.ndarray, ...]:
    """``X_train, y_train, X_val, y_val, X_test, y_test``: digits, or MNIST from ``mnist``.

    Parameters
    ----------
    mnist : str, optional
        Path of a local ``mnist.npz``; None for scikit-learn's digits.
    image_size : int, optional
        Resize the images to this many pixels a side.
    seed : int
        The shuffle of the digits before the split.
    """
    parts = _digits(seed) if mnist is None else _mnist(mnist)
    out = []
    for x, y in zip(parts[::2], parts[1::2], strict=True):
        side = int(round(np.sqrt(x[0].size)))
        x = x.reshape(len(x), 1, side, side)
        if image_size is not None and image_size != side:
            x = resize(x, image_size)
        out += [np.ascontiguousarray(x, dtype=np.float32), np.asarray(y, dtype=np.uint8)]
    return tuple(out)


def describe(mnist: str | None, X_train, X_val, X_test) -> str:  # noqa: N803
    """One line: which data, how many images of which size."""
    name = "digits" if mnist is None else "MNIST"
    h, w = X_train.shape[2:]
    return (f"{name}: {len(X_train)} training, {len(X_val)} validation and {len(X_test)} "
            f"test images of {h}x{w}")
