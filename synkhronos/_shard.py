"""What every process does for one function call: select its rows, run, accumulate.

The master describes a call once, in a ``CallPlan``; every process (the master
included) then runs ``run_share`` on it independently:

1. its rows: its contiguous block of the selected rows (``part_bounds``), either a
   zero-copy view of the shared-memory inputs (a row range) or its own gather of its
   block of the ``batch`` indices, done in parallel by every process;
2. its ``sliceable_shareds`` rows, selected by its entry of ``batch_s``;
3. the local PyTensor function, once, or once per slice with outputs and update values
   accumulated in place, the updates computed from the original values and applied
   once at the end;
4. the reply ``(weight, outputs)``: the row count that weights its ``avg`` outputs in
   the master's reduction, or ``None`` when it had no rows (it then ran nothing). A
   worker leaves out the outputs whose op is None: the master returns its own.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from ._dataref import call_view
from ._reducers import Accumulator, ReduceOp
from ._scatter import Batch, block, select_rows, slice_bounds
from .distribute import registry
from .session import Opcode, Session, register

__all__ = ["CallPlan", "run_share"]


class CallPlan(NamedTuple):
    """Everything a process needs to run its share of one call (small, picklable)."""

    fn_id: int
    scattered: tuple  # DataRef per scattered input
    bcast: tuple  # DataRef per broadcast input
    casts: tuple  # dtype (str) to cast each scattered+bcast input to, or None
    batch_range: tuple[int, int]  # selected rows of the scattered inputs, if no indices
    batch_indices: Any  # DataRef of int64 row indices, or None
    sliceable: tuple[int, ...]  # uids of the sliceable shared variables
    batch_s: tuple | None  # per rank: Batch or None (all rows)
    num_slices: int
    output_ops: tuple[ReduceOp, ...]
    update_uids: tuple[int, ...]  # sliced calls: the shared variable of each update
    update_ops: tuple[ReduceOp, ...]
    run_if_empty: bool  # every process has zero rows: the master runs anyway
    views_only: bool  # plain views of this session's segments: row ranges, no casts,
    # no sliceable shared variables
    profile: bool = False  # reply with (gather, function) seconds too
    minibatch: tuple[bool, ...] | None = None  # per scattered input: a minibatch buffer,
    # which supplies the rank's block of positions instead of its block of rows


def _cast(array: np.ndarray, dtype: str | None) -> np.ndarray:
    return array if dtype is None else np.asarray(array, dtype=dtype)


_VIEWS = "synkhronos.shard.views"  # session.local: [generation, CallPlan -> (views, weight)]
_VIEWS_KEPT = 64


def _no_views() -> list:
    return [-1, {}]


def _viewed_inputs(session: Session, plan: CallPlan) -> tuple[list, list, int]:
    """This rank's scattered and broadcast arrays and its weight, kept per plan.

    Only for ``views_only`` plans: their arrays are plain views of this session's
    shared memory, which see every change written in place; all of them are dropped
    as soon as any segment is released (the segment cache's generation moves on), so
    no view keeps freed memory mapped.
    """
    kept = session.local(_VIEWS, _no_views)  # [generation, plan -> views]
    generation, cache = session.segments.generation, kept[1]
    if kept[0] != generation:  # a segment was released: let go of every view
        cache.clear()
        kept[0] = generation
    entry = cache.get(plan)
    if entry is not None:
        return entry
    scattered, bcast, _, weight = _gather_inputs(session, plan)
    if len(cache) >= _VIEWS_KEPT:
        cache.clear()
    entry = cache[plan] = (scattered, bcast, weight)
    return entry


def _gather_inputs(session: Session, plan: CallPlan) -> tuple[list, list, list, int]:
    """This rank's scattered, broadcast and sliceable arrays, and its weight."""
    n, rank = session.n, session.rank
    casts = plan.casts
    scattered: list[np.ndarray] = []
    weight = 1
    if plan.scattered:
        if plan.batch_indices is not None:
            indices = call_view(plan.batch_indices, session)
            lo, hi = block(len(indices), n, rank)
            mine = Batch(indices=indices[lo:hi])
        else:
            start, stop = plan.batch_range
            lo, hi = block(stop - start, n, rank)
            mine = Batch(start=start + lo, stop=start + hi)
        weight = hi - lo
        if weight or plan.run_if_empty:
            buffers = plan.minibatch or (False,) * len(plan.scattered)
            positions = Batch(start=lo, stop=hi)  # a minibatch buffer's rows
            for i, ref in enumerate(plan.scattered):
                rows = positions if buffers[i] else mine
                scattered.append(_cast(select_rows(call_view(ref, session), rows), casts[i]))
    offset = len(plan.scattered)
    bcast = [_cast(call_view(ref, session), casts[offset + i]) for i, ref in enumerate(plan.bcast)]
    rows: list[np.ndarray] = []
    if plan.sliceable:
        reg = registry(session)
        selection = plan.batch_s[rank] if plan.batch_s is not None else None
        for uid in plan.sliceable:
            rows.append(select_rows(reg.shared[uid].get_value(borrow=True), selection))
        if not plan.scattered:
            weight = len(rows[0])
    return scattered, bcast, rows, weight


def _as_list(outputs: Any) -> list:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _run_sliced(fn, plan: CallPlan, scattered, bcast, sliceable, session: Session) -> list:
    """Run ``num_slices`` consecutive slices; accumulate outputs and update values."""
    n_out = len(plan.output_ops)
    outputs = [Accumulator(op) for op in plan.output_ops]
    updates = [Accumulator(op) for op in plan.update_ops]
    sliced = scattered + sliceable
    # Nothing cut into rows (only broadcast inputs): one run is the whole call.
    slices = plan.num_slices if sliced else 1
    bounds = [slice_bounds(len(a), slices) for a in sliced]
    for k in range(slices):
        parts = [a[b[k][0] : b[k][1]] for a, b in zip(sliced, bounds, strict=True)]
        weight = len(parts[0]) if parts else 1
        if weight == 0 and not plan.run_if_empty:
            continue
        pieces = parts[: len(scattered)] + bcast + parts[len(scattered) :]
        values = _as_list(fn(*pieces))
        for acc, value in zip(outputs + updates, values, strict=True):
            acc.add(value, weight)
    reg = registry(session)
    for uid, acc in zip(plan.update_uids, updates, strict=True):
        value = acc.result()
        if value is not None:
            var = reg.shared[uid]
            var.set_value(np.asarray(value, dtype=var.type.dtype), borrow=True)
    return [acc.result() for acc in outputs[:n_out]]


def run_share(session: Session, plan: CallPlan) -> tuple | None:
    """Run this rank's share: ``(weight, outputs[, timings])``, or ``None`` if no rows."""
    if plan.profile:
        start = time.perf_counter()
    if plan.views_only:
        scattered, bcast, weight = _viewed_inputs(session, plan)
        sliceable = []
    else:
        scattered, bcast, sliceable, weight = _gather_inputs(session, plan)
    runs = weight > 0 or (plan.run_if_empty and session.rank == session.master_rank)
    if not runs:
        return None
    if plan.profile:
        gathered = time.perf_counter()
    fn = registry(session).functions[plan.fn_id]
    if plan.num_slices == 1:
        outputs = _as_list(fn(*scattered, *bcast, *sliceable))
    else:
        outputs = _run_sliced(fn, plan, scattered, bcast, sliceable, session)
    if ReduceOp.NONE in plan.output_ops and session.rank != session.master_rank:
        # not reduced: the master keeps its own, a worker sends nothing of it
        outputs = [out for out, op in zip(outputs, plan.output_ops, strict=True)
                   if op is not ReduceOp.NONE]
    if plan.profile:
        return weight, outputs, (gathered - start, time.perf_counter() - gathered)
    return weight, outputs


@register(Opcode.CALL)
def _call(session: Session, plan: CallPlan):
    return run_share(session, plan)
