"""Each rank's half of a collective: the handlers that run its message on every process.

The master builds a collective as a ``Step`` (``fused.py``: its message, and ``finish``
for the replies); every process, the master included, runs the message here
(``HANDLERS``): find the group or the scratch the message names and call the backend's
primitive, which loads this rank's values, votes that its shapes match the master's
(every rank leaves unchanged together if any differs: the handler then replies its
shapes, ``Mismatch``), moves or combines them and binds each variable to its result;
for the region commands (``scatter``, ``gather``, ``get_value``, ...) write or read
this rank's region of the host scratch around the backend's move. A reduction that
repeats runs through a worker's lane (``reduce_lane``).

Which backend runs (``backend.py``) was chosen once per process from its context;
nothing here asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _pytensor
from .._core import faults
from .._core.context import RankContext, RankVar
from .._core.protocol import Message
from .._dataref import DataRef
from .._runtime import epoch
from .._scatter import Batch, select_rows
from ..distribute import REGISTRY
from .backend import (
    BACKEND,
    Backend,
    FusedLayout,
    Group,
    host_value,
    store_value,
)
from .fused import (
    AllGatherPieces,
    AllReduce,
    Broadcast,
    Gather,
    GetValue,
    LowPrecisionReduce,
    Mismatch,
    Place,
    Reduce,
    ReduceScatter,
    Shapes,
    ViewsOf,
)

__all__ = ["HANDLERS", "reduce_lane"]


def _variables(ctx: RankContext, uids: tuple[int, ...]) -> list:
    shared = REGISTRY.get(ctx).shared
    return [shared[uid] for uid in uids]


def _own_shapes(variables: list) -> Mismatch:
    return Mismatch(tuple(_pytensor.value(var).shape for var in variables))


def _on_shapes(ctx: RankContext, message: Shapes) -> tuple:
    return tuple(_pytensor.value(var).shape for var in _variables(ctx, message.uids))


def _on_broadcast(ctx: RankContext, message: Broadcast) -> None:
    backend = BACKEND.get(ctx)
    group = backend.group(ctx, message.key, message.spec)
    if message.setup is not None:
        backend.accept(ctx, message.setup)
    backend.broadcast(ctx, group)


def _reduction_group(ctx: RankContext, message: AllReduce | LowPrecisionReduce
                     ) -> tuple[Backend, Group]:
    """The backend and the group a reduction message names (mapped, with the setup or
    the wire the message introduces)."""
    backend = BACKEND.get(ctx)
    group = backend.group(ctx, message.key, message.spec)
    if isinstance(message, LowPrecisionReduce):
        if message.wire is not None:
            backend.map_wire(ctx, group, message.wire)
    elif not message.pair and message.setup is not None:
        backend.accept(ctx, message.setup)
    return backend, group


def _reduce(ctx: RankContext, backend: Backend, group: Group,
            message: AllReduce | LowPrecisionReduce) -> Any:
    """Run a reduction message's primitive on ``group``; the rank's reply (None; its
    shapes, or a ``Mismatch``, when the ranks' shapes differ)."""
    if isinstance(message, LowPrecisionReduce):
        primitive = (backend.low_precision_reduce_scatter if message.scatter
                     else backend.low_precision_all_reduce)
        done = primitive(ctx, group, message.op, message.exchange)
    elif message.pair:
        mismatch = backend.pair_reduce(ctx, group, message.op)
        return None if mismatch is None else Mismatch(mismatch)
    else:
        done = backend.all_reduce(ctx, group, message.op)
    return None if done else _own_shapes(group.variables)


def _on_reduction(ctx: RankContext, message: AllReduce | LowPrecisionReduce) -> Any:
    if isinstance(message, AllReduce) and message.pair and ctx.rank == ctx.master_rank:
        return None  # its values are in its slot already; the worker does the rest
    backend, group = _reduction_group(ctx, message)
    return _reduce(ctx, backend, group, message)


def _on_reduce(ctx: RankContext, message: Reduce) -> Any:
    backend = BACKEND.get(ctx)
    group = backend.group(ctx, message.key, message.spec)
    scratch = None if message.scratch is None else backend.scratch(ctx, message.scratch)
    if backend.reduce(ctx, group, message.op, message.in_place, scratch):
        return None
    return _own_shapes(group.variables)


def _on_reduce_scatter(ctx: RankContext, message: ReduceScatter) -> Any:
    backend = BACKEND.get(ctx)
    group = backend.group(ctx, message.key, message.spec)
    if backend.reduce_scatter(ctx, group, message.op):
        return None
    return _own_shapes(group.variables)


def _on_all_gather_pieces(ctx: RankContext, message: AllGatherPieces) -> None:
    backend = BACKEND.get(ctx)
    group = backend.group(ctx, message.key, message.spec)
    if message.common:
        backend.all_gather_common(ctx, group)
    else:
        backend.all_gather(ctx, group)


class _Views:
    """The views ``ViewsOf`` made, per flat variable and its viewers: (the flat
    variable's storage, the views)."""

    def __init__(self) -> None:
        self.made: dict[tuple[int, tuple[int, ...]], tuple[Any, list]] = {}


_VIEWS: RankVar[_Views] = RankVar("flat views", lambda ctx: _Views())


def _on_views_of(ctx: RankContext, message: ViewsOf) -> None:
    flat_var = REGISTRY.get(ctx).shared[message.flat]
    variables = _variables(ctx, message.uids)
    flat = _pytensor.value(flat_var)
    made, key = _VIEWS.get(ctx).made, (message.flat, message.uids)
    kept = made.get(key)
    if kept is not None and kept[0] is flat and all(
            _pytensor.value(var) is view for var, view in zip(variables, kept[1], strict=True)):
        return  # the usual case: nothing moved since the last step
    places: tuple[tuple[int, int, tuple[int, ...]], ...] = (
        message.places[ctx.rank] if message.by_rank else message.places)
    views: list[np.ndarray] = []
    for var, (start, stop, shape) in zip(variables, places, strict=True):
        view = flat[start:stop].reshape(shape)
        value = _pytensor.value(var)
        if value is not view and message.copy_in and not (
                kept is not None and kept[0] is flat and value is kept[1][len(views)]):
            view[...] = value
        _pytensor.bind(var, view)
        views.append(view)
    made[key] = (flat, views)


def _on_place(ctx: RankContext, message: Place) -> None:
    backend = BACKEND.get(ctx)
    buffer = backend.scratch(ctx, message.scratch)  # every rank maps what it names
    backend.spread_staged(ctx, message, buffer)
    if message.rank is not None and message.rank != ctx.rank:
        return
    for var, source, batch in zip(_variables(ctx, message.uids), message.sources,
                                  message.batches, strict=True):
        if isinstance(source, DataRef):  # a synk.Data: read in place
            whole = source.view(ctx)
        else:  # (offset, dtype, shape) in the scratch buffer
            offset, dtype, shape = source
            count = int(np.prod(shape, dtype=np.int64))
            whole = np.frombuffer(buffer, dtype, count, offset).reshape(shape)
        mine: Batch | None = batch
        if message.rank is None:
            mine = batch.part(ctx.size, ctx.rank)
        store_value(ctx, var, np.array(select_rows(whole, mine)))


def _write_region(ctx: RankContext, buffer: Any, variables: list, base: int) -> None:
    values = [host_value(ctx, var) for var in variables]
    layout = FusedLayout([v.dtype for v in values], [v.shape for v in values])
    for view, value in zip(layout.views(buffer, base), values, strict=True):
        np.copyto(view, value)


def _on_gather(ctx: RankContext, message: Gather) -> None:
    backend = BACKEND.get(ctx)
    buffer = backend.scratch(ctx, message.scratch)
    variables = _variables(ctx, message.uids)
    if message.everyone or not ctx.is_master:
        _write_region(ctx, buffer, variables, message.bases[ctx.rank])
    backend.share_regions(ctx, message, buffer, [var.type.dtype for var in variables])
    if not message.everyone:
        return
    if faults.ARMED:
        faults.hit("exchange")
    dtypes = [var.type.dtype for var in variables]
    regions = [FusedLayout(dtypes, shapes).views(buffer, base)
               for shapes, base in zip(message.shapes, message.bases, strict=True)]
    for i, var in enumerate(variables):
        store_value(ctx, var, np.concatenate([region[i] for region in regions]))


def _on_get_value(ctx: RankContext, message: GetValue) -> None:
    backend = BACKEND.get(ctx)
    buffer = backend.scratch(ctx, message.scratch)  # every rank maps what it names
    if ctx.rank == message.rank:
        _write_region(ctx, buffer, _variables(ctx, message.uids), 0)
    backend.collect_region(ctx, message, buffer)


def _with_points(handler: Callable[[RankContext, Any], Any]) -> Callable[[RankContext, Any], Any]:
    """A collective's handler passing the test fault points ``"collective"`` (before it
    moves data) and ``"exchange"`` (after, where its first barrier did not pass it)."""

    def run(ctx: RankContext, message: Any) -> Any:
        if faults.ARMED:
            faults.hit("collective")
        result = handler(ctx, message)
        if faults.ARMED:
            faults.hit("exchange")
        return result

    run.__name__ = run.__qualname__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


_RANK_PARTS: dict[type[Message], Callable[[RankContext, Any], Any]] = {
    Shapes: _on_shapes,
    Broadcast: _on_broadcast,
    AllReduce: _on_reduction,
    LowPrecisionReduce: _on_reduction,
    Reduce: _on_reduce,
    ReduceScatter: _on_reduce_scatter,
    AllGatherPieces: _on_all_gather_pieces,
    Place: _on_place,
    Gather: _on_gather,
    GetValue: _on_get_value,
    ViewsOf: _on_views_of,
}

HANDLERS: dict[type[Message], Callable[[RankContext, Any], Any]] = {
    kind: _with_points(handler) for kind, handler in _RANK_PARTS.items()
}


def reduce_lane(ctx: RankContext, message: AllReduce | LowPrecisionReduce
                ) -> Callable[[int, int], bool] | None:
    """A worker's shortcut for a reduction repeated (``Executor.lanes``: the same group,
    op and exchange again, an all-reduce between training steps): the primitive called
    and the reply written, nothing looked up, while the epoch it was made under stands
    (``_runtime/epoch.py``: a mapping dropped), passing the fault points its handler
    passes (``_with_points``). None for a message that maps a new group, or carries a
    setup or a wire."""
    replies = ctx.replies
    if (replies is None or ctx.rank == ctx.master_rank or message.spec is not None
            or (message.wire if isinstance(message, LowPrecisionReduce) else message.setup)
            is not None):
        return None
    backend, group = _reduction_group(ctx, message)
    master_rank, arena = ctx.master_rank, ctx.arena
    kept_under = epoch.current

    def run(seq: int, rank: int) -> bool:
        if epoch.current != kept_under:
            return False
        if faults.ARMED:
            faults.hit("collective")
        answer = _reduce(ctx, backend, group, message)
        if faults.ARMED:
            faults.hit("exchange")
        replies.finish(rank, seq, answer, False, master_rank, arena)
        return True

    return run
