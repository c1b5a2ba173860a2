"""How a payload or reply is laid out in its shared-memory slot.

Two formats, told apart by the slot's kind field in the control header:

- ``PICKLE``: any picklable object, pickled. A pickle larger than its slot travels in
  a one-off segment of the arena instead: the slot holds the segment's name and size,
  pickled, and its length field says so by being negative.
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

Decoded arrays are copies (the slot is overwritten by the next command), unless the
reader asks for views it is done with before then. A reply that repeats (a training
loop's, with timings or not) has the description of the last one: the writer keeps the last
description it pickled, so it does not pickle it again (the reply slots,
``replies.py``, keep the places and the reader's decoded views for it).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .arena import Arena

__all__ = ["PICKLE", "ARRAYS", "write_pickled", "read_pickled", "one_off_name", "describe",
           "size", "write_arrays", "places", "write_places", "read_arrays", "copied"]

PICKLE, ARRAYS = 0, 1
_ONE_OFF = -1  # a pickle's length field below this: it went in a one-off segment
_ALIGN = 64
_MASK = ~(_ALIGN - 1)
_SCALARS = (int, float, bool, type(None))
_NUMERIC = frozenset("biufc")
_DTYPE_STR: dict[np.dtype, str] = {}  # dtype -> dtype.str, which numpy builds afresh


_last_head: list = [None, None, b""]  # the writer's last (description, scalar types,
# the description pickled)
_last_call: list = [None, [], 0]  # and, for a call's reply ``(rows, [outputs])``: (rows,
# [(dtype, shape)] of its outputs, bytes of array data); rows None when the last
# described was not one
# The same for a call's reply with timings ``(rows, [outputs], timings)``, with the
# timings array's (dtype, shape)
_last_with_timings: list = [None, [], 0, None]


def write_pickled(buffer: memoryview, at: int, capacity: int, obj: object, arena: Arena,
                  ) -> tuple[int, bytes | None]:
    """Pickle ``obj`` into the slot of ``capacity`` bytes at ``at``, or into a one-off
    segment of ``arena`` (handed over: its reader unlinks or discards it).

    Returns ``(length, data)``: the value of the slot's length field, and the pickle
    when it went into the slot (None: into a segment). Pickling comes first: an object
    that cannot be pickled raises before anything is written.
    """
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) <= capacity:
        buffer[at : at + len(data)] = data
        return len(data), data
    segment = arena.create(len(data), replicated=False)
    segment.buffer[: len(data)] = data
    encoded = pickle.dumps((segment.name, len(data)))
    arena.hand_over(segment)
    buffer[at : at + len(encoded)] = encoded
    return _ONE_OFF - len(encoded), None


def read_pickled(buffer: memoryview, at: int, length: int, arena: Arena,
                 discard: bool = False) -> object:
    """The object ``write_pickled`` wrote at ``at`` (``length``: its length field);
    ``discard``: unlink its one-off segment, if any, once read (its only reader)."""
    if length >= 0:
        return pickle.loads(buffer[at : at + length])
    name, size = pickle.loads(buffer[at : at + (_ONE_OFF - length)])
    return pickle.loads(arena.take(name, size, unlink=discard))


def one_off_name(buffer: memoryview, at: int, length: int) -> str:
    """The name of the one-off segment that ``write_pickled`` wrote at ``at`` (its
    ``length`` field negative)."""
    name, _ = pickle.loads(buffer[at : at + (_ONE_OFF - length)])
    return name


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
    call = _last_call
    if len(obj) == 2:
        if call[0] is not None:  # a call's reply ``(rows, [outputs])``
            rows, outputs = obj
            if type(rows) is int and rows == call[0] and type(outputs) is list and (
                    len(outputs) == len(call[1])):
                for a, (dtype, shape) in zip(outputs, call[1]):  # noqa: B905 (as long)
                    if type(a) is not np.ndarray or a.shape != shape or (
                            a.dtype is not dtype and a.dtype != dtype):  # Numba's
                        break  # arrays' dtypes are equal to numpy's, not numpy's own
                else:  # as the last one: its description
                    return _last_head[2], outputs, call[2]
    elif len(obj) == 3 and _last_with_timings[0] is not None:
        described = _as_last_with_timings(obj)
        if described is not None:
            return described
    described = _describe(obj)
    if described is not None:
        _remember_form(obj, described[2])
    return described


def _as_last_with_timings(obj: tuple) -> tuple[bytes, list[np.ndarray], int] | None:
    """``describe``'s shortcut for a call's reply with timings like the last one, else None."""
    rows, outputs, timings = obj
    call = _last_with_timings
    if type(rows) is not int or rows != call[0] or type(outputs) is not list or (
            len(outputs) != len(call[1])):
        return None
    for a, (dtype, shape) in zip(outputs, call[1]):  # noqa: B905 (as long)
        if type(a) is not np.ndarray or a.shape != shape or (
                a.dtype is not dtype and a.dtype != dtype):  # (see ``describe``)
            return None
    if type(timings) is not np.ndarray or (timings.dtype, timings.shape) != call[3]:
        return None
    return _last_head[2], [*outputs, timings], call[2]


def _remember_form(obj: tuple, data_bytes: int) -> None:
    """After a whole description: whether ``obj`` was a call's reply (with timings or not), for
    ``describe``'s shortcuts."""
    _last_call[:] = None, [], 0
    _last_with_timings[:] = None, [], 0, None
    if len(obj) not in (2, 3) or type(obj[0]) is not int or type(obj[1]) is not list:
        return
    form = [obj[0], [(a.dtype, a.shape) for a in obj[1]], data_bytes]
    if len(obj) == 2:
        _last_call[:] = form
    elif type(obj[2]) is np.ndarray:
        _last_with_timings[:] = [*form, (obj[2].dtype, obj[2].shape)]


def _describe(obj: tuple) -> tuple[bytes, list[np.ndarray], int] | None:
    """``describe`` the whole way."""
    arrays: list[np.ndarray] = []
    offset = 0
    items: list[Any] = []
    scalars: list[type] = []
    known = _DTYPE_STR  # (names and ``_aligned`` written out: every reply comes here)
    for item in obj:
        kind = type(item)
        if kind is list:
            described = []
            for a in item:
                if type(a) is not np.ndarray:
                    return None
                text = known.get(a.dtype) or _dtype_str(a.dtype)
                if text is None:
                    return None
                described.append((text, a.shape, offset))
                arrays.append(a)
                offset += (a.nbytes + _ALIGN - 1) & _MASK
            items.append(described)
        elif kind is np.ndarray:
            text = known.get(item.dtype) or _dtype_str(item.dtype)
            if text is None:
                return None
            items.append((text, item.shape, offset))
            arrays.append(item)
            offset += (item.nbytes + _ALIGN - 1) & _MASK
        elif kind in _SCALARS:
            items.append(item)
            scalars.append(kind)  # 1 == 1.0 == True: equal descriptions, other pickles
        else:
            return None
    last = _last_head
    if items != last[0] or scalars != last[1]:  # else: the last reply's
        last[:] = items, scalars, pickle.dumps(tuple(items), protocol=pickle.HIGHEST_PROTOCOL)
    return last[2], arrays, offset


def size(head: bytes, data_bytes: int) -> int:
    """Slot bytes that a ``describe``d object needs."""
    return _aligned(len(head)) + data_bytes


def write_arrays(buffer: memoryview, at: int, head: bytes, arrays: list[np.ndarray],
                 ) -> list[np.ndarray | None]:
    """Write a ``describe``d object at ``at`` (the caller checked that it fits); return
    the ``places`` of its arrays, where a writer whose replies repeat copies the next
    ones (``write_places``)."""
    kept = places(buffer, at, head, arrays)
    buffer[at : at + len(head)] = head
    write_places(kept, arrays)
    return kept


def places(buffer: memoryview, at: int, head: bytes, arrays: list[np.ndarray],
           ) -> list[np.ndarray | None]:
    """Where ``write_arrays`` puts each of a ``describe``d object's ``arrays`` in the
    slot at ``at``: a view of the slot for each (None for an empty one)."""
    start = at + _aligned(len(head))
    out: list[np.ndarray | None] = []
    for a in arrays:
        nbytes = a.nbytes
        out.append(np.ndarray(a.shape, a.dtype, buffer, start) if nbytes else None)
        start += _aligned(nbytes)
    return out


def write_places(places: list[np.ndarray | None], arrays: list[np.ndarray]) -> None:
    """``arrays`` into the ``places`` kept for the same description (its head already
    in the slot)."""
    for place, a in zip(places, arrays):  # noqa: B905 (as many: the same description)
        if place is not None:
            place[...] = a


def _array(buffer: memoryview, start: int, description: tuple, copy: bool) -> np.ndarray:
    dtype, shape, offset = description
    if 0 in shape:
        return np.empty(shape, dtype)
    view = np.ndarray(shape, dtype, buffer, start + offset)
    return view.copy() if copy else view


def copied(obj: tuple) -> tuple:
    """A ``read_arrays(copy=False)`` object with its arrays copied out of the slot."""
    return tuple([a.copy() for a in item] if type(item) is list
                 else item.copy() if type(item) is np.ndarray else item for item in obj)


def read_arrays(buffer: memoryview, at: int, length: int, copy: bool = True) -> tuple:
    """The object ``write_arrays`` wrote at ``at`` (``length``: its description's).

    ``copy=False``: the arrays are views of the slot, valid until it is written again
    (a caller that reduces them at once)."""
    start = at + _aligned(length)
    items = pickle.loads(buffer[at : at + length])
    out: list[Any] = []
    for item in items:
        kind = type(item)
        if kind is list:
            out.append([_array(buffer, start, d, copy) for d in item])
        elif kind is tuple:
            out.append(_array(buffer, start, item, copy))
        else:
            out.append(item)
    return tuple(out)
