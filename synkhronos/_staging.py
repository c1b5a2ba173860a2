"""Staging: the shared memory a prepared call copies its numpy arguments into.

A call given numpy arrays (not ``synk.data`` objects) copies each into shared memory
that every process maps, and sends its ``DataRef``. The memory is the call's own,
reused call after call: one ``Buffer`` per input slot of each prepared variant (and one
for ``batch`` indices), held by that variant's ``Staging``.

How a buffer moves::

    put(array)  fits in the allocation     viewed with the array's shape at the start
                                           of the segment, copied in; nothing else
                                           changes (a record kept for another shape
                                           still holds: its ref names the same
                                           segment, and it copies again before it runs)
                does not fit               a new segment, 1.25 times the array's size;
                                           the old one released (the arena drops it in
                                           every process, and that moves the epoch:
                                           every record that named it is stale)

A buffer is not a ``Data``: nobody else writes it, it is never pickled or named, and
viewing it with another shape moves no epoch (a ``Data`` reshaped by the user does:
a bound call holds its rows without a key). Over several machines each buffer has a
replica on every machine (the arena's journal creates it); a put sends the values to
the other machines' leaders through the transport -- a scattered input selected by a
range of rows only the rows each machine's processes take (``replica_rows``), the
other inputs whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._core.session import Session
from ._dataref import DataRef, allocate, publish
from ._runtime import shmem
from ._scatter import block
from ._validate import Checked
from .data import Data

__all__ = ["Buffer", "Split", "Staging", "replica_rows"]

Split = Callable[[int, int, tuple[int, ...] | None], list[tuple[int, int]]]
_GROWTH = 1.25  # a buffer that grows takes this much more than the value, to grow less


def replica_rows(groups: tuple[tuple[int, int], ...] | None, size: int) -> Split | None:
    """``split(start, stop, offsets)``: the rows of ``[start, stop)`` that the processes
    of each copy of the session's memory take (``groups``: per copy, its first rank and
    its number of ranks; the rule that splits rows over ranks, or ``offsets`` when
    ``shares`` split them); None with one copy."""
    if groups is None:
        return None
    copies = list(groups)

    def split(start: int, stop: int, offsets: tuple[int, ...] | None = None
              ) -> list[tuple[int, int]]:
        if offsets is not None:
            return [(start + offsets[first], start + offsets[first + count])
                    for first, count in copies]
        length = stop - start
        return [(start + block(length, size, first)[0],
                 start + block(length, size, first + count - 1)[1])
                for first, count in copies]

    return split


class Buffer:
    """One staging buffer: a segment of the master's, of one dtype, grown only when a
    value does not fit (see the module docstring)."""

    __slots__ = ("dtype", "ndim", "segment", "shape", "rows", "_session", "_map", "_items",
                 "_release", "_views", "__weakref__")

    def __init__(self, session: Session, dtype: np.dtype, ndim: int):
        self.dtype = dtype
        self.ndim = ndim
        self.segment = ""  # no items, no segment (POSIX cannot map zero bytes)
        self.shape: tuple[int, ...] | None = None  # the last value's
        self.rows: list[tuple[int, int]] | None = None  # the rows each machine took of it
        self._session = session
        self._map: Any = None
        self._items = 0
        self._release: Any = None
        self._views: dict[tuple[int, ...], np.ndarray] = {}

    def put(self, array: np.ndarray, rows: list[tuple[int, int]] | None = None) -> DataRef:
        """Copy ``array`` in (cast as numpy's ``copyto`` casts), and return its ref.

        ``rows``: over several machines, send each machine only these rows."""
        size = array.size
        if size > self._items:
            self._grow(max(size, int(size * _GROWTH)))
        view = self.view(array.shape)
        np.copyto(view, array, casting="unsafe")
        self.shape, self.rows = array.shape, rows
        self.publish(view, rows)
        return DataRef(self.segment, self.dtype.str, array.shape)

    def view(self, shape: tuple[int, ...]) -> np.ndarray:
        """The buffer's first items viewed with ``shape`` (one view kept per shape)."""
        view = self._views.get(shape)
        if view is None:
            if self._map is None:
                view = np.empty(shape, self.dtype)
            else:
                view = shmem.array_view(self._map, self.dtype, shape)
            if len(self._views) >= 8:
                self._views.clear()
            self._views[shape] = view
        return view

    def holds(self, ref: DataRef) -> bool:
        """Whether the last value put here is the one ``ref`` describes."""
        return self.segment == ref.segment and self.shape == ref.shape

    def publish(self, view: np.ndarray, rows: list[tuple[int, int]] | None) -> None:
        """Over several machines: ``view``'s values to every other machine's replica
        (``rows``: each machine only these rows)."""
        session = self._session
        if session.replica_groups is None or self._map is None or not session.usable():
            return
        publish(session, self.segment, self._map, view, rows)

    def _grow(self, items: int) -> None:
        # the new segment first: where it does not fit (ENOSPC), nothing has changed
        segment, release = allocate(self, self._session, items * self.dtype.itemsize)
        if self._release is not None:
            self._release()  # (moves the epoch: the arena drops its mapping)
        self.segment, self._map, self._items = segment.name, segment.buffer, items
        self._release, self._views = release, {}


@dataclass
class Staging:
    """The buffers of one prepared variant, for numpy inputs and batch indices.

    One command may hold several calls of the same variant (``synkhronos.steps``):
    each gets its own buffers (``command`` tells which command is being prepared), so no
    call overwrites the arrays of another still waiting to run.

    ``split``: over several machines, the rows each machine takes (``replica_rows``).
    """

    session: Session
    split: Split | None = None
    buffers: dict = field(default_factory=dict)  # (slot, use in the command) -> Buffer
    _command: int = -1
    _uses: dict = field(default_factory=dict)  # slot -> calls staged in this command

    def put(self, slot: Any, array: np.ndarray, command: int = -1,
            rows: list[tuple[int, int]] | None = None) -> DataRef:
        """Copy ``array`` into the buffer for ``slot``; return its ref.

        ``rows``: over several machines, send each machine only these rows."""
        if command != self._command:
            self._command, self._uses = command, {}
        use = self._uses.get(slot, 0)
        self._uses[slot] = use + 1
        key = (slot, use)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.dtype != array.dtype or buffer.ndim != array.ndim:
            buffer = self.buffers[key] = Buffer(self.session, array.dtype, array.ndim)
        return buffer.put(array, rows)

    def destinations(self, refs: tuple, arrays: tuple[int, ...]
                     ) -> tuple[tuple[Buffer, ...], tuple | None] | None:
        """Where a call whose ``refs`` this staging holds copies its numpy arguments (at
        ``arrays``) when it repeats, while the epoch stands (no buffer moved), and over
        several machines the rows each machine takes of each (None on one machine).
        None where a buffer does not hold its ref (the call was staged as a later one
        in its command). The buffers, not their arrays: an array kept would keep a
        regrown buffer's old memory mapped."""
        kept = []
        for i in arrays:
            buffer = self.buffers.get((i, 0))
            if buffer is None or not buffer.holds(refs[i]):
                return None
            kept.append(buffer)
        rows = None if self.split is None else tuple(buffer.rows for buffer in kept)
        return tuple(kept), rows

    def stage(self, checked: Checked, command: int, n_scattered: int = 0,
              offsets: tuple[int, ...] | None = None, axes: tuple[int, ...] | None = None
              ) -> tuple[list[DataRef], tuple[int, int], DataRef | None]:
        """Refs for every input and the batch indices; numpy values are copied in
        (``axes``: the row axis of each scattered input, None: 0 for all; an input
        whose rows are not its axis 0 goes to every machine whole)."""
        selection = checked.batch
        rows = None
        if (self.split is not None and selection is not None
                and selection.indices is None):
            rows = self.split(selection.start, selection.stop, offsets)
        refs = [
            value.ref() if isinstance(value, Data)
            else self.put(i, value, command, rows if i < n_scattered and not (
                axes and axes[i]) else None)
            for i, value in enumerate(checked.values)
        ]
        if selection is None or selection.indices is None:
            indices = None
            span = (selection.start, selection.stop) if selection is not None else (0, 0)
        else:
            indices = self.put("batch", np.asarray(selection.indices, dtype=np.int64), command)
            span = (0, 0)
        return refs, span, indices
