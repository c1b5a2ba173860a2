"""The CPU backend's exchange buffers: their layout in memory and the arithmetic on them.

This module owns what a resident segment holds, byte by byte, and the kernels that
combine the ranks' values. Nothing here needs the backend instance: only a mapped
buffer, the variables, and the session's rank. ``cpu.py`` creates, maps and drops
the segments and runs the commands that call into here.

A resident segment for a list of variables on ``n`` ranks::

    header      one line of ``_LINE`` int64 per rank; rank ``r`` posts its status
                (``_OK``, ``_MISMATCH`` or ``_FAILED``) at ``header[r * _LINE]``
    slot 0      the list's ``FusedLayout``; header and slots start on a page
    ...
    slot n - 1

``_Group`` maps that onto numpy views: ``slots[rank][variable]``, the same views
flat (``flats``), and the other way round (``columns[variable][rank]``). A large
group (over ``SMALL_BYTES``) is cut into one piece per rank (``FusedLayout.pieces``),
and ``foreign[rank]`` lists, per variable, the ranges outside rank ``rank``'s own
pieces: what it copies into its slot for the others to reduce.

How values move through the kernels:

1. ``CpuBackend._load`` copies each rank's values into its slot (of a large group only
   the ``foreign`` ranges: a rank reads its own pieces from its storage) and posts
   the rank's status in its header line;
2. after a barrier, ``_refusal`` reads every status: a rank's own failure is raised,
   and if any rank posted other than ``_OK``, every rank replies its shapes, which
   ``_raise_mismatch`` turns into the master's ``ValueError``;
3. the op's ufunc (``_KERNELS``; ``avg`` is the sum divided by the count) combines
   them: ``_fold`` into a slot's piece, ``_combined`` into a new array (small
   groups), ``_pair_reduce`` into the worker's slot (two ranks: no barrier and
   no header, the worker checks the shapes itself).
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from .._reducers import _UFUNCS, ReduceOp
from ..session import Session
from .backend import FusedLayout, Targets

__all__ = ["SMALL_BYTES"]

SMALL_BYTES = 1 << 16  # lists up to this size take the one-barrier path
_PAGE = mmap.PAGESIZE
_LINE = 8  # int64 per rank in a resident header (one cache line)
_OK, _MISMATCH, _FAILED = 0, 1, 2
_KERNELS = {op.value: (ufunc, op is ReduceOp.AVG) for op, ufunc in _UFUNCS.items()}


def _paged(nbytes: int) -> int:
    return max(_PAGE, -(-nbytes // _PAGE) * _PAGE)


def _storage(var: Any) -> np.ndarray:
    return var.container.storage[0]


def _store(var: Any, array: np.ndarray) -> None:
    """Make ``array`` the storage of ``var``, no copy. Only for arrays built here with
    the variable's dtype and shape, which its type's filter would pass through as is."""
    var.container.storage[0] = array


def _fold(out: np.ndarray, first: np.ndarray, others: list[np.ndarray], op: str) -> None:
    """``out = op(first, *others)`` elementwise (``avg``: the plain mean); ``first`` may
    be ``out`` itself."""
    if not others:
        np.copyto(out, first)
        return
    ufunc, mean = _KERNELS[op]
    ufunc(first, others[0], out=out)
    for other in others[1:]:
        ufunc(out, other, out=out)
    if mean:
        np.true_divide(out, len(others) + 1, out=out)


def _complement(size: int, taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges of ``[0, size)`` outside the sorted, disjoint ranges ``taken``."""
    free, start = [], 0
    for lo, hi in taken:
        if lo > start:
            free.append((start, lo))
        start = hi
    if start < size:
        free.append((start, size))
    return free


def _combined(views: list[np.ndarray], op: str) -> np.ndarray:
    """A new array: ``op`` over ``views`` (at least two) elementwise."""
    ufunc, mean = _KERNELS[op]
    first = views[0]
    out = np.empty(first.shape, first.dtype)
    ufunc(first, views[1], out=out)
    for view in views[2:]:
        ufunc(out, view, out=out)
    if mean:
        out /= len(views)
    return out


class _Group:
    """One list of variables, its fused layout, and its resident segment (per process)."""

    def __init__(self, key: int, name: str, buffer: Any, layout: FusedLayout,
                 variables: list, n: int):
        self.key, self.name, self.layout, self.variables = key, name, layout, variables
        header, stride = self.geometry(layout, n)
        self.header = memoryview(buffer)[: 8 * _LINE * n].cast("q")
        self.lines = tuple(range(0, _LINE * n, _LINE))  # rank r's status: header[r * _LINE]
        self.slots = [layout.views(buffer, header + r * stride) for r in range(n)]
        self.flats = [[view.reshape(-1) for view in slot] for slot in self.slots]
        self.columns = [list(views) for views in zip(*self.slots, strict=True)]  # variable -> ranks
        self.small = layout.data_bytes <= SMALL_BYTES
        self.pair = self.small and n == 2  # all_reduce without a barrier, see _pair_reduce
        self.pairs: list[tuple] | None = None  # the worker's (variable, master's view, own view)
        self.pieces = None if self.small else layout.pieces(n)
        self.foreign = None if self.small else [  # rank -> variable -> ranges to copy in
            [_complement(size, [(lo, hi) for j, lo, hi in mine if j == i])
             for i, size in enumerate(layout.sizes)]
            for mine in self.pieces
        ]

    @staticmethod
    def geometry(layout: FusedLayout, n: int) -> tuple[int, int]:
        """(header bytes, slot stride) of a resident segment."""
        return _paged(8 * _LINE * n), _paged(layout.total)

    @classmethod
    def segment_bytes(cls, layout: FusedLayout, n: int) -> int:
        header, stride = cls.geometry(layout, n)
        return header + n * stride

    def refused(self) -> bool:
        header = self.header
        for line in self.lines:
            if header[line]:
                return True
        return False

    def reduced(self, op: str) -> list[np.ndarray]:
        """New arrays: ``op`` over every rank's slot (small groups, two ranks or more)."""
        return [_combined(views, op) for views in self.columns]


def _refusal(group: _Group, failure: BaseException | None) -> Any:
    """After the first barrier: what every rank replies if any rank cannot go on."""
    if failure is not None:
        raise failure
    if group.refused():
        return tuple(_storage(var).shape for var in group.variables)
    return None


def _pair_reduce(session: Session, group: _Group, op: str) -> Any:
    """The one worker of two: combine its values with the master's, which the master
    wrote into its slot before the command, into its own slot, where the master
    copies the result from. No barrier: the master changes nothing until the worker
    has finished. Both keep their values in their slots for the next call."""
    pairs = group.pairs
    if pairs is None:
        pairs = group.pairs = list(zip(group.variables, group.slots[session.master_rank],
                                       group.slots[session.rank], strict=True))
    for var, _, view in pairs:
        value = var.container.storage[0]
        if value is not view and value.shape != view.shape:
            return tuple(_storage(var).shape for var in group.variables)
    ufunc, mean = _KERNELS[op]
    for var, first, out in pairs:
        value = var.container.storage[0]
        ufunc(first, value, out=out)
        if mean:
            out /= 2
        if value is not out:
            _store(var, out)
    return None


def _raise_mismatch(targets: Targets, replies: list, expected: tuple) -> None:
    """Raise the ValueError of a reduce refused because shapes differ across ranks.

    A rank replies its shapes when the reduce was refused, None when its shapes are
    the master's (``expected``).
    """
    if replies.count(None) == len(replies):
        return
    per_rank = [expected if reply is None else reply for reply in replies]
    for i, label in enumerate(targets.labels):
        if len({shapes[i] for shapes in per_rank}) > 1:
            got = ", ".join(f"{shapes[i]} in rank {r}" for r, shapes in enumerate(per_rank))
            raise ValueError(
                f"reduce and all_reduce need {label} to have the same shape in every "
                f"process; got {got} (use gather or all_gather for values whose "
                f"shapes differ)"
            )
