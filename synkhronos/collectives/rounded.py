"""The low-precision exchange through shared memory: a group's 16-bit wire, each rank's
rounding into it, and the folds out of it.

``all_reduce`` and ``reduce_scatter`` with ``exchange="bf16"`` or ``"fp16"`` (float32
values; op ``sum`` or ``avg``) send every rank's values as 16-bit words rather than the
values themselves. A group that takes such an exchange gets a **wire** beside its
segment: a second segment with one slot per rank of the session, each holding the
group's elements back to back as 16-bit words (half the bytes of the values). It is
made by the master the first time (``CpuBackend.wire``), named in that command, kept
with the group and released with it.

The exchange, in every rank (``_runtime/lowprec.py`` holds the kernels):

1. ``encode_and_vote``: round this rank's values into its wire slot, then vote that
   every rank's shapes are the group's (``ctx.meeting.agree``, a barrier: once it
   passes, every wire slot is written; if any rank's shapes differ, every rank leaves,
   its values unchanged);
2. ``fold_pieces``: for the elements this rank combines, every rank's words, widened
   and summed in float32 in rank order, into a float32 slot of the group;
3. the backend spreads the results as the exact exchange does (float32 pieces copied
   between the group's slots) and binds each variable to its slot.

So what crosses between processes is each value once as 16 bits (step 2 reads the
other ranks' words) and the float32 results (step 3), where the exact exchange reads
the other ranks' float32 values in step 2.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from .. import _pytensor
from .._core import faults
from .._core.context import RankContext
from .._reducers import ReduceOp
from .._runtime.lowprec import Exchange, encode, fold
from .backend import FusedLayout

__all__ = ["Wire", "encode_and_vote", "fold_pieces", "whole"]

_PAGE = mmap.PAGESIZE


class Wire:
    """A group's 16-bit words, one slot per rank, in one segment (every process maps it).

    Parameters
    ----------
    name : str
        The segment's name (what the command that introduces it carries).
    buffer
        The segment's mapping.
    layout : FusedLayout
        The group's layout: its variables' element counts, in order.
    slots : int
        Ranks in the session (slot ``r`` is rank ``r``'s, on every machine).
    """

    def __init__(self, name: str, buffer: Any, layout: FusedLayout, slots: int) -> None:
        self.name, self.buffer = name, buffer
        self.starts = tuple(int(s) for s in np.cumsum((0,) + layout.sizes[:-1]))
        self.count = sum(layout.sizes)
        self.stride = self.slot_bytes(layout)
        self.slots = [np.frombuffer(buffer, np.uint16, self.count, rank * self.stride)
                      for rank in range(slots)]

    @staticmethod
    def slot_bytes(layout: FusedLayout) -> int:
        return max(_PAGE, -(-2 * sum(layout.sizes) // _PAGE) * _PAGE)

    @classmethod
    def segment_bytes(cls, layout: FusedLayout, slots: int) -> int:
        return slots * cls.slot_bytes(layout)

    def words(self, rank: int, index: int, lo: int, hi: int) -> np.ndarray:
        """Rank ``rank``'s words of elements ``lo:hi`` of variable ``index``."""
        start = self.starts[index]
        return self.slots[rank][start + lo:start + hi]


def whole(layout: FusedLayout) -> list[tuple[int, int, int]]:
    """``(variable, first, stop)`` of every element of ``layout``."""
    return [(i, 0, size) for i, size in enumerate(layout.sizes)]


def encode_and_vote(ctx: RankContext, group: Any, exchange: Exchange) -> bool:
    """This rank's values (through the placement: from a device too) rounded into its
    wire slot; whether every rank's shapes are the group's (every rank learns the same,
    and once it is True every rank's slot is written)."""
    ok = True
    wire, to_host = group.wire, ctx.placement.to_host
    for i, (var, shape) in enumerate(zip(group.variables, group.layout.shapes, strict=True)):
        value = to_host(_pytensor.value(var))
        if value.shape != shape:
            ok = False
            break
        encode(exchange, value.reshape(-1), wire.words(ctx.rank, i, 0, value.size))
    if not ctx.meeting.agree(ctx, ok):
        return False
    if faults.ARMED:
        faults.hit("exchange")
    return True


def fold_pieces(ctx: RankContext, group: Any, exchange: Exchange, op: ReduceOp,
                triples: list[tuple[int, int, int]], into: list[np.ndarray]) -> None:
    """For each ``(variable, first, stop)`` of ``triples``: every rank's words of those
    elements folded in rank order (``sum``, or ``avg``: divided by the ranks) into
    ``into[variable][first:stop]`` (float32, flat)."""
    wire, n = group.wire, ctx.size
    count = n if op is ReduceOp.AVG else None
    for i, lo, hi in triples:
        fold(exchange, into[i][lo:hi], [wire.words(rank, i, lo, hi) for rank in range(n)],
             count)
