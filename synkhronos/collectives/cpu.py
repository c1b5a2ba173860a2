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
that its shapes match, ``ctx.meeting.agree``: a barrier):

- ``reduce_scatter``: fold piece ``r`` of every rank's values into slot ``r`` (its own
  value read where it lies: its storage or its slot);
- ``all_gather``: barrier, then copy every other piece from its owner's slot;
- ``all_reduce``: a small group (at most ``SMALL_BYTES``) combines all slots into new
  arrays (no second barrier); a large one is ``reduce_scatter`` + ``all_gather``, so
  every rank works on the reduction at once and no byte crosses memory twice;
- ``reduce``: the same folds, into the root's slot or a given output;
- ``broadcast``: copy the root's slot into this rank's;
- ``low_precision_all_reduce`` / ``low_precision_reduce_scatter`` (``exchange="bf16"`` or
  ``"fp16"``): each rank rounds its values into its slot of the group's wire
  (``rounded.py``) before the vote, and folds its piece (a small group: everything) from
  every rank's 16-bit words into its own slot; the large all-reduce then copies the
  other pieces as above.

With two processes a small ``all_reduce`` needs no barrier at all (``pair_reduce``):
the master writes its values into its slot before the command, the worker combines
them with its own into its slot, and the master copies the result once the command
returns.

A segment is created by the master and mapped by every rank in the command that first
names it; the master unlinks the name right after that command (``settle``; mappings
stay valid), so ``/dev/shm`` holds nothing of ours between commands. A replaced
segment is released through the arena, whose log tells the workers to drop it.

A group's rank-side primitives take its variables: each rank loads its values into
its slot (``load``; only what the others read, where a rank reads its own values in
place), votes, runs the folds, and binds each variable to its result (``rebind``),
through the session's placement (the identity on CPU; ``staged.py`` crosses to the
device there). Over several machines ``_machines/backend.py`` wraps this backend: it lays
groups out with its own ``Group`` subclass (``group_type``) and uses ``load`` and
``rebind`` around its own folds.
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _pytensor
from .._core import faults
from .._core.context import RankContext
from .._reducers import ReduceOp, combine_into, combined, ufunc_of
from .._runtime.arena import Segment
from .._runtime.lowprec import Exchange
from ..distribute import REGISTRY
from . import backend
from .backend import (
    Backend,
    FusedLayout,
    GroupSpec,
    Targets,
    column,
    host_value,
    register_backend,
    store_value,
)
from .rounded import Wire, encode_and_vote, fold_pieces, whole

__all__ = ["CpuBackend", "Group", "SMALL_BYTES", "MAX_GROUPS", "foreign_ranges",
           "give_own_piece", "load", "loaded", "rebind"]

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


def foreign_ranges(layout: FusedLayout, pieces: list) -> list:
    """Per part, per variable: the ranges outside the part's own pieces."""
    return [[_complement(size, [(lo, hi) for j, lo, hi in mine if j == i])
             for i, size in enumerate(layout.sizes)]
            for mine in pieces]


def _scratch_of(slot: np.ndarray) -> np.ndarray:
    """Where a kernel writes when its operand is ``slot`` and so is its output: a new
    array for a one-element slot, since numpy copies a one-element operand that is also
    the output (an add of one float32: 0.65 against 0.25 us, numpy 2.4); ``slot``
    itself for larger ones, which numpy reads in place."""
    return np.empty_like(slot) if slot.size == 1 else slot


class Group(backend.Group):
    """One list of variables, its fused layout, and its segment (per process).

    ``slots``, ``flats``, ``pieces`` and ``foreign`` are indexed by (global) rank;
    ``columns`` holds, per variable, one view of it in the slots of the processes that
    share this segment (its first axis: the slot; ``backend.column``). One slot per
    process, at its rank; a subclass (``_machines/backend.py``) lays out groups that span
    machines (``_lay_out``, ``slot_count``).
    """

    def __init__(self, key: int, name: str, buffer: Any, layout: FusedLayout,
                 variables: list, ctx: RankContext):
        super().__init__(key, layout, variables)
        self.name, self.buffer = name, buffer
        self.pieces = layout.pieces(ctx.size)
        self.small = layout.data_bytes <= SMALL_BYTES
        self.pairs: list[tuple] | None = None  # worker: (var, master's, own, 2, scratch)
        self.wire: Wire | None = None  # its 16-bit buffers, once a low-precision exchange ran
        self.slots: list[Any]  # rank -> its slot's views (None: no slot here)
        self.flats: list[Any]
        self.foreign: list[Any]
        self._lay_out(ctx, self.stride(layout))

    def _lay_out(self, ctx: RankContext, stride: int) -> None:
        n, layout = ctx.size, self.layout
        self.slots = [layout.views(self.buffer, r * stride) for r in range(n)]
        self.flats = [[view.reshape(-1) for view in slot] for slot in self.slots]
        self.columns = [column(views) for views in zip(*self.slots, strict=True)]
        self.pair = self.small and n == 2  # all_reduce without a barrier: pair_reduce
        self.foreign = foreign_ranges(layout, self.pieces)  # rank -> variable -> ranges

    @classmethod
    def slot_count(cls, ctx: RankContext) -> int:
        """Slots in a group's segment: one per process."""
        return ctx.size

    @staticmethod
    def stride(layout: FusedLayout) -> int:
        return _paged(layout.total)

    @classmethod
    def segment_bytes(cls, layout: FusedLayout, n: int) -> int:
        return n * cls.stride(layout)


# -- a rank's values in and out of its slot ---------------------------------------------
def load(ctx: RankContext, group: Group, whole: bool) -> tuple[list[np.ndarray], bool]:
    """Copy this rank's values into its slot; per variable, the flat array holding its
    value (its storage or its slot); and whether its shapes are the group's.

    ``whole``: copy everything (every rank reads every slot); otherwise only the
    ranges the other ranks read (``Group.foreign``: a rank reads its own values where
    they lie).
    """
    rank, values = ctx.rank, []
    foreign = None if whole else group.foreign[rank]
    to_host = ctx.placement.to_host
    for i, (var, view) in enumerate(zip(group.variables, group.slots[rank], strict=True)):
        value = to_host(_pytensor.value(var))
        if value is view:
            values.append(group.flats[rank][i])
            continue
        if value.shape != view.shape:
            return values, False
        if foreign is None:
            view[...] = value
            values.append(group.flats[rank][i])
            continue
        flat, slot = value.reshape(-1), group.flats[rank][i]
        values.append(flat)
        for lo, hi in foreign[i]:
            slot[lo:hi] = flat[lo:hi]
    return values, True


def loaded(ctx: RankContext, group: Group, whole: bool) -> list[np.ndarray] | None:
    """Load and vote: this rank's values (``load``), or None if any rank's shapes
    differ (every rank then returns None, nothing changed)."""
    values, ok = load(ctx, group, whole)
    if not ctx.meeting.agree(ctx, ok):
        return None
    if faults.ARMED:
        faults.hit("exchange")
    return values


def rebind(ctx: RankContext, variables: list, results: Sequence[np.ndarray]) -> None:
    """Point each variable's storage at its result (no copy on CPU; on a device, a
    device copy of it)."""
    to_device = ctx.placement.to_device
    for var, result in zip(variables, results, strict=True):
        if _pytensor.value(var) is not result:
            _pytensor.bind(var, to_device(result))


def give_own_piece(ctx: RankContext, group: Group, owner: int | None = None) -> None:
    """This rank's piece of its values into the slot of ``owner`` (default: its own),
    where the other ranks read it (before an all-gather of the pieces); nothing is
    copied where its values are that slot."""
    owner = ctx.rank if owner is None else owner
    target, slots = group.flats[owner], group.slots[owner]
    for i, lo, hi in group.pieces[ctx.rank]:
        value = host_value(ctx, group.variables[i])
        if value is not slots[i]:
            target[i][lo:hi] = value.reshape(-1)[lo:hi]


@register_backend("cpu")
class CpuBackend(Backend[Group]):
    """Collectives through POSIX shared memory (one instance per process)."""

    def __init__(self, group_type: type[Group] = Group) -> None:
        self.group_type = group_type  # how groups are laid out in their segments
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
                if group.wire is not None and group.wire.name == name:
                    group.wire = None  # (made again, under a new name, when next needed)
                if group.name == name:
                    del self._groups[uids]
                    self._retire(ctx, group)
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
        kind = self.group_type
        segment = self._create(ctx, kind.segment_bytes(layout, kind.slot_count(ctx)))
        group = kind(key, segment.name, segment.buffer, layout, list(targets.variables),
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
        if group.wire is not None:
            self._release(ctx, group.wire.name)

    def wire(self, ctx: RankContext, group: Group) -> str | None:
        """Master: the group's wire (``rounded.py``), made the first time: then its name."""
        if group.wire is not None:
            return None
        segment = self._create(ctx, Wire.segment_bytes(group.layout, ctx.size))
        group.wire = Wire(segment.name, segment.buffer, group.layout, ctx.size)
        return segment.name

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
        group = self.group_type(key, spec.name, ctx.arena.map(spec.name),
                      FusedLayout(spec.dtypes, spec.shapes),
                      [shared[uid] for uid in spec.uids], ctx)
        self._by_key[key] = group
        return group

    def map_wire(self, ctx: RankContext, group: Group, name: str) -> None:
        if not ctx.is_master:  # (the master made it)
            group.wire = Wire(name, ctx.arena.map(name), group.layout, ctx.size)

    def stage_broadcast(self, ctx: RankContext, group: Group, values: list | None) -> None:
        """The values into the master's slot, and its variables onto them."""
        slot = group.slots[ctx.master_rank]
        for i, (var, view) in enumerate(zip(group.variables, slot, strict=True)):
            value = host_value(ctx, var) if values is None else values[i]
            if value is not view:
                np.copyto(view, value)
            store_value(ctx, var, view)

    def pair_copies(self, ctx: RankContext, group: Group,
                    resident: bool) -> list[tuple[Any, Any]]:
        """The master's values into its slot (the worker reads them there); after the
        command, the worker's slot (the result) into the master's."""
        master = ctx.master_rank
        if not resident:
            for var, view in zip(group.variables, group.slots[master], strict=True):
                value = _pytensor.value(var)
                if value is not view:
                    view[...] = value  # faster than np.copyto when tiny
                    store_value(ctx, var, view)
        return list(zip(group.slots[master], group.slots[1 - master], strict=True))

    # -- primitives (inside a command, every rank) ----------------------------------------
    def _fold(self, ctx: RankContext, group: Group, op: ReduceOp,
              values: list[np.ndarray]) -> None:
        """Piece ``rank`` of every rank's values, combined into its own slot (its own
        value read where it lies)."""
        rank, n, flats = ctx.rank, ctx.size, group.flats
        own = flats[rank]
        for i, lo, hi in group.pieces[rank]:
            others = [flats[k][i][lo:hi] for k in range(n) if k != rank]
            combine_into(own[i][lo:hi], values[i][lo:hi], others, op)

    def _spread(self, ctx: RankContext, group: Group) -> None:
        """Barrier, then every other rank's piece from its owner's slot into this one."""
        ctx.meeting.barrier(ctx)
        rank, flats = ctx.rank, group.flats
        own = flats[rank]
        for k in range(ctx.size):
            if k != rank:
                for i, lo, hi in group.pieces[k]:
                    own[i][lo:hi] = flats[k][i][lo:hi]

    def all_reduce(self, ctx: RankContext, group: Group, op: ReduceOp) -> bool:
        values = loaded(ctx, group, whole=group.small)
        if values is None:
            return False
        if group.small:  # every slot is loaded (the vote was a barrier): combine them all
            rebind(ctx, group.variables, [combined(stack, op) for stack in group.columns])
            return True
        self._fold(ctx, group, op, values)
        self._spread(ctx, group)
        rebind(ctx, group.variables, group.slots[ctx.rank])
        return True

    def low_precision_all_reduce(self, ctx: RankContext, group: Group, op: ReduceOp,
                                 exchange: Exchange) -> bool:
        """Every rank's words in the wire; each rank folds its piece into its slot (a
        small group: all of it, no second barrier) and, large, copies the other pieces
        from their owners' slots (``_spread``)."""
        if not encode_and_vote(ctx, group, exchange):
            return False
        rank = ctx.rank
        if group.small:
            fold_pieces(ctx, group, exchange, op, whole(group.layout), group.flats[rank])
        else:
            fold_pieces(ctx, group, exchange, op, group.pieces[rank], group.flats[rank])
            self._spread(ctx, group)
        rebind(ctx, group.variables, group.slots[rank])
        return True

    def low_precision_reduce_scatter(self, ctx: RankContext, group: Group, op: ReduceOp,
                                     exchange: Exchange) -> bool:
        if not encode_and_vote(ctx, group, exchange):
            return False
        rank = ctx.rank
        fold_pieces(ctx, group, exchange, op, group.pieces[rank], group.flats[rank])
        rebind(ctx, group.variables, group.slots[rank])  # its own piece is the result
        return True

    def reduce_scatter(self, ctx: RankContext, group: Group, op: ReduceOp) -> bool:
        values = loaded(ctx, group, whole=False)
        if values is None:
            return False
        self._fold(ctx, group, op, values)
        rebind(ctx, group.variables, group.slots[ctx.rank])  # its own piece is the result
        return True

    def all_gather(self, ctx: RankContext, group: Group) -> None:
        give_own_piece(ctx, group)
        self._spread(ctx, group)
        rebind(ctx, group.variables, group.slots[ctx.rank])

    def all_gather_common(self, ctx: RankContext, group: Group) -> None:
        """Every rank's piece into the master's slot, which every rank's variables then
        view: each piece is written once (not at all where the variables already view
        it, a rank having updated its piece in place there) and read where it lies."""
        if not ctx.placement.views:  # (device values: each rank needs its own copy)
            self.all_gather(ctx, group)
            return
        give_own_piece(ctx, group, ctx.master_rank)
        ctx.meeting.barrier(ctx)
        rebind(ctx, group.variables, group.slots[ctx.master_rank])

    def reduce(self, ctx: RankContext, group: Group, op: ReduceOp, in_place: bool,
               scratch: Any) -> bool:
        values = loaded(ctx, group, whole=group.small)
        if values is None:
            return False
        rank, n, root = ctx.rank, ctx.size, ctx.master_rank
        flats = group.flats
        out = (flats[root] if scratch is None
               else [view.reshape(-1) for view in group.layout.views(scratch)])
        if group.small:  # the root alone: every slot is loaded
            if rank == root:
                results = [combined(stack, op) for stack in group.columns]
                if scratch is not None:
                    for target, result in zip(out, results, strict=True):
                        target[...] = result.reshape(-1)
                if in_place:
                    rebind(ctx, group.variables, results)
            return True
        for i, lo, hi in group.pieces[rank]:
            pieces = [values[i][lo:hi] if k == rank else flats[k][i][lo:hi] for k in range(n)]
            first = pieces.pop(root)
            combine_into(out[i][lo:hi], first, pieces, op)
        if in_place:
            self.pieces_written(ctx)
            if rank == root:  # every piece of its slot is the result
                rebind(ctx, group.variables, group.slots[root])
        return True

    def pieces_written(self, ctx: RankContext) -> None:
        """Every rank, before the root binds its slot after a large in-place
        ``reduce``: nothing to wait for here, since the root's variables view the slot
        and the command returns only once every rank has written its piece."""

    def broadcast(self, ctx: RankContext, group: Group) -> None:
        root = ctx.master_rank
        if ctx.rank == root:
            return  # its slot was filled and bound before the command
        for source, view in zip(group.slots[root], group.slots[ctx.rank], strict=True):
            np.copyto(view, source)
        rebind(ctx, group.variables, group.slots[ctx.rank])

    def spread_staged(self, ctx: RankContext, message: Any, buffer: Any) -> None:
        """Every rank maps the scratch: nothing to move on one machine."""

    def share_regions(self, ctx: RankContext, message: Any, buffer: Any,
                      dtypes: list) -> None:
        if message.everyone:  # every rank reads every region
            ctx.meeting.barrier(ctx)

    def collect_region(self, ctx: RankContext, message: Any, buffer: Any) -> None:
        """The master maps the same scratch: nothing to move on one machine."""

    def pair_reduce(self, ctx: RankContext, group: Group, op: ReduceOp) -> tuple | None:
        """The worker of two: combine its values with the master's (written into the
        master's slot before the command) into its own slot, where the master copies
        the result from. No barrier: the master changes nothing until the worker has
        finished. Replies the worker's shapes if they differ from the master's."""
        pairs = group.pairs
        if pairs is None:  # the divisor typed once: a Python 2 costs a microsecond a call
            pairs = group.pairs = [(var, first, out, np.array(2, out.dtype), _scratch_of(out))
                                   for var, first, out in zip(
                                       group.variables, group.slots[ctx.master_rank],
                                       group.slots[ctx.rank], strict=True)]
        for var, _, view, _, _ in pairs:
            value = _pytensor.value(var)
            if value is not view and value.shape != view.shape:
                return tuple(_pytensor.value(v).shape for v in group.variables)
        ufunc, mean = ufunc_of(op)
        for var, first, out, two, scratch in pairs:
            value = _pytensor.value(var)
            into = scratch if value is out else out  # (scratch is out beyond one element)
            ufunc(first, value, out=into)
            if mean:
                np.true_divide(into, two, out=out)
            elif into is not out:
                out[...] = into
            if value is not out:
                _pytensor.bind(var, out)
        return None
