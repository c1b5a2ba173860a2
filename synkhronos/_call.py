"""Prepared calls: what one variant of a function sends, stages and gets back.

PyTensor splits building a function (``maker``) from running it (``executor``); so
does synkhronos. ``function.py`` builds the compiled variants; each variant (the
function itself, an ``output_subset``, the sliced form) gets one ``PreparedCall`` here,
which owns everything that running it needs in the master:

- its ``Prepared`` record (compiled function id, ops, sliceable and update variables):
  the static part, sent with the variant's first call and kept by every rank by id,
  so later calls send only the id and what varies (``Call``);
- its ``Staging``: shared-memory buffers for numpy inputs and ``batch`` indices,
  reused call after call (grown only when too small); over several machines each
  buffer has a replica per machine, and a scattered input selected by a range of rows
  sends each machine only the rows its processes take (``replica_rows``), the other
  inputs whole;
- its repeats: the ``Call`` of a plain call whose inputs look like an earlier one's
  (the same ``Data``, or arrays of the same dtype and shape), reused with the arrays
  copied where that call's went, so a training loop validates once;
- the reduction of the ranks' replies into what PyTensor would return.

A ``Call`` is built without being run (``message``), so a training step can run
several in one command (a ``Sequence``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ._core.protocol import Message
from ._dataref import DataRef
from ._reducers import ReduceOp, reduce_one, reduce_pairs, reduce_values
from ._scatter import block
from ._validate import Checked
from .data import Data, data

__all__ = ["Call", "Prepared", "PreparedCall", "Staging", "combine", "repeat_key"]


@dataclass(frozen=True)
class Prepared:
    """The static part of a variant's calls, registered once on every rank."""

    fn_id: int
    sliceable: tuple[int, ...]  # uids of the sliceable shared variables
    output_ops: tuple[ReduceOp, ...]
    update_uids: tuple[int, ...]  # sliced variant: the shared variable of each update
    update_ops: tuple[ReduceOp, ...]


@dataclass(frozen=True)
class Call(Message):
    """One call of a prepared variant: its id and what varies from call to call."""

    replies_reduced_at_once = True  # every caller combines the outputs (new arrays) at once

    prepared_id: int
    scattered: tuple[DataRef, ...]
    bcast: tuple[DataRef, ...]
    casts: tuple[str | None, ...]  # dtype to cast each scattered+bcast input to, or None
    batch_range: tuple[int, int]  # selected rows of the scattered inputs, if no indices
    batch_indices: DataRef | None  # int64 row indices, or None
    minibatch: tuple[bool, ...] | None  # per scattered input: a minibatch buffer
    batch_s: tuple | None  # per rank: its raw selection (checked by that rank)
    num_slices: int
    run_if_empty: bool  # every process has zero rows: the master runs anyway
    views_only: bool  # plain views of this session's segments: row ranges, no casts,
    # no sliceable shared variables
    profile: bool = False  # reply with (gather, function) seconds too
    prepared: Prepared | None = None  # sent with a variant's first call
    shared_rows: tuple | None = None  # givens' slice pattern: per rank, (start, stop)
    # of each sliceable shared variable's rows (instead of batch_s)
    offsets: tuple[int, ...] | None = None  # rows split by ``shares``: each rank's
    # first selected row, then the end (``_scatter.offsets``); None: the even split


Split = Callable[[int, int, tuple[int, ...] | None], list[tuple[int, int]]]


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


@dataclass
class Staging:
    """Shared-memory buffers a prepared call reuses for numpy inputs and batch indices.

    One command may hold several calls of the same variant (``synkhronos.steps``):
    each gets its own buffers (``epoch`` tells which command is being prepared), so no
    call overwrites the arrays of another still waiting to run.

    ``split``: over several machines, the rows each machine takes (``replica_rows``).
    """

    buffers: dict = field(default_factory=dict)  # (slot, use in the command) -> Data
    split: Split | None = None
    # Bumped by every ``put``, the only change of a buffer's memory or shape: arrays
    # kept from the buffers (``destinations``) are still theirs while it stays.
    version: int = 0
    rows: dict = field(default_factory=dict)  # (slot, use) -> each machine's rows, last put
    _epoch: int = -1
    _uses: dict = field(default_factory=dict)  # slot -> calls staged in this command

    def put(self, slot: Any, array: np.ndarray, epoch: int = -1,
            rows: list[tuple[int, int]] | None = None) -> DataRef:
        """Copy ``array`` into the buffer for ``slot`` (grown if needed); return its ref.

        ``rows``: over several machines, send each machine only these rows."""
        self.version += 1
        if epoch != self._epoch:
            self._epoch, self._uses = epoch, {}
        use = self._uses.get(slot, 0)
        self._uses[slot] = use + 1
        key = (slot, use)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.dtype != array.dtype or buffer.ndim != array.ndim:
            if rows is None:
                buffer = self.buffers[key] = data(value=array, oversize=1.25)
            else:
                buffer = self.buffers[key] = data(dtype=array.dtype,
                                                  shape=(0,) + array.shape[1:])
                buffer._stage_rows(array, 1.25, rows)
        elif rows is None:
            buffer.set_value(array, oversize=1.25)
        else:
            buffer._stage_rows(array, 1.25, rows)
        if self.split is not None:
            self.rows[key] = rows
        return buffer.ref()

    def refill(self, args: tuple, refs: tuple, arrays: list[int], kept: Any) -> Any:
        """Copy a repeated call's arrays where an earlier call's went; return where they
        went (``destinations``, kept for the next time), or None if that memory is not
        where the earlier call reads any more.

        ``refs`` are the earlier call's DataRefs of every input, ``arrays`` the
        positions of numpy arguments (of the same dtypes and shapes as then: the
        caller's key says so), ``kept`` what the last refill returned. Any call in
        between may have regrown or moved a buffer (a ``put``: then ``kept`` is stale);
        a buffer still on the same segment with the same shape is where the call
        reads, and PyTensor's ``filter`` would have cast each array as ``copyto`` does.
        """
        if kept is None or kept[0] != self.version:
            kept = self.destinations(refs, arrays)
            if kept is None:
                return None
        # setitem casts as copyto(casting="unsafe"), at a third of its cost
        for i, buffer in zip(arrays, kept[1]):  # noqa: B905 (as many)
            buffer.data[...] = args[i]
        return kept

    def destinations(self, refs: tuple, arrays: list[int]) -> tuple[int, list] | None:
        """``(version, buffers)``: the buffers where a call whose ``refs`` this staging
        holds copies its numpy arguments (at ``arrays``) when it repeats, valid while
        ``version`` stays; None where a buffer does not hold its ref (the call was
        staged as a later one in its command). The buffers, not their arrays: an array
        kept would keep a regrown buffer's old memory mapped."""
        kept = []
        for i in arrays:
            buffer = self.buffers.get((i, 0))
            if buffer is None or not buffer.holds(refs[i]):
                return None
            kept.append(buffer)
        return self.version, kept

    def sync(self, arrays: list[int]) -> None:
        """Over several machines: the refilled buffers to every machine's replica (the
        rows each takes, as their last put sent)."""
        for i in arrays:
            rows = self.rows.get((i, 0))
            if rows is None:
                self.buffers[(i, 0)].sync()
            else:
                self.buffers[(i, 0)]._replicate_rows(rows)

    def stage(self, checked: Checked, epoch: int, n_scattered: int = 0,
              offsets: tuple[int, ...] | None = None
              ) -> tuple[list[DataRef], tuple[int, int], DataRef | None]:
        """Refs for every input and the batch indices; numpy values are copied in."""
        selection = checked.batch
        rows = None
        if (self.split is not None and selection is not None
                and selection.indices is None):
            rows = self.split(selection.start, selection.stop, offsets)
        refs = [
            value.ref() if isinstance(value, Data)
            else self.put(i, value, epoch, rows if i < n_scattered else None)
            for i, value in enumerate(checked.values)
        ]
        if selection is None or selection.indices is None:
            indices = None
            span = (selection.start, selection.stop) if selection is not None else (0, 0)
        else:
            indices = self.put("batch", np.asarray(selection.indices, dtype=np.int64), epoch)
            span = (0, 0)
        return refs, span, indices


_NOT_REDUCED = ReduceOp.NONE  # (an enum member costs a lookup in Python 3.11)
_REPEATS_KEPT = 16  # Calls kept per variant for calls that repeat (train, validate, ...)
# One process in all: numpy inputs of at least this many bytes are read in place rather
# than copied (below it the copy costs less than arranging to skip it, about 2 us here)
_IN_PLACE_BYTES = 32 << 10


class PreparedCall:
    """One compiled variant's calls, seen from the master (see the module docstring)."""

    def __init__(self, prepared_id: int, prepared: Prepared, n_scattered: int,
                 labels: list[str], prefix: str, split: Split | None = None,
                 reads_in_place: bool = False):
        self.id = prepared_id
        self.prepared = prepared
        self.registered = False  # every rank holds ``prepared``
        self._n_scattered = n_scattered
        self._labels = labels
        self._prefix = prefix
        self._replicated = split is not None  # several machines: staged values' replicas
        self._staging = Staging(split=split)
        # (slices, profiled, key) -> (Call, positions of numpy arguments, the refs of
        # every input, where the arrays were last copied: ``Staging.refill``)
        self._repeats: dict[tuple, tuple[Call, list[int], tuple, Any]] = {}
        # ``reads_in_place`` (one process in all): key -> the same, for plain calls in
        # one slice whose numpy arguments are big enough that ``Function`` reads them in
        # place rather than copying them; always empty otherwise
        self._reads_in_place = reads_in_place
        self.in_place: dict[tuple, tuple[Call, list[int]]] = {}
        self._warned: set[int] = set()

    def message(self, checked: Checked, batch_s: tuple | None, num_slices: int,
                profile: bool, epoch: int, shared_rows: tuple | None = None,
                empty: bool = False, offsets: tuple[int, ...] | None = None) -> Call:
        """The ``Call`` for validated arguments; numpy inputs are staged now.

        ``epoch``: which command this call will run in (calls prepared for the same
        command never share staging buffers). ``shared_rows``: the givens' slice
        pattern's rows per rank; ``empty``: that slice has no rows (the master runs
        anyway, as for scattered inputs with none). ``offsets``: the scattered rows
        split by ``shares`` (None: evenly).
        """
        self._warn_casts(checked.casts)
        refs, span, indices = self._staging.stage(checked, epoch, self._n_scattered,
                                                  offsets)
        n = self._n_scattered
        return Call(
            self.id, tuple(refs[:n]), tuple(refs[n:]), checked.casts, span, indices,
            checked.minibatch, batch_s, num_slices,
            (checked.total_rows == 0 and n > 0) or empty,
            indices is None and not self.prepared.sliceable and not any(checked.casts)
            and all(ref.segment.startswith(self._prefix) for ref in refs),
            profile,
            None if self.registered else self.prepared,
            shared_rows,
            offsets,
        )

    def _warn_casts(self, casts: tuple) -> None:
        for i, dtype in enumerate(casts):
            if dtype is not None and i not in self._warned:
                self._warned.add(i)
                warnings.warn(
                    f"{self._labels[i]} is a synk.Data of another dtype, cast to {dtype} in "
                    "every process at every call; make the Data with the input's dtype to "
                    "skip the copy", stacklevel=5,
                )

    # -- repeats -----------------------------------------------------------------------------
    def repeat(self, key: tuple, args: tuple, num_slices: int = 1,
               profile: bool = False) -> Call | None:
        """The Call of an earlier plain call with inputs like ``args`` in as many slices,
        timed or not (``profile``), refilled; or None."""
        found = (num_slices, profile, key)
        entry = self._repeats.get(found)
        if entry is None:
            return None
        call, arrays, refs, kept = entry
        refilled = self._staging.refill(args, refs, arrays, kept)
        if refilled is None:
            return None
        if refilled is not kept:  # a buffer was put since: its arrays found again
            self._repeats[found] = (call, arrays, refs, refilled)
        if self._replicated:
            self._staging.sync(arrays)
        return call

    def kept(self, key: tuple, num_slices: int, profile: bool
             ) -> tuple[Call, list, list] | None:
        """For calls that go on repeating (``function.Bound``): the ``Call`` of an
        earlier plain call with inputs like ``key`` in ``num_slices`` slices, timed or
        not (``profile``), the positions of its numpy arguments and the buffers to copy
        them into (where it reads them while no buffer is put anew); None where there
        is no such call, its buffers hold another call's arrays, or over several
        machines (the copies go to each machine's replica too)."""
        found = (num_slices, profile, key)
        entry = self._repeats.get(found)
        if entry is None or self._replicated:
            return None
        call, arrays, refs, kept = entry
        if kept is None or kept[0] != self._staging.version:
            kept = self._staging.destinations(refs, arrays)
            if kept is None:
                return None
            self._repeats[found] = (call, arrays, refs, kept)
        return call, arrays, kept[1]

    def remember(self, key: tuple, call: Call) -> None:
        """Keep a plain call's ``Call`` for the calls that repeat it (after it ran)."""
        if len(self._repeats) >= _REPEATS_KEPT:
            self._repeats.clear()
            self.in_place.clear()
        if call.prepared is not None:  # it has been registered by running
            call = replace(call, prepared=None)
        arrays = [i for i, item in enumerate(key) if item[0] is None]
        refs = call.scattered + call.bcast
        self._repeats[(call.num_slices, call.profile, key)] = (call, arrays, refs, None)
        if self._reads_in_place and call.num_slices == 1 and not call.profile:
            size = sum(np.dtype(refs[i].dtype).itemsize * int(np.prod(refs[i].shape))
                       for i in arrays)
            if size >= _IN_PLACE_BYTES:
                self.in_place[key] = (call, arrays)


def repeat_key(args: tuple) -> tuple | None:
    """What validating and staging a call's arguments depends on, or None.

    For a ``Data``: its segment (renamed by every reallocation), shape and dtype (fixed
    for its life). For a numpy array: its dtype and shape, which decide what PyTensor's
    ``filter`` does to it. Any other argument: None (no shortcut).
    """
    key = []
    for arg in args:
        kind = type(arg)
        if kind is Data:
            key.append(arg.memory_key())
        elif kind is np.ndarray:
            key.append((None, arg.shape, arg.dtype))
        else:
            return None
    return tuple(key)


def combine(ops: tuple[ReduceOp, ...], replies: list, master: int) -> list:
    """Reduce each output over the ranks that ran, in rank (= row) order.

    An output whose op is None is the master's own (None if the master ran nothing);
    the workers' replies leave such outputs out.
    """
    # Loops, not comprehensions: each comprehension is a function made per call in
    # Python 3.11, and a call's reply comes here.
    if len(replies) == 2:  # n=2, the common case, written out
        first, second = replies
        if first is not None and second is not None:
            first_weight, first_outputs = first[0], first[1]
            second_weight, second_outputs = second[0], second[1]
            if len(first_outputs) == len(second_outputs):  # no output is the master's alone
                return reduce_pairs(ops, first_outputs, first_weight, second_outputs,
                                    second_weight)
    ran = []
    for reply in replies:
        if reply is not None:
            ran.append(reply)
    if len(ran) == 1 and _NOT_REDUCED not in ops:  # one process ran (n=1, or few rows)
        weight, outputs = ran[0][0], ran[0][1]
        results = []
        for i, op in enumerate(ops):
            results.append(reduce_one(op, outputs[i], weight))
        return results
    if len(ran) == 2 and _NOT_REDUCED not in ops:  # two processes ran (of more)
        return reduce_pairs(ops, ran[0][1], ran[0][0], ran[1][1], ran[1][0])
    weights = [reply[0] for reply in ran]
    if _NOT_REDUCED not in ops:
        return [
            reduce_values(op, [reply[1][i] for reply in ran], weights)
            for i, op in enumerate(ops)
        ]
    own = replies[master]
    results, sent = [], 0
    for i, op in enumerate(ops):
        if op is _NOT_REDUCED:
            results.append(None if own is None else own[1][i])
            continue
        values = [reply[1][i if rank == master else sent]
                  for rank, reply in enumerate(replies) if reply is not None]
        results.append(reduce_values(op, values, weights))
        sent += 1
    return results
