"""How a payload or reply is laid out in its shared-memory slot.

Two formats, told apart by the slot's kind field in the control header:

- ``PICKLE``: any picklable object, pickled.
- ``ARRAYS``: a tuple whose items are ints, floats, bools, ``None``, numeric numpy
  arrays, or lists of numeric numpy arrays (a function call's reply is
  ``(rows, [outputs])``). The arrays' bytes are copied raw into the slot and only a
  small description is pickled: pickling an ndarray goes through its ``__reduce__``
  and costs about 5 µs each way, copying its bytes well under 1 µs.

Layout of ``ARRAYS`` from the slot's start: the pickled description (its length is
the slot's length field), padding to 64 bytes, then each array's bytes at the
offset its description names, relative to that aligned start. In the description,
an array is a ``(dtype.str, shape, offset)`` tuple; the reply's own items are never
tuples, so a tuple always stands for an array.

Decoded arrays are copies: the slot is overwritten by the next command.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

__all__ = ["PICKLE", "ARRAYS", "describe", "size", "write_arrays", "read_arrays"]

PICKLE, ARRAYS = 0, 1
_ALIGN = 64
_SCALARS = (int, float, bool, type(None))
_NUMERIC = frozenset("biufc")
_DTYPE_STR: dict[np.dtype, str] = {}  # dtype -> dtype.str, which numpy builds afresh


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _dtype_str(dtype: np.dtype) -> str | None:
    """``dtype.str`` for the numeric dtypes the format carries, else None."""
    text = _DTYPE_STR.get(dtype)
    if text is None and dtype.kind in _NUMERIC:
        text = _DTYPE_STR[dtype] = dtype.str
    return text


def describe(obj) -> tuple[bytes, list[np.ndarray], int] | None:
    """``(pickled description, arrays in order, bytes of array data)``, or None.

    None means ``obj`` is not of the ``ARRAYS`` shape: pickle it instead.
    """
    if type(obj) is not tuple:
        return None
    arrays: list[np.ndarray] = []
    offset = 0
    items: list[Any] = []
    for item in obj:
        kind = type(item)
        if kind is list:
            described = []
            for a in item:
                if type(a) is not np.ndarray or (text := _dtype_str(a.dtype)) is None:
                    return None
                described.append((text, a.shape, offset))
                arrays.append(a)
                offset += _aligned(a.nbytes)
            items.append(described)
        elif kind is np.ndarray:
            text = _dtype_str(item.dtype)
            if text is None:
                return None
            items.append((text, item.shape, offset))
            arrays.append(item)
            offset += _aligned(item.nbytes)
        elif kind in _SCALARS:
            items.append(item)
        else:
            return None
    return pickle.dumps(tuple(items), protocol=pickle.HIGHEST_PROTOCOL), arrays, offset


def size(head: bytes, data_bytes: int) -> int:
    """Slot bytes that a ``describe``d object needs."""
    return _aligned(len(head)) + data_bytes


def write_arrays(buffer: memoryview, at: int, head: bytes, arrays: list[np.ndarray]) -> None:
    """Write a ``describe``d object at ``at`` (the caller checked that it fits)."""
    buffer[at : at + len(head)] = head
    start = at + _aligned(len(head))
    for a in arrays:
        if a.nbytes:
            np.ndarray(a.shape, a.dtype, buffer, start)[...] = a
        start += _aligned(a.nbytes)


def _array(buffer: memoryview, start: int, description: tuple) -> np.ndarray:
    dtype, shape, offset = description
    if 0 in shape:
        return np.empty(shape, dtype)
    return np.ndarray(shape, dtype, buffer, start + offset).copy()


def read_arrays(buffer: memoryview, at: int, length: int) -> tuple:
    """The object ``write_arrays`` wrote at ``at`` (``length``: its description's)."""
    start = at + _aligned(length)
    items = pickle.loads(buffer[at : at + length])
    out: list[Any] = []
    for item in items:
        kind = type(item)
        if kind is list:
            out.append([_array(buffer, start, d) for d in item])
        elif kind is tuple:
            out.append(_array(buffer, start, item))
        else:
            out.append(item)
    return tuple(out)
