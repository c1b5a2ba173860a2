"""The ``"cpu"`` backend: exchange buffers in POSIX shared memory, reduced by all ranks.

This module owns which exchange segments exist (made and released through the arena),
how a group is laid out in one, and the primitives over it. Which variables, which
checks, and where results end up is ``fused.py``'s.

A **group** is one segment holding one slot per rank, each slot the list's
``FusedLayout``, on page boundaries. Each process's variables live in its own slot
between commands (``fused.py`` points their storage there), so the next collective on
the same list copies nothing in and its result needs no copy out. Variables live in
it, so a group never changes layout: new shapes get a new segment, and the old one is
released once no variable uses it. At most ``MAX_GROUPS`` are kept (least recently
used first out). The **scratch** is one segment per session for per-rank regions of
differing sizes (gather, scatter, ...); nothing views it after a command, so any
command may lay it out anew; it only grows.

The primitives, in rank ``r`` of ``n``, after every rank loaded its values (and voted
that its shapes match, ``RankContext.agree``: a barrier):

- ``reduce_scatter``: fold piece ``r`` of every rank's values into slot ``r`` (its own
  value read where it lies: its storage or its slot);
- ``all_gather``: barrier, then copy every other piece from its owner's slot;
- ``all_reduce``: a small group (at most ``SMALL_BYTES``) combines all slots into new
  arrays (no second barrier); a large one is ``reduce_scatter`` + ``all_gather``, so
  every rank works on the reduction at once and no byte crosses memory twice;
- ``reduce``: the same folds, into the root's slot or a given output;
- ``broadcast``: copy the root's slot into this rank's.

With two processes a small ``all_reduce`` needs no barrier at all (``pair_reduce``):
the master writes its values into its slot before the command, the worker combines
them with its own into its slot, and the master copies the result once the command
returns.

A segment is created by the master and mapped by every rank in the command that first
names it; the master unlinks the name right after that command (``settle``; mappings
stay valid), so ``/dev/shm`` holds nothing of ours between commands. A replaced
segment is released through the arena, whose log tells the workers to drop it.

Over several machines every machine has its own replica of each segment (the arena's
journal), laid out the same everywhere: in ``fast`` mode a group holds one slot per
process of a machine (the largest machine's count), each process's at its local rank;
in ``exact`` mode one slot per process of the whole session, each at its global rank,
so that every machine can hold every process's values. ``Group`` indexes its views by
global rank either way (``None`` where a rank has no slot here); the primitives
between machines are in ``hierarchy.py``.
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _pytensor
from .._core.context import RankContext
from .._reducers import ReduceOp, combine_into, combined, ufunc_of
from .._runtime.arena import Segment
from ..distribute import REGISTRY
from .backend import Backend, FusedLayout, GroupSpec, Targets, register_backend

__all__ = ["CpuBackend", "Group", "SMALL_BYTES", "MAX_GROUPS", "slot_count"]

SMALL_BYTES = 1 << 16  # lists up to this size take the one-barrier path
MAX_GROUPS = 64  # resident groups kept; the least recently used one goes first
_PAGE = mmap.PAGESIZE


def _paged(nbytes: int) -> int:
    return max(_PAGE, -(-nbytes // _PAGE) * _PAGE)


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


def _foreign(layout: FusedLayout, pieces: list) -> list:
    """Per part, per variable: the ranges outside the part's own pieces."""
    return [[_complement(size, [(lo, hi) for j, lo, hi in mine if j == i])
             for i, size in enumerate(layout.sizes)]
            for mine in pieces]


def slot_count(ctx: RankContext) -> int:
    """Slots in a group's segment: one per process (one machine, or ``exact`` mode over
    several), else one per process of the largest machine."""
    if ctx.n_nodes == 1 or ctx.exact:
        return ctx.size
    return max(ctx.local_sizes)


class Group:
    """One list of variables, its fused layout, and its segment (per process).

    ``slots``, ``flats``, ``pieces`` and ``foreign`` are indexed by (global) rank;
    ``columns`` holds, per variable, the slots of this machine's processes.
    """

    def __init__(self, key: int, name: str, buffer: Any, layout: FusedLayout,
                 variables: list, ctx: RankContext):
        self.key, self.name, self.layout, self.variables = key, name, layout, variables
        self.buffer = buffer
        stride = self.stride(layout)
        n = ctx.size
        self.pieces = layout.pieces(n)
        self.small = layout.data_bytes <= SMALL_BYTES
        self.pairs: list[tuple] | None = None  # worker: (var, master's, own, 2)
        self.steps: dict[Any, Any] = {}  # the master's repeated steps on this group
        self.slots: list[Any]  # rank -> its slot's views (None: no slot on this machine)
        self.flats: list[Any]
        self.foreign: list[Any]
        if ctx.n_nodes == 1:
            self.slots = [layout.views(buffer, r * stride) for r in range(n)]
            self.flats = [[view.reshape(-1) for view in slot] for slot in self.slots]
            self.columns = [list(views) for views in zip(*self.slots, strict=True)]
            self.pair = self.small and n == 2  # all_reduce without a barrier: pair_reduce
            self.foreign = _foreign(layout, self.pieces)  # rank -> variable -> ranges
            return
        first = ctx.offsets[ctx.node]
        local = range(first, first + ctx.local_size)
        self.base = 0 if ctx.exact else first  # slot index = rank - base
        present = range(n) if ctx.exact else local
        self.slots = [None] * n
        for rank in present:
            self.slots[rank] = layout.views(buffer, (rank - self.base) * stride)
        self.flats = [None if slot is None else [view.reshape(-1) for view in slot]
                      for slot in self.slots]
        self.columns = [list(views) for views in zip(*(self.slots[r] for r in local),
                                                     strict=True)]
        self.pair = False
        self.local_pieces = layout.pieces(ctx.local_size)  # this machine's own split
        self.foreign = [None] * n
        for rank, ranges in zip(local, _foreign(layout, self.local_pieces), strict=True):
            self.foreign[rank] = ranges

    @staticmethod
    def stride(layout: FusedLayout) -> int:
        return _paged(layout.total)

    @classmethod
    def segment_bytes(cls, layout: FusedLayout, n: int) -> int:
        return n * cls.stride(layout)


@register_backend("cpu")
class CpuBackend(Backend):
    """Collectives through POSIX shared memory (one instance per process)."""

    def __init__(self) -> None:
        self._by_key: dict[int, Group] = {}  # every process: groups by key
        self._owned: dict[str, Segment] = {}  # master: segments it made, by name
        self._groups: OrderedDict[tuple[int, ...], Group] = OrderedDict()  # master
        self._scratch: str | None = None  # master: name of the current scratch
        self._next_key = 0
        self._evicted: list[int] = []

    # -- master: segments ----------------------------------------------------------------
    def _create(self, ctx: RankContext, nbytes: int) -> Segment:
        segment = ctx.arena.create(nbytes)
        self._owned[segment.name] = segment
        return segment

    def _release(self, ctx: RankContext, name: str) -> None:
        segment = self._owned.pop(name, None)
        if segment is not None:
            ctx.arena.release(segment.id)

    def settle(self, ctx: RankContext, new: Sequence[str]) -> None:
        for name in new:  # every rank mapped it: the name is no longer needed
            ctx.arena.discard(name, replicated=True)

    def discard(self, ctx: RankContext, new: Sequence[str]) -> None:
        for name in new:  # some rank may not have mapped it: start afresh
            if name == self._scratch:
                self._scratch = None
            for uids, group in list(self._groups.items()):
                if group.name == name:
                    del self._groups[uids]
                    self._by_key.pop(group.key, None)
                    self._evicted.append(group.key)
            self._release(ctx, name)

    def resident(self, ctx: RankContext, targets: Targets,
                 shapes: tuple[tuple[int, ...], ...]) -> tuple[Group, GroupSpec | None]:
        group = self._groups.get(targets.uids)
        if group is not None and group.layout.shapes == shapes:
            self._groups.move_to_end(targets.uids)
            return group, None
        if group is not None:
            del self._groups[targets.uids]
            self._retire(ctx, group)
        elif len(self._groups) >= MAX_GROUPS:
            self._retire(ctx, self._groups.popitem(last=False)[1])
        key = self._next_key
        self._next_key += 1
        layout = FusedLayout(targets.dtypes, shapes)
        segment = self._create(ctx, Group.segment_bytes(layout, slot_count(ctx)))
        group = Group(key, segment.name, segment.buffer, layout, list(targets.variables),
                      ctx)
        self._groups[targets.uids] = self._by_key[key] = group
        spec = GroupSpec(key, segment.name, tuple(d.str for d in layout.dtypes), shapes,
                         targets.uids, tuple(self._evicted))
        self._evicted = []
        return group, spec

    def current(self, ctx: RankContext, targets: Targets) -> Group | None:
        """Master: the group of ``targets`` if every variable still lives in the
        master's slot (nothing to copy in, no new layout)."""
        group = self._groups.get(targets.uids)
        if group is None or not _pytensor.bound_to(targets.variables,
                                                  group.slots[ctx.master_rank]):
            return None
        self._groups.move_to_end(targets.uids)
        return group

    def _retire(self, ctx: RankContext, group: Group) -> None:
        self._by_key.pop(group.key, None)
        self._evicted.append(group.key)
        self._release(ctx, group.name)

    def regions(self, ctx: RankContext, nbytes: int) -> tuple[Any, str | None]:
        current = self._owned.get(self._scratch) if self._scratch else None
        if current is not None and current.nbytes >= nbytes:
            return current.buffer, None
        if current is not None:
            self._release(ctx, current.name)
        size = _paged(max(nbytes, 2 * current.nbytes if current is not None else 0))
        segment = self._create(ctx, size)
        self._scratch = segment.name
        return segment.buffer, segment.name

    @property
    def scratch_name(self) -> str:
        assert self._scratch is not None, "no scratch made yet"
        return self._scratch

    # -- every process ---------------------------------------------------------------------
    def scratch(self, ctx: RankContext, name: str) -> Any:
        owned = self._owned.get(name)
        return owned.buffer if owned is not None else ctx.arena.map(name)

    def group(self, ctx: RankContext, key: int, spec: GroupSpec | None) -> Group:
        if spec is None or ctx.is_master:
            return self._by_key[key]
        for old in spec.evicted:
            self._by_key.pop(old, None)
        shared = REGISTRY.get(ctx).shared
        group = Group(key, spec.name, ctx.arena.map(spec.name),
                      FusedLayout(spec.dtypes, spec.shapes),
                      [shared[uid] for uid in spec.uids], ctx)
        self._by_key[key] = group
        return group

    # -- primitives ------------------------------------------------------------------------
    def reduce_scatter(self, ctx: RankContext, group: Group, op: ReduceOp,
                       values: list[np.ndarray]) -> None:
        rank, n, flats = ctx.rank, ctx.size, group.flats
        own = flats[rank]
        for i, lo, hi in group.pieces[rank]:
            others = [flats[k][i][lo:hi] for k in range(n) if k != rank]
            combine_into(own[i][lo:hi], values[i][lo:hi], others, op)

    def all_gather(self, ctx: RankContext, group: Group) -> None:
        ctx.barrier()
        rank, flats = ctx.rank, group.flats
        own = flats[rank]
        for k in range(ctx.size):
            if k != rank:
                for i, lo, hi in group.pieces[k]:
                    own[i][lo:hi] = flats[k][i][lo:hi]

    def all_reduce(self, ctx: RankContext, group: Group, op: ReduceOp,
                   values: list[np.ndarray]) -> list[np.ndarray]:
        if group.small:  # every slot is loaded (the vote was a barrier): combine them all
            return [combined(views, op) for views in group.columns]
        self.reduce_scatter(ctx, group, op, values)
        self.all_gather(ctx, group)
        return group.slots[ctx.rank]

    def reduce(self, ctx: RankContext, group: Group, op: ReduceOp, values: list[np.ndarray],
               out: list[np.ndarray] | None) -> None:
        rank, n, root = ctx.rank, ctx.size, ctx.master_rank
        flats = group.flats
        if out is None:
            out = flats[root]
        if group.small:  # the root alone: every slot is loaded
            if rank == root:
                for i, views in enumerate(group.columns):
                    out[i][...] = combined(views, op).reshape(-1)
            return
        for i, lo, hi in group.pieces[rank]:
            pieces = [values[i][lo:hi] if k == rank else flats[k][i][lo:hi] for k in range(n)]
            first = pieces.pop(root)
            combine_into(out[i][lo:hi], first, pieces, op)

    def broadcast(self, ctx: RankContext, group: Group, root: int) -> None:
        if ctx.rank != root:
            for source, view in zip(group.slots[root], group.slots[ctx.rank], strict=True):
                np.copyto(view, source)

    def pair_reduce(self, ctx: RankContext, group: Group, op: ReduceOp) -> tuple | None:
        """The worker of two: combine its values with the master's (written into the
        master's slot before the command) into its own slot, where the master copies
        the result from. No barrier: the master changes nothing until the worker has
        finished. Replies the worker's shapes if they differ from the master's."""
        pairs = group.pairs
        if pairs is None:  # the divisor typed once: a Python 2 costs a microsecond a call
            pairs = group.pairs = [(var, first, out, np.array(2, out.dtype)) for var, first, out
                                   in zip(group.variables, group.slots[ctx.master_rank],
                                          group.slots[ctx.rank], strict=True)]
        for var, _, view, _ in pairs:
            value = _pytensor.value(var)
            if value is not view and value.shape != view.shape:
                return tuple(_pytensor.value(v).shape for v in group.variables)
        ufunc, mean = ufunc_of(op)
        for var, first, out, two in pairs:
            value = _pytensor.value(var)
            ufunc(first, value, out=out)
            if mean:
                np.true_divide(out, two, out=out)
            if value is not out:
                _pytensor.bind(var, out)
        return None
