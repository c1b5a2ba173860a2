"""Collectives on shared variables, the same on every backend: messages, and the master's
steps.

A collective on a list of shared variables travels as one fused buffer. This module
owns what is the same on every backend:

- the typed messages (``Shapes``, ``Broadcast``, ``AllReduce``, ``LowPrecisionReduce``,
  ``Reduce``, ``ReduceScatter``, ``AllGatherPieces``, ``Place``, ``Gather``,
  ``GetValue``);
- the master's half of each collective: a ``Step`` (the message, the buffers it
  introduces, and ``finish``, which turns the ranks' replies into the result or the
  error), built without running it, so that a training step can run several in one
  command (``run_steps``);
- each rank's half runs in ``ranks.py``.

Which backend runs (``backend.py``: shared memory, staged device values, NCCL,
several machines) was chosen once per process from its context; nothing here asks.

Per-rank example: ``all_reduce([w, b], op="sum")`` at two ranks builds one group for
``(w, b)``; on CPU each rank copies the parts of ``w`` and ``b`` the other rank
reduces into its slot, both vote, each sums its half of both slots into its own slot,
then copies the other half from the other's slot; ``w`` and ``b`` of each rank now
view its slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _pytensor
from .._core.context import RankContext
from .._core.protocol import Message
from .._core.protocol import Sequence as SequenceMessage
from .._core.session import Session
from .._reducers import ReduceOp
from .._runtime import epoch
from .._runtime.lowprec import Exchange
from .backend import (
    Backend,
    FusedLayout,
    Group,
    GroupSpec,
    Targets,
    host_value,
)

__all__ = ["Repeat", "Step", "run_step", "run_steps", "Mismatch"]


# -- messages ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes(Message):
    uids: tuple[int, ...]


@dataclass(frozen=True)
class Broadcast(Message):
    key: int
    spec: GroupSpec | None
    setup: Any = None  # the backend's, once (``Backend.setup``)


@dataclass(frozen=True)
class AllReduce(Message):
    key: int
    spec: GroupSpec | None
    op: ReduceOp
    pair: bool  # two ranks, small: the worker alone combines (no barrier)
    setup: Any = None  # the backend's, once (``Backend.setup``)


@dataclass(frozen=True)
class LowPrecisionReduce(Message):
    """``all_reduce`` (``scatter``: ``reduce_scatter``) of float32 values rounded to
    ``exchange``'s 16 bits before the exchange (the backend's ``low_precision_*``)."""

    key: int
    spec: GroupSpec | None
    wire: str | None  # the group's 16-bit buffers, named in the first command using them
    op: ReduceOp
    exchange: Exchange
    scatter: bool


@dataclass(frozen=True)
class Reduce(Message):
    key: int
    spec: GroupSpec | None
    op: ReduceOp
    in_place: bool
    scratch: str | None  # the result goes there too (not in place: the master reads it)


@dataclass(frozen=True)
class ReduceScatter(Message):
    key: int
    spec: GroupSpec | None
    op: ReduceOp


@dataclass(frozen=True)
class AllGatherPieces(Message):
    key: int
    spec: GroupSpec | None
    common: bool = False  # every rank's variables left viewing one buffer (see steps)


@dataclass(frozen=True)
class Place(Message):
    """``scatter`` (``rank`` None: every rank its block) or ``set_value`` (one rank)."""

    scratch: str
    uids: tuple[int, ...]
    sources: tuple  # per variable: a DataRef, or (offset, dtype, shape) in the scratch
    batches: tuple  # per variable: a Batch, or None (all rows)
    rank: int | None


@dataclass(frozen=True)
class Gather(Message):
    """Every rank's values into its region of the scratch (``everyone``: then every
    rank concatenates them all, ``all_gather``)."""

    scratch: str
    uids: tuple[int, ...]
    bases: tuple[int, ...]
    shapes: tuple  # per rank, per variable
    everyone: bool


@dataclass(frozen=True)
class GetValue(Message):
    scratch: str
    uids: tuple[int, ...]
    rank: int
    nbytes: int = 0  # the region's size (what travels from another machine)


@dataclass(frozen=True)
class ViewsOf(Message):
    """Each variable's storage becomes a view of its place in the flat variable."""

    flat: int  # uid of the flat variable
    uids: tuple[int, ...]
    # (start, stop, shape) of each variable; by_rank: one such tuple per rank (its piece)
    places: tuple[Any, ...]
    copy_in: bool  # a variable not viewing its place gives its value to the flat one
    by_rank: bool = False


@dataclass(frozen=True)
class Mismatch:
    """A rank's reply when its shapes differ from the master's (nothing changed)."""

    shapes: tuple[tuple[int, ...], ...]


# -- the master's half --------------------------------------------------------------------
@dataclass
class Step:
    """One collective's command, built but not run."""

    message: Message
    finish: Callable[[list], Any] = lambda replies: None
    new: tuple[str, ...] = ()  # buffers this command introduces (mapped by every rank)
    repeats: bool = False  # the same message is likely to come again
    group: Group | None = None  # the group of a step kept for repeated calls (its master's)


class Repeat:
    """The master's record of the last ``all_reduce`` on more than one process: its
    arguments as given, what they resolved to, and the step it ran last. A call with
    the same variables (the same objects, in the same order) and the same op (the same
    object: a literal or the default) is the same call (the all-reduce between a
    training loop's steps): it skips the checks the first one passed and, while the
    group of those variables is still current (the master's values in its slots, no
    new layout), the step's lookup too. The last exact all-reduce and the last
    low-precision one are kept apart (``Front.repeat``, ``Front.rounded``), the latter
    with its ``exchange`` as given, which a repeat must give again (the same object)."""

    def __init__(self, given: Any, single: bool, op: Any, targets: Targets,
                 parsed: ReduceOp, exchange: Any = None,
                 rounding: Exchange | None = None) -> None:
        self.items = (given,) if single else tuple(given)
        self.single = single
        self.op = op
        self.targets = targets
        self.parsed = parsed
        self.exchange = exchange  # as given
        self.rounding = rounding  # parsed: None for the exact exchange
        self.last: Step | None = None

    def matches(self, shared_vars: Any, op: Any) -> bool:
        if op is not self.op:
            return False
        items = self.items
        if self.single:
            return shared_vars is items[0]
        if type(shared_vars) not in (list, tuple) or len(shared_vars) != len(items):
            return False
        i = 0
        for item in shared_vars:  # (a list may have changed since: each is looked at)
            if item is not items[i]:
                return False
            i += 1
        return True

    def step(self, session: Session, backend: Backend) -> Step:
        """The step to run now (the caller holds the command lock): the last one while
        its group is current, else ``all_reduce_step``'s (``low_precision_step``'s)."""
        step = self.last
        if step is None or backend.current(session.ctx, self.targets) is not step.group:
            if self.rounding is None:
                step = all_reduce_step(session, backend, self.targets, self.parsed)
            else:
                step = low_precision_step(session, backend, self.targets, self.parsed,
                                          self.rounding, scatter=False)
            self.last = step if step.group is not None else None  # (None: not kept)
        return step


def run_steps(session: Session, backend: Backend, steps: Sequence[Step],
              extra: Sequence[Message] = ()) -> list[Any]:
    """Run ``steps`` (and ``extra`` messages after them) in one command, the caller
    holding the session's command lock; each step's finished result, in order
    (``extra`` replies come back unfinished)."""
    if len(steps) == 1 and not extra:
        return [run_step(session, backend, steps[0])]
    ctx = session.ctx
    new = tuple(name for step in steps for name in step.new)
    message = SequenceMessage(tuple(step.message for step in steps) + tuple(extra))
    repeats = all(step.repeats for step in steps) and not extra
    try:
        replies = session.run_held(message, repeats=repeats)
    except BaseException:
        if new:
            backend.discard(ctx, new)
        raise
    if new:
        backend.settle(ctx, new)
    per_step = [[reply[i] if reply is not None else None for reply in replies]
                for i in range(len(steps) + len(extra))]
    results = [step.finish(r) for step, r in zip(steps, per_step, strict=False)]
    return results + per_step[len(steps):]


def run_step(session: Session, backend: Backend, step: Step) -> Any:
    """Run one step as its own command (the caller holds the session's command lock);
    its finished result."""
    try:
        replies = session.run_held(step.message, repeats=step.repeats)
    except BaseException:
        if step.new:
            backend.discard(session.ctx, step.new)
        raise
    if step.new:
        backend.settle(session.ctx, step.new)
    return step.finish(replies)


def _raise_mismatch(targets: Targets, replies: list, expected: tuple) -> None:
    """Raise the ValueError of a reduce refused because shapes differ across ranks."""
    for reply in replies:
        if type(reply) is Mismatch:
            break
    else:
        return
    per_rank = [reply.shapes if isinstance(reply, Mismatch) else expected for reply in replies]
    for i, label in enumerate(targets.labels):
        if len({shapes[i] for shapes in per_rank}) > 1:
            got = ", ".join(f"{shapes[i]} in rank {r}" for r, shapes in enumerate(per_rank))
            raise ValueError(
                f"reduce and all_reduce need {label} to have the same shape in every "
                f"process; got {got} (use gather or all_gather for values whose "
                f"shapes differ)"
            )


def _group_for(ctx: RankContext, backend: Backend, targets: Targets
               ) -> tuple[Group, GroupSpec | None, bool]:
    """The group of ``targets`` laid out for the master's shapes, its spec if it is
    new, and whether the master's values are already where the group keeps them."""
    group = backend.current(ctx, targets)
    if group is not None:
        return group, None, True
    shapes = tuple(_pytensor.value(var).shape for var in targets.variables)
    return (*backend.resident(ctx, targets, shapes), False)


def shapes_step(targets: Targets) -> Step:
    return Step(Shapes(targets.uids), finish=lambda replies: replies)


def broadcast_step(session: Session, backend: Backend, targets: Targets,
                   values: list | None) -> Step:
    ctx = session.ctx
    if values is None:
        shapes = tuple(_pytensor.value(var).shape for var in targets.variables)
    else:
        shapes = tuple(value.shape for value in values)
    group, spec = backend.resident(ctx, targets, shapes)
    backend.stage_broadcast(ctx, group, values)
    return Step(Broadcast(group.key, spec, backend.setup(ctx)),
                new=(spec.name,) if spec else ())


def all_reduce_step(session: Session, backend: Backend, targets: Targets, op: ReduceOp,
                    standalone: bool = True) -> Step:
    """``standalone``: the command is this collective alone, so a two-rank small group
    may skip the barrier (the master finishes after the command)."""
    ctx = session.ctx
    group, spec, resident = _group_for(ctx, backend, targets)
    pair = standalone and group.pair
    key = (op, pair, targets.labels)
    if spec is None:  # the same step as last time, built once (its message posted again)
        step = group.steps.get(key)
        if step is not None:
            if pair and not resident:
                backend.pair_copies(ctx, group, resident)  # (the same copies after it)
            return step
    # pair: the worker leaves the result in its slot, the master copies it into its own.
    # Else each rank loads its values inside the command, so the step is the same
    # whether the master's values still lie in its slot or not (beyond two processes a
    # small group's results are new arrays: the others may still read the slot).
    copies = backend.pair_copies(ctx, group, resident) if pair else []
    shapes = group.layout.shapes

    def finish(replies: list) -> None:
        if replies.count(None) != len(replies):
            _raise_mismatch(targets, replies, shapes)
        for view, result in copies:
            view[...] = result

    setup = backend.setup(ctx)
    message = AllReduce(group.key, spec, op, pair, setup)
    if spec is None and setup is None and epoch.REPLAY:
        step = group.steps[key] = Step(message, finish, repeats=True, group=group)
        return step
    return Step(message, finish, new=(spec.name,) if spec else ())


def low_precision_step(session: Session, backend: Backend, targets: Targets, op: ReduceOp,
                       exchange: Exchange, scatter: bool) -> Step:
    """``all_reduce`` (``scatter``: ``reduce_scatter``) with each rank's values rounded
    to ``exchange`` for the exchange (the caller checked: float32 values, ``sum`` or
    ``avg``). Kept on the group for repeated calls, under a key of its own: the exact
    step and the other format's are never taken for it."""
    ctx = session.ctx
    group, spec, _ = _group_for(ctx, backend, targets)
    wire = backend.wire(ctx, group)
    key = (exchange, op, scatter, targets.labels)
    if spec is None and wire is None:
        step = group.steps.get(key)
        if step is not None:
            return step
    shapes = group.layout.shapes

    def finish(replies: list) -> None:
        if replies.count(None) != len(replies):
            _raise_mismatch(targets, replies, shapes)

    message = LowPrecisionReduce(group.key, spec, wire, op, exchange, scatter)
    new = tuple(name for name in (spec.name if spec else None, wire) if name is not None)
    if not new and epoch.REPLAY:
        step = group.steps[key] = Step(message, finish, repeats=True, group=group)
        return step
    return Step(message, finish, new=new)


def reduce_step(session: Session, backend: Backend, targets: Targets, op: ReduceOp,
                in_place: bool) -> Step:
    ctx = session.ctx
    group, spec, _ = _group_for(ctx, backend, targets)
    shapes = group.layout.shapes
    scratch: str | None = None
    new: tuple[str, ...] = ()
    if not in_place or backend.reduce_through_scratch:
        buffer, name = backend.regions(ctx, group.layout.total)
        scratch = backend.scratch_name
        new = (name,) if name else ()
    new = ((spec.name,) if spec else ()) + new

    def finish(replies: list) -> list[np.ndarray] | None:
        _raise_mismatch(targets, replies, shapes)
        if in_place:
            return None
        assert scratch is not None
        return [np.array(view) for view in group.layout.views(backend.scratch(ctx, scratch))]

    return Step(Reduce(group.key, spec, op, in_place, scratch), finish, new=new)


def place_step(session: Session, backend: Backend, targets: Targets, values: list,
               batches: tuple, rank: int | None) -> Step:
    """Stage ``values`` (arrays, or Data read in place) for ``scatter``/``set_value``."""
    ctx = session.ctx
    staged = [i for i, v in enumerate(values) if isinstance(v, np.ndarray)]
    layout = FusedLayout([values[i].dtype for i in staged], [values[i].shape for i in staged])
    buffer, name = backend.regions(ctx, layout.total)
    sources: list[Any] = [value if i in staged else value.ref() for i, value in enumerate(values)]
    for j, (i, view) in enumerate(zip(staged, layout.views(buffer), strict=True)):
        np.copyto(view, values[i])
        sources[i] = (layout.offsets[j], view.dtype.str, view.shape)
    message = Place(backend.scratch_name, targets.uids, tuple(sources), batches, rank)
    return Step(message, new=(name,) if name else ())


def regions_step(session: Session, backend: Backend, targets: Targets, shapes: list,
                 everyone: bool) -> Step:
    """``gather`` (to the master) or ``all_gather`` (``everyone``) of per-rank values."""
    ctx = session.ctx
    layouts = [FusedLayout(targets.dtypes, rank_shapes) for rank_shapes in shapes]
    bases, end = [], 0
    for layout in layouts:
        bases.append(end)
        end += -(-layout.total // 4096) * 4096
    buffer, name = backend.regions(ctx, end)
    message = Gather(backend.scratch_name, targets.uids, tuple(bases),
                     tuple(tuple(s) for s in shapes), everyone)

    def finish(replies: list) -> list[list[np.ndarray]]:
        master = ctx.master_rank
        per_rank = [
            [host_value(ctx, var) for var in targets.variables] if rank == master
            else layout.views(buffer, base)
            for rank, (layout, base) in enumerate(zip(layouts, bases, strict=True))
        ]
        return [[values[i] for values in per_rank] for i in range(len(targets.uids))]

    return Step(message, finish, new=(name,) if name else ())


def views_step(session: Session, front: Any, flat: Any, variables: tuple,
               copy_in: bool) -> Step:
    """Each variable becomes a view of its place in ``flat`` (see ``ViewsOf``)."""
    reg = front.registry
    places, start = [], 0
    for var in variables:
        shape = tuple(_pytensor.value(var).shape)
        size = int(np.prod(shape, dtype=np.int64))
        places.append((start, start + size, shape))
        start += size
    message = ViewsOf(reg.uid(flat), tuple(reg.uid(var) for var in variables),
                      tuple(places), copy_in)
    return Step(message, repeats=True)


def piece_view_step(session: Session, front: Any, flat: Any, variable: Any,
                    pieces: list[tuple[int, int]], copy_in: bool) -> Step:
    """On each rank, ``variable`` becomes a view of its piece ``pieces[rank]`` of
    ``flat`` (see ``ViewsOf``)."""
    reg = front.registry
    places = tuple(((start, stop, (stop - start,)),) for start, stop in pieces)
    return Step(ViewsOf(reg.uid(flat), (reg.uid(variable),), places, copy_in, by_rank=True),
                repeats=True)


def get_value_step(session: Session, backend: Backend, targets: Targets, rank: int,
                   shapes: list) -> Step:
    ctx = session.ctx
    layout = FusedLayout(targets.dtypes, shapes)
    buffer, name = backend.regions(ctx, layout.total)

    def finish(replies: list) -> list[np.ndarray]:
        return [np.array(view) for view in layout.views(buffer)]

    return Step(GetValue(backend.scratch_name, targets.uids, rank, layout.total), finish,
                new=(name,) if name else ())


def reduce_scatter_step(session: Session, backend: Backend, targets: Targets,
                        op: ReduceOp) -> Step:
    """Each rank's piece (``FusedLayout.pieces``) of the combined values, in its slot."""
    ctx = session.ctx
    group, spec, _ = _group_for(ctx, backend, targets)
    shapes = group.layout.shapes
    return Step(ReduceScatter(group.key, spec, op),
                lambda replies: _raise_mismatch(targets, replies, shapes),
                new=(spec.name,) if spec else (), repeats=spec is None)


def all_gather_pieces_step(session: Session, backend: Backend, targets: Targets,
                           common: bool = False) -> Step:
    """Every rank's piece of its slot into every slot (after ``reduce_scatter_step``);
    ``common``: into one buffer every rank's variables view."""
    ctx = session.ctx
    group, spec, _ = _group_for(ctx, backend, targets)
    return Step(AllGatherPieces(group.key, spec, common), new=(spec.name,) if spec else (),
                repeats=spec is None)
