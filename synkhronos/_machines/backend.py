"""The several-machines backend: within each machine through shared memory, between
machines through the leaders' MPI.

``MachinesBackend`` is the ``"cpu"`` backend of a session that spans machines (the
context's meeting is ``AcrossMachines``, chosen as the process joined them), chosen
by the backends' factory (``backend.BACKEND``) from the context, once per process; it
wraps the one-machine backend (``cpu.CpuBackend``), which keeps every buffer, laid out
by ``MachineGroup``. Its primitives load and vote as one machine's do
(``cpu.loaded``: every process of every machine votes that its shapes match, at the
context's meeting), run the folds below, and bind the results (``cpu.rebind``).
Every move between machines is made by the machines' leaders only (``leaders_of``),
after ``Machines.exchange`` (so no leader starts a transfer that another, having
failed, will never join); the other processes wait for it at a barrier of their own
machine (``RankContext.local_barrier``).

Two modes (``fork(reduction=...)``):

- **fast**: each machine folds its processes' values into its leader's slot (each
  process folds its own piece of the elements, in parallel, as on one machine), the
  leaders all-reduce that slot (``Leaders.all_reduce``: the MPI library's order), and
  the machine's processes copy the result from the leader's slot.
- **exact**: a group holds a slot for every process of the session on every machine;
  the leaders broadcast their machine's slots to every other machine, and then each
  machine runs the one-machine folds on the processes' values -- the same operations
  in the same order, so the results are bit-identical to one machine with the same
  number of processes. Small lists take ``Leaders.all_reduce_pieces`` (a rank-order
  fold of every process's value, as one machine folds small lists).

A low-precision exchange (``exchange="bf16"``/``"fp16"``, ``rounded.py``) is the same in
both modes: each process rounds its values into its slot of the group's wire (one slot
per process of the session, on every machine), the leaders broadcast their machine's
wire slots to every machine (16 bits a value between machines), and each machine folds
every process's words in rank order as one machine does: bit-identical to one machine.
``all_reduce`` folds into the leader's slot (each process a share of the elements) and
the others copy it; ``reduce_scatter`` has each process fold its own piece.

Copies (broadcast, all-gather of pieces, the regions of gather and all-gather, the
staged values of scatter and set_value) are the same in both modes: each machine's
part goes from its leader to the others.

Between machines, slots travel as spans: when every variable of a list has one dtype,
a slot (or a run of pieces) is one array including the zero padding between variables
(never written, so it stays zero through sums, products, maxima and minima), so a list
of any length is one MPI call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core.context import RankContext
from .._dataref import DataRef
from .._reducers import ReduceOp, combine_into, combined
from .._runtime.lowprec import Exchange
from .._scatter import Batch, block, select_rows
from ..collectives.backend import (
    Backend,
    FusedLayout,
    GroupSpec,
    Targets,
    column,
    register_backend,
)
from ..collectives.cpu import CpuBackend, foreign_ranges, give_own_piece, loaded, rebind
from ..collectives.cpu import Group as LocalGroup
from ..collectives.rounded import encode_and_vote, fold_pieces
from .transport import AcrossMachines, leaders_of

__all__ = ["MachinesBackend", "MachineGroup"]


class MachineGroup(LocalGroup):
    """A group's segment on one machine of several (every machine has its replica).

    In ``fast`` mode one slot per process of a machine (the largest machine's count),
    each process's at its local rank; in ``exact`` mode one slot per process of the
    whole session, each at its global rank, so that every machine can hold every
    process's values. Views are indexed by global rank either way (``None`` where a
    rank has no slot here); ``local_pieces`` splits the work of this machine's
    processes.
    """

    def _lay_out(self, ctx: RankContext, stride: int) -> None:
        n, layout = ctx.size, self.layout
        first = ctx.offsets[ctx.node]
        local = range(first, first + ctx.local_size)
        self.base = 0 if ctx.exact else first  # slot index = rank - base
        present = range(n) if ctx.exact else local
        self.slots = [None] * n
        for rank in present:
            self.slots[rank] = layout.views(self.buffer, (rank - self.base) * stride)
        self.flats = [None if slot is None else [view.reshape(-1) for view in slot]
                      for slot in self.slots]
        self.columns = [column(views) for views in zip(*(self.slots[r] for r in local),
                                                      strict=True)]
        self.local_pieces = layout.pieces(ctx.local_size)  # this machine's own split
        self.foreign = [None] * n
        for rank, ranges in zip(local, foreign_ranges(layout, self.local_pieces), strict=True):
            self.foreign[rank] = ranges

    @classmethod
    def slot_count(cls, ctx: RankContext) -> int:
        return ctx.size if ctx.exact else max(ctx.local_sizes)


def _sum_for(op: ReduceOp) -> ReduceOp:
    """``avg`` is summed between machines and divided once at the end."""
    return ReduceOp.SUM if op is ReduceOp.AVG else op


def _machine(ctx: RankContext, node: int) -> range:
    first = ctx.offsets[node]
    return range(first, first + ctx.local_sizes[node])


def _runs(layout: FusedLayout, triples: list[tuple[int, int, int]]
          ) -> list[tuple[np.dtype, int, int]]:
    """``(dtype, byte offset, count)`` of the arrays covering ``triples`` (variable,
    first, stop) of ``layout``: one when every variable has one dtype."""
    if not triples:
        return []
    dtypes = layout.dtypes
    if all(dtype == dtypes[0] for dtype in dtypes):
        item = dtypes[0].itemsize
        start = layout.offsets[triples[0][0]] // item + triples[0][1]
        stop = layout.offsets[triples[-1][0]] // item + triples[-1][2]
        return [(dtypes[0], start * item, stop - start)]
    return [(dtypes[i], layout.offsets[i] + lo * dtypes[i].itemsize, hi - lo)
            for i, lo, hi in triples]


def _spans(buffer: Any, layout: FusedLayout, base: int,
           triples: list[tuple[int, int, int]]) -> list[np.ndarray]:
    """Flat arrays over ``triples`` of the layout at byte ``base`` of ``buffer``."""
    return [np.frombuffer(buffer, dtype, count, base + offset)
            for dtype, offset, count in _runs(layout, triples)]


def _zero_gaps(buffer: Any, layout: FusedLayout) -> None:
    """Zero the padding between the variables of ``layout`` at the start of ``buffer``
    (a scratch reused by other layouts: a span over it must not reduce old bytes)."""
    ends = [offset + nbytes for offset, nbytes in zip(layout.offsets, layout.nbytes,
                                                       strict=True)]
    for end, start in zip(ends[:-1], layout.offsets[1:], strict=True):
        if start > end:
            np.frombuffer(buffer, np.uint8, start - end, end)[:] = 0


def _whole(layout: FusedLayout) -> list[tuple[int, int, int]]:
    return [(i, 0, size) for i, size in enumerate(layout.sizes) if size]


def _slot_base(group: MachineGroup, rank: int) -> int:
    return (rank - group.base) * MachineGroup.stride(group.layout)


def _slot_spans(group: MachineGroup, rank: int,
                triples: list[tuple[int, int, int]] | None = None) -> list[np.ndarray]:
    return _spans(group.buffer, group.layout, _slot_base(group, rank),
                  _whole(group.layout) if triples is None else triples)


def _pieces_of(group: MachineGroup, ranks: range) -> list[tuple[int, int, int]]:
    return [triple for rank in ranks for triple in group.pieces[rank]]


def _copy_slot(group: MachineGroup, source: int, target: int, skip: int | None = None) -> None:
    """Rank ``source``'s slot into rank ``target``'s (every piece but ``skip``'s)."""
    if skip is None:
        for dst, src in zip(group.slots[target], group.slots[source], strict=True):
            np.copyto(dst, src)
        return
    into, out = group.flats[target], group.flats[source]
    for rank, triples in enumerate(group.pieces):
        if rank != skip:
            for i, lo, hi in triples:
                into[i][lo:hi] = out[i][lo:hi]


def _exchange_slots(ctx: RankContext, group: MachineGroup) -> None:
    """Exact mode: every machine's slots to every machine (each slot holds its
    process's whole value)."""
    ctx.local_barrier()
    leaders = leaders_of(ctx)
    if leaders is not None:
        leaders.exchange()
        stride = MachineGroup.stride(group.layout)
        for node in range(ctx.n_nodes):
            ranks = _machine(ctx, node)
            region = np.frombuffer(group.buffer, np.uint8, len(ranks) * stride,
                                   _slot_base(group, ranks.start))
            leaders.broadcast(region, root=node)
    ctx.local_barrier()


def _local_stack(group: MachineGroup, ctx: RankContext) -> list[np.ndarray]:
    """Exact mode, on a leader: this machine's slots as ``(processes, n)`` views, one per
    run of the layout (no copy)."""
    stride = MachineGroup.stride(group.layout)
    base = _slot_base(group, ctx.offsets[ctx.node])
    return [np.ndarray((ctx.local_size, count), dtype, group.buffer, base + offset,
                       (stride, dtype.itemsize))
            for dtype, offset, count in _runs(group.layout, _whole(group.layout))]


def _fold_small_exact(ctx: RankContext, group: MachineGroup, op: ReduceOp) -> None:
    """Exact mode, a small list: every process's value folded in rank order into the
    leader's slot (``Leaders.all_reduce_pieces``), as one machine's ``combined``."""
    leaders = leaders_of(ctx)
    if leaders is None:
        return
    leaders.exchange()
    summed = _sum_for(op)
    for stack, target in zip(_local_stack(group, ctx),
                             _slot_spans(group, ctx.leader_rank), strict=True):
        out = np.empty(stack.shape[1:], stack.dtype)
        leaders.all_reduce_pieces(stack, summed.value, out=out,
                                      counts=ctx.local_sizes)
        if op is ReduceOp.AVG:
            np.true_divide(out, ctx.size, out=out)
        np.copyto(target, out)


# -- all-reduce, reduce-scatter ------------------------------------------------------------
def _fast_into_leader(ctx: RankContext, group: MachineGroup, op: ReduceOp, values: list,
                      fold: bool) -> None:
    """Fast mode: this machine's combined values in the leader's slot, then combined
    over every machine there (``fold``: each process folds its own piece of the
    elements; else the leader combines whole slots, for small lists)."""
    lead, summed = ctx.leader_rank, _sum_for(op)
    leaders = leaders_of(ctx)
    if fold:
        target, flats, rank = group.flats[lead], group.flats, ctx.rank
        local = _machine(ctx, ctx.node)
        for i, lo, hi in group.local_pieces[ctx.local_rank]:
            first = values[i][lo:hi] if rank == lead else target[i][lo:hi]
            others = [values[i][lo:hi] if k == rank else flats[k][i][lo:hi]
                      for k in local if k != lead]
            combine_into(target[i][lo:hi], first, others, summed)
        ctx.local_barrier()
    elif leaders is not None:
        results = [combined(stack, summed) for stack in group.columns]
        for view, result in zip(group.slots[lead], results, strict=True):
            np.copyto(view, result)
    if leaders is not None:
        leaders.exchange()
        for span in _slot_spans(group, lead):
            leaders.all_reduce(span, summed.value, mode="fast")
            if op is ReduceOp.AVG:
                np.true_divide(span, ctx.size, out=span)


def all_reduce(ctx: RankContext, group: MachineGroup, op: ReduceOp,
               values: list[np.ndarray]) -> list[np.ndarray]:
    """Every process's values combined, in every process: this rank's result arrays.

    ``values``: loaded whole for small lists and in exact mode, else the parts the
    machine's other processes fold (``Group.foreign``)."""
    rank, lead = ctx.rank, ctx.leader_rank
    if ctx.exact:
        if group.small:
            _fold_small_exact(ctx, group, op)
        else:
            _exchange_slots(ctx, group)
            n, flats = ctx.size, group.flats
            for piece in range(ctx.local_rank, n, ctx.local_size):
                for i, lo, hi in group.pieces[piece]:
                    out = flats[piece][i][lo:hi]
                    combine_into(out, out, [flats[k][i][lo:hi] for k in range(n) if k != piece],
                                 op)
            ctx.local_barrier()
            own = flats[rank]
            for k in range(n):
                if k != rank:
                    for i, lo, hi in group.pieces[k]:
                        own[i][lo:hi] = flats[k][i][lo:hi]
            return group.slots[rank]
    else:
        _fast_into_leader(ctx, group, op, values, fold=not group.small)
    ctx.local_barrier()
    if rank != lead:
        _copy_slot(group, lead, rank)
    return group.slots[rank]


def reduce_scatter(ctx: RankContext, group: MachineGroup, op: ReduceOp,
                   values: list[np.ndarray]) -> None:
    """This process's piece (``Group.pieces``) of the combined values, into its slot.

    Exact mode computes only the pieces of this machine's processes, each by its own
    process as on one machine; fast mode combines every piece (the rest of the slot is
    left holding the whole result)."""
    if not ctx.exact:
        _fast_into_leader(ctx, group, op, values, fold=True)
        ctx.local_barrier()
        if ctx.rank != ctx.leader_rank:
            _copy_slot(group, ctx.leader_rank, ctx.rank)
        return
    _exchange_slots(ctx, group)
    rank, n, flats = ctx.rank, ctx.size, group.flats
    for i, lo, hi in group.pieces[rank]:
        out = flats[rank][i][lo:hi]
        combine_into(out, out, [flats[k][i][lo:hi] for k in range(n) if k != rank], op)


def all_gather(ctx: RankContext, group: MachineGroup) -> None:
    """Every process's piece (in its own slot) into every process's slot."""
    lead, rank = ctx.leader_rank, ctx.rank
    ctx.local_barrier()
    leaders = leaders_of(ctx)
    if leaders is not None:
        target, flats = group.flats[lead], group.flats
        for k in _machine(ctx, ctx.node):
            if k != lead:
                for i, lo, hi in group.pieces[k]:
                    target[i][lo:hi] = flats[k][i][lo:hi]
        leaders.exchange()
        for node in range(ctx.n_nodes):
            for span in _slot_spans(group, lead, _pieces_of(group, _machine(ctx, node))):
                leaders.broadcast(span, root=node)
    ctx.local_barrier()
    if rank != lead:
        _copy_slot(group, lead, rank, skip=rank)


def broadcast(ctx: RankContext, group: MachineGroup) -> list[np.ndarray]:
    """The master's slot (filled before the command) into every process's slot."""
    lead, rank = ctx.leader_rank, ctx.rank
    leaders = leaders_of(ctx)
    if leaders is not None:
        leaders.exchange()
        for span in _slot_spans(group, lead):
            leaders.broadcast(span, root=0)
    ctx.local_barrier()
    if rank != lead:
        _copy_slot(group, lead, rank)
    return group.slots[rank]


def reduce(ctx: RankContext, group: MachineGroup, op: ReduceOp, values: list[np.ndarray],
           scratch: Any) -> None:
    """Every process's values combined into the scratch (the layout at its start), on
    the master's machine (exact mode in the one-machine order: the master's value
    first, then the others by rank)."""
    out = [view.reshape(-1) for view in group.layout.views(scratch)]
    leaders = leaders_of(ctx)
    if ctx.exact:
        if group.small:
            if leaders is not None:
                leaders.exchange()
                summed = _sum_for(op)
                targets = _spans(scratch, group.layout, 0, _whole(group.layout))
                for stack, target in zip(_local_stack(group, ctx), targets, strict=True):
                    leaders.all_reduce_pieces(stack, summed.value, out=target,
                                                  counts=ctx.local_sizes)
                    if op is ReduceOp.AVG:
                        np.true_divide(target, ctx.size, out=target)
            return
        _exchange_slots(ctx, group)
        if ctx.node != 0:
            return
        n, root, flats = ctx.size, ctx.master_rank, group.flats
        for piece in range(ctx.local_rank, n, ctx.local_size):
            for i, lo, hi in group.pieces[piece]:
                pieces = [flats[k][i][lo:hi] for k in range(n)]
                first = pieces.pop(root)
                combine_into(out[i][lo:hi], first, pieces, op)
        ctx.local_barrier()
        return
    summed, rank = _sum_for(op), ctx.rank
    local = _machine(ctx, ctx.node)
    for i, lo, hi in group.local_pieces[ctx.local_rank]:
        pieces = [values[i][lo:hi] if k == rank else group.flats[k][i][lo:hi] for k in local]
        combine_into(out[i][lo:hi], pieces[0], pieces[1:], summed)
    ctx.local_barrier()
    if leaders is not None:
        _zero_gaps(scratch, group.layout)
        leaders.exchange()
        for span in _spans(scratch, group.layout, 0, _whole(group.layout)):
            leaders.all_reduce(span, summed.value, mode="fast")
            if op is ReduceOp.AVG:
                np.true_divide(span, ctx.size, out=span)


# -- the low-precision exchange -----------------------------------------------------------
def _exchange_wires(ctx: RankContext, group: MachineGroup) -> None:
    """Every machine's wire slots (its processes' 16-bit words) to every machine."""
    ctx.local_barrier()
    leaders = leaders_of(ctx)
    if leaders is not None:
        leaders.exchange()
        wire = group.wire
        assert wire is not None  # (made by the command that first used it)
        for node in range(ctx.n_nodes):
            ranks = _machine(ctx, node)
            region = np.frombuffer(wire.buffer, np.uint8, len(ranks) * wire.stride,
                                   ranks.start * wire.stride)
            leaders.broadcast(region, root=node)
    ctx.local_barrier()


def low_precision_all_reduce(ctx: RankContext, group: MachineGroup, op: ReduceOp,
                             exchange: Exchange) -> list[np.ndarray]:
    """After every process's words are in its wire slot: this rank's result arrays.

    Every machine gets every process's words, and its processes fold a share of the
    elements each (``local_pieces``) into the leader's slot, the rank-order fold of one
    machine: results bit-identical to one machine's, in either mode."""
    _exchange_wires(ctx, group)
    lead = ctx.leader_rank
    fold_pieces(ctx, group, exchange, op, group.local_pieces[ctx.local_rank],
                group.flats[lead])
    ctx.local_barrier()
    if ctx.rank != lead:
        _copy_slot(group, lead, ctx.rank)
    return group.slots[ctx.rank]


def low_precision_reduce_scatter(ctx: RankContext, group: MachineGroup, op: ReduceOp,
                                 exchange: Exchange) -> None:
    """After every process's words are in its wire slot: this process's piece of the
    result (``Group.pieces``), folded by itself into its own slot."""
    _exchange_wires(ctx, group)
    fold_pieces(ctx, group, exchange, op, group.pieces[ctx.rank], group.flats[ctx.rank])


# -- regions: scatter, set_value, gather, all_gather, get_value ---------------------------
def _machine_rows(batch: Batch, ctx: RankContext, node: int) -> Batch:
    """The rows of ``batch`` that machine ``node``'s processes take (a contiguous run of
    its parts)."""
    ranks = _machine(ctx, node)
    lo = block(batch.length, ctx.size, ranks.start)[0]
    hi = block(batch.length, ctx.size, ranks.stop - 1)[1]
    if batch.indices is None:
        return Batch(batch.start + lo, batch.start + hi)
    return Batch(indices=batch.indices[lo:hi])


def _staged(buffer: Any, source: tuple) -> np.ndarray:
    offset, dtype, shape = source
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(buffer, dtype, count, offset).reshape(shape)


def _rows_into(whole: np.ndarray, rows: Batch, data: np.ndarray) -> None:
    part = data.view(whole.dtype).reshape((rows.length,) + whole.shape[1:])
    if rows.indices is None:
        whole[rows.start:rows.stop] = part
    else:
        whole[rows.indices] = part


def place(ctx: RankContext, message: Any, buffer: Any) -> None:
    """``scatter``/``set_value``: the staged values (in the master's scratch) to the
    machines that take them -- for ``scatter`` each machine gets only the rows its
    processes take, for ``set_value`` only the machine of that rank gets them."""
    staged = [(source, batch) for source, batch in zip(message.sources, message.batches,
                                                         strict=True)
              if not isinstance(source, DataRef)]
    if not staged:
        return
    leaders = leaders_of(ctx)
    if leaders is not None:
        leaders.exchange()
        wholes = [_staged(buffer, source) for source, _ in staged]
        if message.rank is not None:
            used = max(source[0] + whole.nbytes
                       for (source, _), whole in zip(staged, wholes, strict=True))
            target = ctx.machine_of(message.rank)
            if target != 0:
                arrays = None
                if ctx.node == 0:
                    empty = np.empty(0, np.uint8)
                    arrays = [np.frombuffer(buffer, np.uint8, used) if node == target
                              else empty for node in range(ctx.n_nodes)]
                received = leaders.scatter(arrays, root=0)
                if ctx.node == target:
                    np.copyto(np.frombuffer(buffer, np.uint8, used), received)
        else:
            arrays = None
            if ctx.node == 0:
                arrays = []
                for node in range(ctx.n_nodes):
                    chunks = [np.ascontiguousarray(select_rows(whole, _machine_rows(
                        batch, ctx, node))).reshape(-1).view(np.uint8)
                        for (_, batch), whole in zip(staged, wholes, strict=True)]
                    arrays.append(np.concatenate(chunks) if chunks else np.empty(0, np.uint8))
            received = leaders.scatter(arrays, root=0)
            if ctx.node != 0:
                at = 0
                for (_, batch), whole in zip(staged, wholes, strict=True):
                    rows = _machine_rows(batch, ctx, ctx.node)
                    nbytes = rows.length * (whole.nbytes // max(len(whole), 1))
                    _rows_into(whole, rows, received[at:at + nbytes])
                    at += nbytes
    ctx.local_barrier()


def _region_ends(message: Any, dtypes: list) -> list[int]:
    return [base + FusedLayout(dtypes, shapes).total
            for base, shapes in zip(message.bases, message.shapes, strict=True)]


def regions(ctx: RankContext, message: Any, buffer: Any, dtypes: list) -> None:
    """``gather`` (to the master) and ``all_gather`` (``everyone``): each machine's
    regions of the scratch (its processes wrote theirs) to the master, or to every
    machine."""
    ctx.local_barrier()
    leaders = leaders_of(ctx)
    if leaders is not None:
        ends = _region_ends(message, dtypes)

        def span(node: int) -> np.ndarray:
            ranks = _machine(ctx, node)
            start = message.bases[ranks.start]
            return np.frombuffer(buffer, np.uint8, ends[ranks.stop - 1] - start, start)

        leaders.exchange()
        if message.everyone:
            for node in range(ctx.n_nodes):
                leaders.broadcast(span(node), root=node)
        else:
            parts = leaders.gather(span(ctx.node), root=0)
            if parts is not None:
                for node in range(1, ctx.n_nodes):
                    np.copyto(span(node), parts[node])
    if message.everyone:
        ctx.local_barrier()


def get_value(ctx: RankContext, message: Any, buffer: Any) -> None:
    """``get_value`` of a rank on another machine: its region to the master."""
    target = ctx.machine_of(message.rank)
    if target == 0:
        return
    ctx.local_barrier()
    leaders = leaders_of(ctx)
    if leaders is not None:
        leaders.exchange()
        mine = (np.frombuffer(buffer, np.uint8, message.nbytes) if ctx.node == target
                else np.empty(0, np.uint8))
        parts = leaders.gather(mine, root=0)
        if parts is not None:
            np.copyto(np.frombuffer(buffer, np.uint8, message.nbytes), parts[target])


# -- the backend ---------------------------------------------------------------------------
def _spans_machines(ctx: RankContext) -> bool:
    return isinstance(ctx.meeting, AcrossMachines)  # chosen as the process joined


@register_backend("cpu", when=_spans_machines)
class MachinesBackend(Backend[MachineGroup]):
    """Collectives of a session over several machines: the one-machine backend's
    buffers (laid out by ``MachineGroup``), these primitives."""

    def __init__(self) -> None:
        self.local = CpuBackend(group_type=MachineGroup)

    # -- buffers: the local backend's ------------------------------------------------------
    def resident(self, ctx: RankContext, targets: Targets,
                 shapes: tuple[tuple[int, ...], ...]) -> tuple[MachineGroup, GroupSpec | None]:
        group, spec = self.local.resident(ctx, targets, shapes)
        return group, spec  # type: ignore[return-value]  # laid out by MachineGroup

    def current(self, ctx: RankContext, targets: Targets) -> MachineGroup | None:
        return self.local.current(ctx, targets)  # type: ignore[return-value]

    def regions(self, ctx: RankContext, nbytes: int) -> tuple[Any, str | None]:
        return self.local.regions(ctx, nbytes)

    @property
    def scratch_name(self) -> str:
        return self.local.scratch_name

    def settle(self, ctx: RankContext, new: Sequence[str]) -> None:
        self.local.settle(ctx, new)

    def discard(self, ctx: RankContext, new: Sequence[str]) -> None:
        self.local.discard(ctx, new)

    def stage_broadcast(self, ctx: RankContext, group: MachineGroup, values: list | None) -> None:
        self.local.stage_broadcast(ctx, group, values)

    reduce_through_scratch = True  # the result crosses machines into the scratch

    def group(self, ctx: RankContext, key: int, spec: GroupSpec | None) -> MachineGroup:
        return self.local.group(ctx, key, spec)  # type: ignore[return-value]

    def scratch(self, ctx: RankContext, name: str) -> Any:
        return self.local.scratch(ctx, name)

    # -- primitives -------------------------------------------------------------------------
    def all_reduce(self, ctx: RankContext, group: MachineGroup, op: ReduceOp) -> bool:
        values = loaded(ctx, group, whole=group.small or ctx.exact)
        if values is None:
            return False
        rebind(ctx, group.variables, all_reduce(ctx, group, op, values))
        return True

    def reduce(self, ctx: RankContext, group: MachineGroup, op: ReduceOp, in_place: bool,
               scratch: Any) -> bool:
        values = loaded(ctx, group, whole=group.small or ctx.exact)
        if values is None:
            return False
        reduce(ctx, group, op, values, scratch)
        if in_place and ctx.is_master:
            master = group.slots[ctx.rank]
            for view, result in zip(master, group.layout.views(scratch), strict=True):
                np.copyto(view, result)
            rebind(ctx, group.variables, master)
        return True

    def wire(self, ctx: RankContext, group: MachineGroup) -> str | None:
        return self.local.wire(ctx, group)

    def map_wire(self, ctx: RankContext, group: MachineGroup, name: str) -> None:
        self.local.map_wire(ctx, group, name)

    def low_precision_all_reduce(self, ctx: RankContext, group: MachineGroup, op: ReduceOp,
                                 exchange: Exchange) -> bool:
        if not encode_and_vote(ctx, group, exchange):
            return False
        rebind(ctx, group.variables, low_precision_all_reduce(ctx, group, op, exchange))
        return True

    def low_precision_reduce_scatter(self, ctx: RankContext, group: MachineGroup,
                                     op: ReduceOp, exchange: Exchange) -> bool:
        if not encode_and_vote(ctx, group, exchange):
            return False
        low_precision_reduce_scatter(ctx, group, op, exchange)
        rebind(ctx, group.variables, group.slots[ctx.rank])  # its own piece is the result
        return True

    def reduce_scatter(self, ctx: RankContext, group: MachineGroup, op: ReduceOp) -> bool:
        values = loaded(ctx, group, whole=ctx.exact)
        if values is None:
            return False
        reduce_scatter(ctx, group, op, values)
        rebind(ctx, group.variables, group.slots[ctx.rank])  # its own piece is the result
        return True

    def all_gather(self, ctx: RankContext, group: MachineGroup) -> None:
        give_own_piece(ctx, group)
        all_gather(ctx, group)
        rebind(ctx, group.variables, group.slots[ctx.rank])

    def broadcast(self, ctx: RankContext, group: MachineGroup) -> None:
        rebind(ctx, group.variables, broadcast(ctx, group))

    def spread_staged(self, ctx: RankContext, message: Any, buffer: Any) -> None:
        place(ctx, message, buffer)

    def share_regions(self, ctx: RankContext, message: Any, buffer: Any,
                      dtypes: list) -> None:
        regions(ctx, message, buffer, dtypes)

    def collect_region(self, ctx: RankContext, message: Any, buffer: Any) -> None:
        get_value(ctx, message, buffer)
