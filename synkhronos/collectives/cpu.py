"""CPU collectives: exchange buffers in POSIX shared memory, reduced by all ranks at once.

This module owns the ``"cpu"`` backend, ``CpuBackend``: which segments exist, when the
master creates, hands out and unlinks them, and each rank's step of every
``COLLECTIVE`` command. What a segment holds (header lines, slots, pieces) and the
kernels that combine the ranks' values live in ``_groups``.

Two kinds of exchange buffer, each a segment named under ``session.prefix``:

- a **resident group** per list of variables used by ``broadcast``, ``reduce`` or
  ``all_reduce``: one segment, a header line per rank, then one slot per rank, each
  slot the list's ``FusedLayout``. Each process points its variables' storage at its
  own slot (no two processes share a slot), so the next collective on the same list
  copies nothing in and the result needs no copy out. Variables live in it, so a
  resident segment never changes layout: new shapes get a new segment, and the old
  memory goes once no variable views it any more.
- one **scratch** buffer per session for what differs per rank or leaves the ranks
  (``scatter``, ``gather``, ``all_gather``, ``set_value``, ``get_value``, ``reduce``
  returned as new arrays). Nothing views it after a command, so any call may lay it
  out anew; it only grows.

``all_reduce`` of a resident group, in rank ``r`` of ``n``:

1. copy in: the parts of each value that the other ranks reduce, into slot ``r``
   (nothing when the storage already is slot ``r``); post this rank's status (ok,
   shape mismatch, failed) in its header line;
2. barrier; every rank reads every status, so all leave unchanged together if any
   rank's shapes differ from the master's (the master then raises ``ValueError``);
3. reduce piece ``r`` (this rank's part read from its own storage, the others' from
   their slots) into slot ``r``; barrier; copy the other pieces from their owners'
   slots; point the variables at slot ``r``. No byte is copied twice.

Small lists (at most ``SMALL_BYTES``) need fewer steps. With two processes there is
no barrier at all: the master writes its values into its slot before the command, the
worker combines them with its own into its slot, and the master copies the result
once the command returns. With more, every rank copies in, passes one barrier, and
reduces all slots into new private arrays.

A segment is created by the master and mapped by every rank in the command that first
names it; the master unlinks the name right after that command (mappings stay valid),
so ``/dev/shm`` holds nothing of ours between calls. A replaced segment is dropped by
the workers with the next command (``Session.release_later``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from .._reducers import ReduceOp
from .._runtime import shmem
from .._scatter import Batch, select_rows
from ..distribute import registry
from ..session import Opcode, Session
from ._groups import (
    _FAILED,
    _LINE,
    _MISMATCH,
    _OK,
    SMALL_BYTES,
    _complement,  # noqa: F401  (the unit tests import it from here)
    _fold,
    _Group,
    _paged,
    _pair_reduce,
    _raise_mismatch,
    _refusal,
    _storage,
    _store,
)
from .backend import Backend, FusedLayout, Step, Targets, register_backend

__all__ = ["CpuBackend", "SMALL_BYTES", "MAX_GROUPS"]

MAX_GROUPS = 64  # resident groups kept; the least recently used one goes first
_COMMAND = Opcode.COLLECTIVE
(_SHAPES, _BROADCAST, _SCATTER, _GATHER, _ALL_GATHER, _REDUCE, _ALL_REDUCE,
 _SET_VALUE, _GET_VALUE) = (int(step) for step in Step)


@register_backend("cpu")
class CpuBackend(Backend):
    """Collectives through POSIX shared memory (one instance per process)."""

    def __init__(self) -> None:
        self._by_key: dict[int, _Group] = {}  # every process: resident groups by key
        self._owned: dict[str, Any] = {}  # master: segments it created, by name
        self._groups: OrderedDict[tuple[int, ...], _Group] = OrderedDict()  # master
        self._scratch: str | None = None  # master: name of the current scratch
        self._serial = 0  # names of created segments
        self._next_key = 0  # keys of resident groups
        self._evicted: list[int] = []
        self._steps = {
            _SHAPES: self._shapes,
            _BROADCAST: self._broadcast,
            _SCATTER: self._place,
            _SET_VALUE: self._place,
            _GATHER: self._gather,
            _ALL_GATHER: self._all_gather,
            _REDUCE: self._reduce,
            _ALL_REDUCE: self._all_reduce,
            _GET_VALUE: self._get_value,
        }

    # -- master: segments ----------------------------------------------------------------
    def _create(self, session: Session, kind: str, nbytes: int) -> str:
        self._serial += 1
        name = f"{session.prefix}coll_{kind}{self._serial}"
        self._owned[name] = shmem.create_segment(name, nbytes)
        return name

    def _drop(self, session: Session, name: str) -> None:
        self._owned.pop(name, None)
        shmem.unlink_segment(name)
        session.release_later(name)

    def _run(self, session: Session, payload: tuple, *new: str | None) -> list:
        """Run one command; unlink the segments it introduced once every rank mapped them."""
        introduced = [name for name in new if name is not None]
        if not introduced:
            return session.run(_COMMAND, payload)
        try:
            return session.run(_COMMAND, payload)
        except BaseException:
            for name in introduced:  # some rank may not have mapped it: start afresh
                self._forget(session, name)
            raise
        finally:
            for name in introduced:
                shmem.unlink_segment(name)

    def _forget(self, session: Session, name: str) -> None:
        if name == self._scratch:
            self._scratch = None
        for uids, group in list(self._groups.items()):
            if group.name == name:
                del self._groups[uids]
                self._by_key.pop(group.key, None)
                self._evicted.append(group.key)
        self._drop(session, name)

    def _current(self, session: Session,
                 targets: Targets) -> tuple[_Group, tuple | None, bool]:
        """The group of ``targets`` laid out for the master's shapes, its spec if it is
        new, and whether every master's value already lives in the master's slot."""
        group = self._groups.get(targets.uids)
        if group is not None:  # fast: the master's values still live in its slot
            for var, view in zip(targets.variables, group.slots[session.master_rank], strict=True):
                if var.container.storage[0] is not view:
                    break
            else:
                self._groups.move_to_end(targets.uids)
                return group, None, True
        shapes = tuple([var.container.storage[0].shape for var in targets.variables])
        return *self._resident(session, targets, shapes), False

    def _resident(self, session: Session, targets: Targets,
                  shapes: tuple) -> tuple[_Group, tuple | None]:
        """The group of ``targets`` laid out for ``shapes``, and its spec if it is new."""
        group = self._groups.get(targets.uids)
        if group is not None and group.layout.shapes == shapes:
            self._groups.move_to_end(targets.uids)
            return group, None
        if group is not None:
            del self._groups[targets.uids]
            self._retire(session, group)
        elif len(self._groups) >= MAX_GROUPS:
            self._retire(session, self._groups.popitem(last=False)[1])
        key = self._next_key
        self._next_key += 1
        layout = FusedLayout(targets.dtypes, shapes)
        name = self._create(session, "g", _Group.segment_bytes(layout, session.n))
        group = _Group(key, name, self._owned[name], layout, list(targets.variables), session.n)
        self._groups[targets.uids] = self._by_key[key] = group
        spec = (name, tuple(d.str for d in layout.dtypes), shapes, targets.uids,
                tuple(self._evicted))
        self._evicted = []
        return group, spec

    def _retire(self, session: Session, group: _Group) -> None:
        self._by_key.pop(group.key, None)
        self._evicted.append(group.key)
        self._drop(session, group.name)

    def _scratch_for(self, session: Session, nbytes: int) -> tuple[Any, str | None]:
        """The scratch buffer, grown to at least ``nbytes``; and its name if it is new."""
        current = self._owned.get(self._scratch) if self._scratch else None
        if current is not None and len(current) >= nbytes:
            return current, None
        if current is not None:
            self._drop(session, self._scratch)
        size = _paged(max(nbytes, 2 * len(current) if current is not None else 0))
        self._scratch = self._create(session, "s", size)
        return self._owned[self._scratch], self._scratch

    # -- master: the collectives ---------------------------------------------------------
    def shapes(self, session: Session, targets: Targets) -> list[list[tuple[int, ...]]]:
        return self._run(session, (_SHAPES, targets.uids))

    def broadcast(self, session: Session, targets: Targets, values: list | None) -> None:
        if values is None:
            values = [_storage(var) for var in targets.variables]
        group, spec = self._resident(session, targets, tuple(v.shape for v in values))
        for var, value, view in zip(targets.variables, values,
                                    group.slots[session.master_rank], strict=True):
            if value is not view:
                np.copyto(view, value)
            _store(var, view)
        self._run(session, (_BROADCAST, group.key, spec), spec and group.name)

    def all_reduce(self, session: Session, targets: Targets, op: ReduceOp) -> None:
        if session.n == 1:
            session.check_usable()
            return  # one process: every op leaves its values as they are
        group, spec, resident = self._current(session, targets)
        master = session.master_rank
        if group.pair and not resident:  # the worker will read the master's values
            for var, view in zip(targets.variables, group.slots[master], strict=True):
                if var.container.storage[0] is not view:
                    view[...] = var.container.storage[0]  # faster than np.copyto when tiny
                    _store(var, view)
        payload = (_ALL_REDUCE, group.key, spec, op._value_)  # _value_: .value is slow
        if spec is None:  # the same few small fields call after call
            replies = session.run(_COMMAND, payload, repeats=True)
        else:
            replies = self._run(session, payload, group.name)
        if replies.count(None) != len(replies):
            _raise_mismatch(targets, replies, group.layout.shapes)
        if group.pair:  # the worker left the result in its slot
            for view, result in zip(group.slots[master], group.slots[1 - master], strict=True):
                view[...] = result

    def reduce(self, session: Session, targets: Targets, op: ReduceOp,
               in_place: bool) -> list[np.ndarray] | None:
        group, spec, _ = self._current(session, targets)
        shapes = group.layout.shapes
        result, scratch = None, None
        if not in_place and not group.small:
            result, scratch = self._scratch_for(session, group.layout.total)
        payload = (_REDUCE, group.key, spec, op._value_,
                   self._scratch if result is not None else None)
        replies = self._run(session, payload, spec and group.name, scratch)
        _raise_mismatch(targets, replies, shapes)
        if group.small:  # the master reduces the slots the workers filled
            outs = group.reduced(op._value_) if session.n > 1 else [
                np.array(_storage(var)) for var in targets.variables]
        elif not in_place:
            outs = [np.array(view) for view in group.layout.views(result)]
        else:
            return None  # the ranks reduced into the master's slot, its storage
        if not in_place:
            return outs
        for var, out in zip(targets.variables, outs, strict=True):
            _store(var, out)
        return None

    def scatter(self, session: Session, targets: Targets, values: list,
                batches: tuple[Batch, ...]) -> None:
        self._place_all(session, targets, values, batches, None)

    def set_value(self, session: Session, rank: int, targets: Targets, values: list,
                  batch: Batch | None) -> None:
        if rank != session.master_rank:
            self._place_all(session, targets, values, (batch,) * len(values), rank)
            return
        session.check_usable()  # no command: the master alone changes
        for var, value in zip(targets.variables, values, strict=True):
            whole = value if isinstance(value, np.ndarray) else value.data
            _store(var, np.array(select_rows(whole, batch)))

    def _place_all(self, session: Session, targets: Targets, values: list,
                   batches: tuple, rank: int | None) -> None:
        """Stage ``values`` (arrays, or Data used in place) and let the ranks copy out
        the ``batches`` rows of each (one selection per value, None for all rows)."""
        staged = [i for i, v in enumerate(values) if isinstance(v, np.ndarray)]
        layout = FusedLayout([values[i].dtype for i in staged],
                             [values[i].shape for i in staged])
        buffer, new = self._scratch_for(session, layout.total)
        sources = [value if i in staged else value.ref() for i, value in enumerate(values)]
        for j, (i, view) in enumerate(zip(staged, layout.views(buffer), strict=True)):
            np.copyto(view, values[i])
            sources[i] = (layout.offsets[j], view.dtype.str, view.shape)
        step = _SCATTER if rank is None else _SET_VALUE
        payload = (step, self._scratch, targets.uids, tuple(sources), batches, rank)
        self._run(session, payload, new)

    def gather(self, session: Session, targets: Targets,
               shapes: list[list[tuple[int, ...]]]) -> list[list[np.ndarray]]:
        layouts, bases, buffer, new = self._regions(session, targets, shapes)
        self._run(session, (_GATHER, self._scratch, targets.uids, bases), new)
        master = session.master_rank
        per_rank = [
            [_storage(var) for var in targets.variables] if rank == master
            else layout.views(buffer, base)
            for rank, (layout, base) in enumerate(zip(layouts, bases, strict=True))
        ]
        return [[values[i] for values in per_rank] for i in range(len(targets.uids))]

    def all_gather(self, session: Session, targets: Targets,
                   shapes: list[list[tuple[int, ...]]]) -> None:
        _, bases, _, new = self._regions(session, targets, shapes)
        payload = (_ALL_GATHER, self._scratch, targets.uids, bases,
                   tuple(tuple(s) for s in shapes))
        self._run(session, payload, new)

    def get_value(self, session: Session, rank: int, targets: Targets) -> list[np.ndarray]:
        if rank == session.master_rank:
            session.check_usable()  # no command: the master alone reads
            return [np.array(_storage(var)) for var in targets.variables]
        layout = FusedLayout(targets.dtypes, self.shapes(session, targets)[rank])
        buffer, new = self._scratch_for(session, layout.total)
        self._run(session, (_GET_VALUE, self._scratch, targets.uids, rank), new)
        return [np.array(view) for view in layout.views(buffer)]

    def _regions(self, session: Session, targets: Targets, shapes: list) -> tuple:
        """One fused region per rank in the scratch buffer, for ``shapes[rank]``."""
        layouts = [FusedLayout(targets.dtypes, rank_shapes) for rank_shapes in shapes]
        bases, end = [], 0
        for layout in layouts:
            bases.append(end)
            end += _paged(layout.total)
        buffer, new = self._scratch_for(session, end)
        return layouts, tuple(bases), buffer, new

    # -- every process: this rank's part ------------------------------------------------
    def execute(self, session: Session, payload: tuple) -> Any:
        return self._steps[payload[0]](session, *payload[1:])

    def _mapping(self, session: Session, name: str) -> Any:
        owned = self._owned.get(name)
        return owned if owned is not None else session.segments.get(name)

    def _group(self, session: Session, key: int, spec: tuple | None) -> _Group:
        if spec is None or session.is_master:
            return self._by_key[key]
        name, dtypes, shapes, uids, evicted = spec
        for old in evicted:
            self._by_key.pop(old, None)
        shared = registry(session).shared
        group = _Group(key, name, self._mapping(session, name), FusedLayout(dtypes, shapes),
                       [shared[uid] for uid in uids], session.n)
        self._by_key[key] = group
        return group

    def _shapes(self, session: Session, uids: tuple[int, ...]) -> list[tuple[int, ...]]:
        shared = registry(session).shared
        return [_storage(shared[uid]).shape for uid in uids]

    def _broadcast(self, session: Session, key: int, spec: tuple | None) -> None:
        group = self._group(session, key, spec)
        if session.is_master:
            return  # its slot was filled and bound before the command
        root = group.slots[session.master_rank]
        for var, source, view in zip(group.variables, root, group.slots[session.rank], strict=True):
            np.copyto(view, source)
            _store(var, view)

    def _load(self, session: Session, group: _Group) -> tuple[BaseException | None, list]:
        """Copy this rank's values into its slot and post its status; never raises.

        Large groups copy all but the pieces this rank reduces itself, which it reads
        from its own storage. Returns the failure, if any, and per variable the flat
        array holding this rank's value (its storage or its slot).
        """
        rank, status, failure, values = session.rank, _OK, None, []
        foreign = None if group.small else group.foreign[rank]
        try:
            for i, (var, view) in enumerate(zip(group.variables, group.slots[rank], strict=True)):
                value = var.container.storage[0]
                if value is view:
                    values.append(group.flats[rank][i])
                    continue
                if value.shape != view.shape:
                    status = _MISMATCH
                    break
                if foreign is None:
                    view[...] = value
                    continue
                flat, slot = value.reshape(-1), group.flats[rank][i]
                values.append(flat)
                for lo, hi in foreign[i]:
                    slot[lo:hi] = flat[lo:hi]
        except Exception as exc:
            status, failure = _FAILED, exc
        group.header[rank * _LINE] = status
        return failure, values

    def _all_reduce(self, session: Session, key: int, spec: tuple | None, op: str) -> Any:
        group = self._by_key[key] if spec is None else self._group(session, key, spec)
        if group.pair:
            return None if session.is_master else _pair_reduce(session, group, op)
        failure, values = self._load(session, group)
        session.barrier()
        refusal = _refusal(group, failure)
        if refusal is not None:
            return refusal
        if group.small:
            for var, out in zip(group.variables, group.reduced(op), strict=True):
                _store(var, out)
            return None
        rank, n, flats = session.rank, session.n, group.flats
        own = flats[rank]
        for i, lo, hi in group.pieces[rank]:
            others = [flats[k][i][lo:hi] for k in range(n) if k != rank]
            _fold(own[i][lo:hi], values[i][lo:hi], others, op)
        session.barrier()
        for k in range(n):
            if k != rank:
                for i, lo, hi in group.pieces[k]:
                    own[i][lo:hi] = flats[k][i][lo:hi]
        for var, view in zip(group.variables, group.slots[rank], strict=True):
            _store(var, view)
        return None

    def _reduce(self, session: Session, key: int, spec: tuple | None, op: str,
                scratch: str | None) -> Any:
        group = self._group(session, key, spec)
        failure, values = self._load(session, group)
        if group.small:  # the master reduces after the command
            if failure is not None:
                raise failure
            mine = group.header[session.rank * _LINE]
            return tuple(_storage(v).shape for v in group.variables) if mine else None
        session.barrier()
        refusal = _refusal(group, failure)
        if refusal is not None:
            return refusal
        rank, n, master, flats = session.rank, session.n, session.master_rank, group.flats
        result = flats[master]
        if scratch is not None:
            result = [v.reshape(-1) for v in group.layout.views(self._mapping(session, scratch))]
        for i, lo, hi in group.pieces[rank]:
            pieces = [values[i][lo:hi] if k == rank else flats[k][i][lo:hi] for k in range(n)]
            first = pieces.pop(master)
            _fold(result[i][lo:hi], first, pieces, op)
        if scratch is None and rank == master:  # every piece of its slot is the result
            for var, view in zip(group.variables, group.slots[master], strict=True):
                _store(var, view)
        return None

    def _place(self, session: Session, scratch: str, uids: tuple, sources: tuple,
               batches: tuple, rank: int | None) -> None:
        """Scatter (``rank`` None: every rank takes its block) or set one rank's values."""
        buffer = self._mapping(session, scratch)  # every rank maps what a command names
        if rank is not None and rank != session.rank:
            return
        shared = registry(session).shared
        for uid, source, batch in zip(uids, sources, batches, strict=True):
            mine = batch if rank is not None else batch.part(session.n, session.rank)
            if hasattr(source, "view"):  # a synk.Data reference: read in place
                whole = source.view(session)
            else:  # (offset, dtype, shape) in the scratch buffer
                offset, dtype, shape = source
                count = int(np.prod(shape, dtype=np.int64))
                whole = np.frombuffer(buffer, dtype, count, offset).reshape(shape)
            _store(shared[uid], np.array(select_rows(whole, mine)))

    def _gather(self, session: Session, scratch: str, uids: tuple, bases: tuple) -> None:
        if not session.is_master:
            self._write_region(session, scratch, uids, bases[session.rank])

    def _write_region(self, session: Session, scratch: str, uids: tuple, base: int) -> None:
        shared = registry(session).shared
        values = [_storage(shared[uid]) for uid in uids]
        layout = FusedLayout([v.dtype for v in values], [v.shape for v in values])
        views = layout.views(self._mapping(session, scratch), base)
        for view, value in zip(views, values, strict=True):
            np.copyto(view, value)

    def _all_gather(self, session: Session, scratch: str, uids: tuple, bases: tuple,
                    shapes: tuple) -> None:
        self._write_region(session, scratch, uids, bases[session.rank])
        session.barrier()
        shared = registry(session).shared
        variables = [shared[uid] for uid in uids]
        buffer = self._mapping(session, scratch)
        dtypes = [var.type.dtype for var in variables]
        regions = [FusedLayout(dtypes, s).views(buffer, base)
                   for s, base in zip(shapes, bases, strict=True)]
        for i, var in enumerate(variables):
            _store(var, np.concatenate([region[i] for region in regions]))

    def _get_value(self, session: Session, scratch: str, uids: tuple, rank: int) -> None:
        self._mapping(session, scratch)  # every rank maps what a command names
        if session.rank == rank:
            self._write_region(session, scratch, uids, 0)
