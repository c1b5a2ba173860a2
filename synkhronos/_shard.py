"""What every process does for one function call: select its rows, run, accumulate.

The master describes a call once, in a ``Call`` (``_call.py``); every process (the
master included) then runs ``run_call`` on it independently:

1. the variant: registered from the message the first time (``PREPARED``), then
   found by id;
2. its rows: its contiguous block of the selected rows (``block``, or the bounds the
   master computed from ``shares``: ``Call.offsets``), either a zero-copy view of the
   shared-memory inputs (a row range; a minibatch Data's first rows) or its own
   gather of its block of the ``batch`` indices, done in parallel by every process;
3. its ``sliceable_shareds`` rows, selected by its entry of ``batch_s``, checked
   here against its own rows: every rank votes, and if any refuses, none runs (the
   master raises the ``ValueError``); or, for givens that slice rows of shared
   variables (``_givens``), its block of that slice, as the master computed it;
4. the local PyTensor function, once, or once per slice with outputs and update values
   accumulated in place, the updates computed from the original values and applied
   once at the end;
5. the reply ``(weight, outputs)``: the row count that weights its ``avg`` outputs in
   the master's reduction, or ``None`` when it had no rows (it then ran nothing). A
   worker leaves out the outputs whose op is None: the master returns its own.

A call in chunks (``Call.chunks``) has no fixed block per rank: the selected rows are
cut into that many consecutive chunks, and every process takes the next chunk not yet
taken (``ControlBlock.take``) until none is left, so a process slowed by another
program beside it takes fewer (``_run_chunks``). The function runs once per chunk
taken and its updates are applied after each (they add into their variables: checked
when the call is made); outputs accumulate weighted by the chunk's rows, and the reply's
weight is every row the process ran.

A call that repeats (the same message again, a training loop) runs from what its
first runs worked out: the kept plan (its function and views). A worker goes one step
further (``lane``): the next command, if it is that call again, skips the handler
table and writes its reply where the last one went.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _pytensor
from ._call import Call, Prepared
from ._core import faults
from ._core.context import RankContext, RankVar
from ._dataref import call_view
from ._reducers import Accumulator, ReduceOp
from ._runtime import epoch
from ._runtime.remote import Refusal
from ._scatter import Batch, block, select_batch_s, select_rows, split_bounds
from .distribute import REGISTRY

__all__ = ["run_call", "lane", "PREPARED", "on_arrays"]

PREPARED: RankVar[dict[int, Prepared]] = RankVar("prepared calls", lambda ctx: {})


_NOT_REDUCED = ReduceOp.NONE  # (an enum member costs a lookup in Python 3.11)
_NO_PLAN: tuple = (None, None, (), 0, False)  # _CallViews.plan when there is none
_NO_LAST: tuple[None, tuple[list, list, int]] = (None, ([], [], 0))


class _CallViews:
    """Per ``views_only`` call: this rank's arrays and weight, valid while the arena
    keeps every mapping it had (they are plain views, which see writes in place).

    ``plan``: for the last call, everything ``run_call`` needs to run it again at once
    (the function, its arguments, the weight, whether to drop unreduced outputs).
    """

    def __init__(self) -> None:
        self.epoch = -1
        self.by_call: dict[Call, tuple[list, list, int]] = {}
        self.last: tuple[Call | None, tuple[list, list, int]] = _NO_LAST  # by identity
        self.plan: tuple[Call | None, Any, tuple, int, Any] = _NO_PLAN


_VIEWS: RankVar[_CallViews] = RankVar("call views", lambda ctx: _CallViews())
_VIEWS_KEPT = 64


def _cast(array: np.ndarray, dtype: str | None) -> np.ndarray:
    return array if dtype is None else np.asarray(array, dtype=dtype)


def _viewed_inputs(ctx: RankContext, call: Call) -> tuple[list, list, int]:
    """This rank's scattered and broadcast arrays and its weight, kept per call."""
    views = _VIEWS.get(ctx)
    now = epoch.current
    if views.epoch != now:  # a segment was released (or more): let go of every view
        views.by_call.clear()
        views.last = _NO_LAST
        views.plan = _NO_PLAN
        views.epoch = now
    last, entry = views.last
    if last is call:  # the same repeated message again: no hash of the whole Call
        return entry
    views.plan = _NO_PLAN
    found = views.by_call.get(call)
    if found is not None:
        views.last = (call, found)
        return found
    scattered, bcast, weight = _inputs(ctx, call)
    if len(views.by_call) >= _VIEWS_KEPT:
        views.by_call.clear()
    entry = views.by_call[call] = (scattered, bcast, weight)
    views.last = (call, entry)
    return entry


def _rows_first(ctx: RankContext, call: Call, i: int) -> np.ndarray:
    """Scattered input ``i`` as this process maps it, viewed with its rows first
    (``in_axes``: an input whose rows lie along another axis)."""
    view = call_view(call.scattered[i], ctx)
    axes = call.axes
    if axes is not None and axes[i]:
        view = np.moveaxis(view, axes[i], 0)
    return view


def _inputs(ctx: RankContext, call: Call) -> tuple[list, list, int]:
    """This rank's scattered and broadcast arrays, and its weight (its row count)."""
    n, rank = ctx.size, ctx.rank
    scattered: list[np.ndarray] = []
    weight = 1
    if call.scattered:
        length, indices, first = _selected(ctx, call)
        offsets = call.offsets  # rows in proportion to shares, or None: the even split
        lo, hi = (block(length, n, rank) if offsets is None
                  else (offsets[rank], offsets[rank + 1]))
        weight = hi - lo
        if weight or call.run_if_empty:
            sources = [_rows_first(ctx, call, i) for i in range(len(call.scattered))]
            scattered = _scattered_rows(call, sources, indices, first, lo, hi)
    return scattered, _broadcast(ctx, call), weight


def _selected(ctx: RankContext, call: Call) -> tuple[int, np.ndarray | None, int]:
    """The call's selected rows: ``(how many, the batch indices or None, the first row
    of a range)``."""
    if call.batch_indices is not None:
        indices = call_view(call.batch_indices, ctx)
        return len(indices), indices, 0
    start, stop = call.batch_range
    return stop - start, None, start


def _scattered_rows(call: Call, sources: list, indices: np.ndarray | None, first: int,
                    lo: int, hi: int) -> list[np.ndarray]:
    """Selected rows ``lo:hi`` of each scattered input (``sources``, rows first): a
    view of a range, this process's own gather of indices, or a minibatch buffer's
    rows ``lo:hi``; cast where the call asks."""
    mine = (Batch(indices=indices[lo:hi]) if indices is not None
            else Batch(start=first + lo, stop=first + hi))
    positions = Batch(start=lo, stop=hi)  # a minibatch buffer's rows
    buffers, casts = call.minibatch, call.casts
    return [_cast(select_rows(view, positions if buffers and buffers[i] else mine), casts[i])
            for i, view in enumerate(sources)]


def _broadcast(ctx: RankContext, call: Call) -> list[np.ndarray]:
    """The broadcast inputs as this process maps them, cast where the call asks."""
    offset, casts = len(call.scattered), call.casts
    return [_cast(call_view(ref, ctx), casts[offset + i]) for i, ref in enumerate(call.bcast)]


def _sliceable_rows(ctx: RankContext, call: Call, prepared: Prepared) -> list[np.ndarray]:
    """This rank's selected rows of the sliceable shared variables.

    With ``batch_s``, every rank checks its own selection and votes: all run, or none
    (a refused selection raises ``Refusal`` on every rank, before anything changed).
    """
    shared = REGISTRY.get(ctx).shared
    values = [_pytensor.value(shared[uid]) for uid in prepared.sliceable]
    if call.shared_rows is not None:  # the givens' slice: the master computed the rows
        return [value[start:stop] for value, (start, stop)
                in zip(values, call.shared_rows[ctx.rank], strict=True)]
    if call.batch_s is None:
        return values
    raw = call.batch_s[ctx.rank]
    problem: str | None = None
    selections = []
    for uid, value in zip(prepared.sliceable, values, strict=True):
        try:  # each variable against its own rows (a negative index counts from its end)
            length = len(value) if np.ndim(value) else 0
            selections.append(select_batch_s(raw, length, ctx.rank))
        except (TypeError, ValueError) as exc:
            problem = f"sliceable shared {shared[uid].name!r}: {exc}"
            break
    if not ctx.meeting.agree(ctx, problem is None):
        if problem is None:
            raise Refusal("batch_s was refused by another process", secondary=True)
        raise Refusal(problem)
    return [select_rows(value, selection)
            for value, selection in zip(values, selections, strict=True)]


def _as_list(outputs: Any) -> list:
    """A function's outputs as a list (a trusted call's list is new each call: kept)."""
    if type(outputs) is list:
        return outputs
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


def _reduced_only(outputs: list, ops: tuple) -> list:
    """A worker's outputs without those whose op is None (the master keeps its own)."""
    return [out for out, op in zip(outputs, ops, strict=True) if op is not _NOT_REDUCED]


def _run_sliced(fn: Any, call: Call, prepared: Prepared, scattered: list, bcast: list,
                sliceable: list, ctx: RankContext) -> list:
    """Run ``num_slices`` consecutive slices; accumulate outputs and update values."""
    n_out = len(prepared.output_ops)
    outputs = [Accumulator(op) for op in prepared.output_ops]
    updates = [Accumulator(op) for op in prepared.update_ops]
    sliced = scattered + sliceable
    # Nothing cut into rows (only broadcast inputs): one run is the whole call.
    slices = call.num_slices if sliced else 1
    bounds = [split_bounds(len(a), slices) for a in sliced]
    for k in range(slices):
        parts = [a[b[k][0] : b[k][1]] for a, b in zip(sliced, bounds, strict=True)]
        weight = len(parts[0]) if parts else 1
        if weight == 0 and not call.run_if_empty:
            continue
        pieces = parts[: len(scattered)] + bcast + parts[len(scattered) :]
        values = _as_list(fn(*pieces))
        for acc, value in zip(outputs + updates, values, strict=True):
            acc.add(value, weight)
    shared = REGISTRY.get(ctx).shared
    store = ctx.placement.store
    for uid, acc in zip(prepared.update_uids, updates, strict=True):
        value = acc.result()
        if value is not None:
            store(shared[uid], value)
    return [acc.result() for acc in outputs[:n_out]]


class _Takes:
    """This process's count of chunked calls in the current command: with the
    command's sequence number, the tag under which the ranks share out a call's chunks
    (every rank runs a command's calls in the same order)."""

    def __init__(self) -> None:
        self.seq = -1
        self.count = 0

    def tag(self, ctx: RankContext) -> int:
        seq = ctx.control.seq if ctx.control is not None else 0
        if seq != self.seq:
            self.seq, self.count = seq, 0
        self.count += 1
        return seq * _TAGS_PER_COMMAND + self.count


_TAKES: RankVar[_Takes] = RankVar("chunk takes", lambda ctx: _Takes())
_TAGS_PER_COMMAND = 1 << 20  # (more chunked calls than this in one command: none)


def _run_chunks(ctx: RankContext, call: Call, prepared: Prepared, fn: Any) -> tuple | None:
    """A call in chunks (see the module docstring): this rank's ``(weight, outputs[,
    timings])`` over the chunks it took, or None if it took none."""
    chunks = call.chunks
    control = ctx.control
    tag = _TAKES.get(ctx).tag(ctx)
    length, indices, first = _selected(ctx, call)
    sources = [_rows_first(ctx, call, i) for i in range(len(call.scattered))]
    bcast = _broadcast(ctx, call)
    outputs = [Accumulator(op) for op in prepared.output_ops]
    rows = 0
    gather = compute = 0.0
    clock = time.perf_counter
    alone = iter(range(chunks))  # one process in all (no control block): every chunk, in order
    while True:
        k = next(alone, chunks) if control is None else control.take(tag, chunks, ctx.watch)
        if k >= chunks:
            break
        lo, hi = block(length, chunks, k)
        if hi == lo:
            continue
        started = clock()
        scattered = _scattered_rows(call, sources, indices, first, lo, hi)
        ran = clock()
        values = _as_list(fn(*scattered, *bcast))
        done = clock()
        gather += ran - started
        compute += done - ran
        for acc, value in zip(outputs, values, strict=True):
            acc.add(value, hi - lo)
        rows += hi - lo
    if rows == 0:
        return None
    results = [acc.result() for acc in outputs]
    if call.timings:
        return rows, results, _timings(gather, compute)
    return rows, results


def run_call(ctx: RankContext, call: Call) -> tuple | None:
    """This rank's share of a call: ``(weight, outputs[, timings])``, or ``None`` if it
    had no rows."""
    if call.views_only:
        views = _VIEWS.get(ctx)
        plan = views.plan
        if plan[0] is call and views.epoch == epoch.current:
            # The last call again (a training loop): what the first run worked out.
            if call.timings:
                return _planned_with_timings(plan)
            return _planned(plan)
    return _run_call(ctx, call)


def _planned(plan: tuple) -> tuple:
    """A kept plan run: its reply ``(weight, outputs)`` (``run_call``, ``lane``,
    ``on_arrays``)."""
    if faults.ARMED:
        _plan_points()
    _, fn, args, weight, strip = plan
    outputs = _as_list(fn(*args))
    return weight, _reduced_only(outputs, strip) if strip else outputs


def lane(ctx: RankContext, call: Call) -> Callable[[int, int], bool] | None:
    """A worker's shortcut for ``call`` repeated (``Executor.lanes``), once it has a kept
    plan and its reply went into the slot as arrays: the plan run and its outputs
    copied where the last reply's went (``ReplySlots.finish`` given the description
    the slot holds), with no lookup of handler, plan or description. None: not such a
    call (not plain views, timings asked, not planned yet, or a reply that was
    pickled)."""
    replies = ctx.replies
    if replies is None or not call.views_only or call.timings or call.num_slices != 1:
        return None
    views = _VIEWS.get(ctx)
    plan = views.plan
    head = replies.written
    if plan[0] is not call or head is None or views.epoch != epoch.current:
        return None
    kept_under, arena = views.epoch, ctx.arena
    master_rank = ctx.master_rank

    def run(seq: int, rank: int) -> bool:
        if views.plan is not plan or epoch.current != kept_under:
            return False  # a mapping dropped, another plan kept
        reply = _planned(plan)
        if faults.ARMED:
            faults.hit("reply")
        replies.finish(rank, seq, reply, False, master_rank, arena, head)
        return True

    return run


def _plan_points() -> None:
    """A kept plan's fault points: those its usual way passes before the function
    (``gather``, though its rows were gathered when the plan was made; ``function``)."""
    faults.hit("gather")
    faults.hit("function")


def on_arrays(ctx: RankContext, call: Call, positions: Sequence[int],
              args: tuple) -> Callable[[RankContext, Call], tuple] | None:
    """One process in all (``n_parallel=1``): the handler that runs ``call`` at once (as
    its kept plan) on the caller's numpy arrays (``args`` at ``positions``, of the
    dtypes and shapes its first run had) where they are, instead of on copies in
    shared memory that no other process reads (``Session.run_held(..., handler=)``).
    The kept plan is left as it was: nothing keeps the caller's arrays after the call,
    as PyTensor's own call keeps none. None: this process has not kept ``call``'s views
    (it has not run it since the arena last dropped a mapping), or an array is not what
    its copy would be (another dtype, which the copy casts, or not C-contiguous), so
    the caller copies."""
    views = _VIEWS.get(ctx)
    if views.epoch != epoch.current:
        return None
    kept = views.plan
    if kept[0] is call:
        fn, arrays, weight = kept[1], list(kept[2]), kept[3]
    else:  # another call ran last (the plan is the last call's): plan this one too
        entry = views.by_call.get(call)
        if entry is None:
            return None
        scattered, bcast, weight = entry
        fn = REGISTRY.get(ctx).runner(ctx, PREPARED.get(ctx)[call.prepared_id].fn_id)
        arrays = [*scattered, *bcast]
    refs = call.scattered + call.bcast
    axes = call.axes
    for i in positions:
        arg = args[i]
        if arg.dtype.str != refs[i].dtype or not arg.flags.c_contiguous:
            return None
        if axes is not None and i < len(axes) and axes[i]:  # its rows first, as the
            arg = np.moveaxis(arg, axes[i], 0)  # function takes them: a view
        arrays[i] = arg
    # the master keeps every output (nothing to strip)
    plan = (call, fn, tuple(arrays), weight, False)
    return lambda ctx, message: _planned(plan)


def _planned_with_timings(plan: tuple) -> tuple:
    """``_planned``, with its timings (its rows were gathered when the plan was made)."""
    start = time.perf_counter()
    weight, outputs = _planned(plan)
    return weight, outputs, _timings(0.0, time.perf_counter() - start)


def _timings(gather: float, function: float) -> np.ndarray:
    """A reply's timings (seconds), as one array: the reply is then written raw, as one
    without them (a tuple of floats would make it a pickle at every call)."""
    return np.array((gather, function))


def _run_call(ctx: RankContext, call: Call) -> tuple | None:
    """``run_call`` the whole way (a first call, a new message, any but plain views)."""
    table = PREPARED.get(ctx)
    if call.prepared is not None:
        table[call.prepared_id] = call.prepared
    prepared = table[call.prepared_id]
    if call.chunks:
        if faults.ARMED:
            _plan_points()
        reg = REGISTRY.get(ctx)
        return _run_chunks(ctx, call, prepared,
                           reg.runners.get(prepared.fn_id) or reg.runner(ctx, prepared.fn_id))
    if call.timings:
        start = time.perf_counter()
    if faults.ARMED:  # (before the views kept for a repeated call, too)
        faults.hit("gather")
    if call.views_only and epoch.REPLAY:  # (SYNK_REPLAY=0: nothing kept)
        scattered, bcast, weight = _viewed_inputs(ctx, call)
        sliceable: list[np.ndarray] = []
    else:
        scattered, bcast, weight = _inputs(ctx, call)
        sliceable = _sliceable_rows(ctx, call, prepared) if prepared.sliceable else []
        if sliceable and not call.scattered:
            weight = len(sliceable[0])
    runs = weight > 0 or (call.run_if_empty and ctx.is_master)
    if not runs:
        return None
    if call.timings:
        gathered = time.perf_counter()
    reg = REGISTRY.get(ctx)
    fn = reg.runners.get(prepared.fn_id) or reg.runner(ctx, prepared.fn_id)
    if faults.ARMED:
        faults.hit("function")
    if call.num_slices == 1:
        outputs = _as_list(fn(*scattered, *bcast, *sliceable))
    else:
        outputs = _run_sliced(fn, call, prepared, scattered, bcast, sliceable, ctx)
    # not reduced: the master keeps its own, a worker sends nothing of it
    strip = _NOT_REDUCED in prepared.output_ops and not ctx.is_master
    if strip:
        outputs = _reduced_only(outputs, prepared.output_ops)
    if call.views_only and call.num_slices == 1 and epoch.REPLAY:
        views = _VIEWS.get(ctx)
        if views.last[0] is call:  # its views are the ones kept: run it so next time
            views.plan = (call, fn, (*scattered, *bcast), weight,
                          prepared.output_ops if strip else False)
    if call.timings:
        return weight, outputs, _timings(gathered - start, time.perf_counter() - gathered)
    return weight, outputs
