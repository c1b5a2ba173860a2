"""Prepared calls: what one variant of a function sends, stages and gets back.

PyTensor splits building a function (``maker``) from running it (``executor``); so
does synkhronos. ``function.py`` builds the compiled variants; each variant (the
function itself, an ``output_subset``, the sliced form) gets one ``PreparedCall`` here,
which owns everything that running it needs in the master:

- its ``Prepared`` record (compiled function id, ops, sliceable and update variables):
  the static part, sent with the variant's first call and kept by every rank by id,
  so later calls send only the id and what varies (``Call``);
- its ``Staging`` (``_staging.py``): shared-memory buffers for numpy inputs and
  ``batch`` indices, reused call after call (grown only when too small);
- its records: what a plain call kept for the calls that repeat it (``_replay.py``:
  the ``Call``, the buffers its arrays were copied into), so a training loop
  validates once;
- the reduction of the ranks' replies into what PyTensor would return.

A ``Call`` is built without being run (``message``), so a training step can run
several in one command (a ``Sequence``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._core.protocol import Message
from ._core.session import Session
from ._dataref import DataRef
from ._reducers import ReduceOp, reduce_one, reduce_pairs, reduce_values
from ._staging import Staging, replica_rows
from ._validate import Checked
from .data import Data

__all__ = ["Call", "Prepared", "PreparedCall", "combine", "repeat_key"]


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
    timings: bool = False  # reply with (gather, function) seconds too (``synk.profile()``,
    # rows balanced by measured speed)
    prepared: Prepared | None = None  # sent with a variant's first call
    shared_rows: tuple | None = None  # givens' slice pattern: per rank, (start, stop)
    # of each sliceable shared variable's rows (instead of batch_s)
    offsets: tuple[int, ...] | None = None  # rows split by ``shares``: each rank's
    # first selected row, then the end (``_scatter.offsets``); None: the even split
    axes: tuple[int, ...] | None = None  # per scattered input, the axis its rows lie
    # along (``in_axes``), each viewed with it first; None: axis 0 for all
    chunks: int = 0  # the selected rows in this many chunks, taken by whichever process
    # is free (``_shard._run_chunks``); 0: each process its own block


_NOT_REDUCED = ReduceOp.NONE  # (an enum member costs a lookup in Python 3.11)


class PreparedCall:
    """One compiled variant's calls, seen from the master (see the module docstring)."""

    def __init__(self, session: Session, prepared: Prepared, n_scattered: int,
                 labels: list[str], axes: tuple[int, ...] | None = None):
        self.id = prepared.fn_id
        self.prepared = prepared
        self.registered = False  # every rank holds ``prepared``
        self._n_scattered = n_scattered
        self._labels = labels
        self._prefix = session.ctx.prefix
        self._axes = axes  # each scattered input's row axis (``in_axes``), or None
        # (split: several machines, the rows each one's replicas take)
        self.staging = Staging(session, replica_rows(session.replica_groups, session.ctx.size))
        # (slices, key) -> the ``_replay.Record`` a plain call kept for its repeats
        self.records: dict[tuple, Any] = {}
        # One process in all: a record of big numpy arguments reads them in place, where
        # the placement says that costs less than the copy (CPU cores, a GPU; not JAX's
        # CPU platform standing in for one)
        self.reads_in_place = session.n == 1 and session.ctx.placement.reads_callers_arrays
        self._warned: set[int] = set()

    def message(self, checked: Checked, batch_s: tuple | None, num_slices: int,
                timings: bool, command: int, shared_rows: tuple | None = None,
                empty: bool = False, offsets: tuple[int, ...] | None = None,
                chunks: int = 0) -> Call:
        """The ``Call`` for validated arguments; numpy inputs are staged now.

        ``command``: which command this call will run in (calls prepared for the same
        command never share staging buffers). ``shared_rows``: the givens' slice
        pattern's rows per rank; ``empty``: that slice has no rows (the master runs
        anyway, as for scattered inputs with none). ``offsets``: the scattered rows
        split by ``shares`` (None: evenly). ``chunks``: the rows in that many chunks,
        taken as the processes come free (0: each its own block).
        """
        self._warn_casts(checked.casts)
        refs, span, indices = self.staging.stage(checked, command, self._n_scattered,
                                                  offsets, self._axes)
        n = self._n_scattered
        return Call(
            self.id, tuple(refs[:n]), tuple(refs[n:]), checked.casts, span, indices,
            checked.minibatch, batch_s, num_slices,
            (checked.total_rows == 0 and n > 0) or empty,
            indices is None and not self.prepared.sliceable and not any(checked.casts)
            and all(ref.segment.startswith(self._prefix) for ref in refs) and not chunks,
            timings,
            None if self.registered else self.prepared,
            shared_rows,
            offsets,
            self._axes,
            chunks,
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
    if len(replies) == 1:  # one process in all
        ran = replies if replies[0] is not None else []
    else:
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
