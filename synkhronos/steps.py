"""Several function calls and collectives in one command: one round trip to the workers.

A training step is a gradient call, an all-reduce of the gradient, and an update call:
three commands, three wake-ups of every worker, three waits for the slowest. Run as
one command, the workers go from one step to the next without coming back to the
master::

    results = synk.steps.run([
        synk.steps.call(f_grad, x_data, y_data, batch=idx),
        synk.steps.all_reduce(grad_shared, op="sum"),
        synk.steps.call(f_update),
    ])
    loss = results[0]

Each item is described here and built when ``run`` holds the session (so staging from
several threads never interleaves); each result is what the same call or collective
would have returned on its own. If any process raises in any step, every process stops
at that step and the master raises it, as for a single call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._balance import Balancer
from ._core.session import Session, require
from ._pytensor import value
from .collectives import fused
from .collectives._checks import FRONT, begin, low_precision, reduce_op
from .collectives.backend import FusedLayout, even_piece_length
from .function import Function

__all__ = ["Step", "Balancer", "call", "all_reduce", "reduce_scatter", "all_gather_pieces", "views",
           "piece_view", "pieces", "piece_length", "run"]


class Step:
    """One call or collective, described; built and run by :func:`run`."""

    def __init__(self, build: Callable[[Session], fused.Step], what: str):
        self._build = build
        self.what = what

    def __repr__(self) -> str:
        return f"<synk step {self.what}>"


def call(function: Function, *args: Any, output_subset: Any = None, batch: Any = None,
         batch_s: Any = None, num_slices: int = 1, shares: Any = None, chunks: Any = None,
         timings: Callable[[list[tuple[int, float] | None]], None] | None = None,
         **kwargs: Any) -> Step:
    """A call of ``function`` with these arguments (as ``function(*args, ...)``;
    ``chunks`` as there: the rows taken in chunks as the processes come free).

    ``timings``: called once the step has run, with each process's ``(rows,
    seconds)`` in rank order (the seconds it took to gather its rows and run the
    function; None for a process that ran nothing): what balancing rows by measured
    speed (``shares``) needs. It costs two clock readings per process. A
    :class:`Balancer` closes the loop: ``call(f, ..., shares=b.shares(),
    timings=b.record)``.
    """
    if not isinstance(function, Function):
        raise TypeError(f"steps.call takes a synk.Function; got {type(function).__name__}")
    if timings is not None and not callable(timings):
        raise TypeError(f"timings must be a callable or None; got {type(timings).__name__}")

    def build(session: Session) -> fused.Step:
        message, finish = function.prepare(args, kwargs, output_subset, batch, batch_s,
                                           num_slices, shares, chunks,
                                           timings=timings is not None)
        if timings is None:
            return fused.Step(message, finish, repeats=message.batch_s is None)

        def with_timings(replies: list) -> Any:
            result = finish(replies)  # raises first if the call failed
            timings([None if reply is None else (reply[0], float(reply[2][0] + reply[2][1]))
                     for reply in replies])
            return result

        return fused.Step(message, with_timings, repeats=message.batch_s is None)

    return Step(build, f"call {function.name or 'function'}")


def all_reduce(shared_vars: Any, op: str = "avg", exchange: str | None = None) -> Step:
    """``synk.all_reduce(shared_vars, op, exchange=exchange)``, as a step."""
    session, front, targets, _ = begin("all_reduce", shared_vars)
    parsed = reduce_op(op, targets)
    rounding = low_precision(exchange, parsed, targets)
    if rounding is not None:
        return Step(lambda s: fused.low_precision_step(s, front.backend, targets, parsed,
                                                       rounding, scatter=False),
                    f"all_reduce exchange={rounding.value}")
    return Step(lambda s: fused.all_reduce_step(s, front.backend, targets, parsed,
                                                standalone=False), "all_reduce")


def reduce_scatter(shared_vars: Any, op: str = "sum", exchange: str | None = None) -> Step:
    """Each process gets its piece of the combined values (the pieces of the list's
    fused buffer, ``FusedLayout.pieces``); the rest of its values are left undefined.

    With :func:`all_gather_pieces` after it, the same as ``all_reduce``; between the two,
    each process may work on its own piece only (a sharded optimizer update).
    ``exchange`` (``"bf16"``, ``"fp16"``): the values are rounded before the exchange and
    the pieces summed in float32, as ``synk.all_reduce(..., exchange=...)`` does.
    """
    session, front, targets, _ = begin("reduce_scatter", shared_vars)
    parsed = reduce_op(op, targets)
    rounding = low_precision(exchange, parsed, targets)
    if rounding is not None:
        return Step(lambda s: fused.low_precision_step(s, front.backend, targets, parsed,
                                                       rounding, scatter=True),
                    f"reduce_scatter exchange={rounding.value}")
    return Step(lambda s: fused.reduce_scatter_step(s, front.backend, targets, parsed),
                "reduce_scatter")


def all_gather_pieces(shared_vars: Any, common: bool = False) -> Step:
    """Every process's own piece (as :func:`reduce_scatter` cut them) to every process.

    ``common``: on one machine's CPU cores, every process's variables are left views of
    one buffer that all of them share (the master's exchange slot): a process's piece
    is copied there once, and not at all where its variables already view it (its
    piece updated in place there, :func:`piece_view`), and every process reads the
    result where it lies instead of copying the other pieces. Until the next
    collective on them, the variables must then be written only in their own process's
    piece, as a sharded update writes them: a write elsewhere is seen by every
    process. Where values cannot share memory (``device="gpu"``, several machines) it
    is the plain all-gather.
    """
    session, front, targets, _ = begin("all_gather_pieces", shared_vars)
    return Step(lambda s: fused.all_gather_pieces_step(s, front.backend, targets, common),
                f"all_gather_pieces common={common}")


def _need_views(session: Session, name: str) -> None:
    """``ValueError`` where the session's values cannot view one another in place."""
    if not session.ctx.placement.views:
        raise ValueError(
            f"steps.{name} needs values that can view one another in place; on "
            f"device={session.ctx.device!r} they are JAX arrays, which cannot"
        )


def views(flat: Any, variables: Sequence[Any], copy_in: bool = True) -> Step:
    """Each process's ``variables`` become views of their places in its ``flat``.

    ``flat`` is a 1-d shared variable laid out as ``variables`` flattened and
    concatenated, in order, of their dtype. Afterwards, writing ``flat`` (an
    ``all_gather_pieces``, an update in place) changes the variables without a copy.
    ``copy_in``: a variable that does not view its place (a first step, or a value
    set since) first gives its value to ``flat``; otherwise ``flat`` wins.
    Only on ``device="cpu"`` (``ValueError`` elsewhere: JAX arrays view nothing).
    """
    session, front, targets, _ = begin("views", [flat, *variables])
    _need_views(session, "views")
    dtype = targets.dtypes[0]
    if targets.ndims[0] != 1 or any(d != dtype for d in targets.dtypes):
        raise ValueError("steps.views needs a 1-d flat variable and variables of its dtype")
    return Step(lambda s: fused.views_step(s, front, flat, tuple(variables), copy_in),
                "views")


def piece_view(flat: Any, variable: Any, copy_in: bool = False) -> Step:
    """Each process's ``variable`` becomes a view of its own piece of ``flat`` (the
    piece :func:`reduce_scatter` leaves it, as :func:`pieces` gives it).

    A function that updates ``variable`` in place then writes the process's piece of
    ``flat`` without a copy (a sharded optimizer's update: PyTensor runs an elementwise
    update of a shared variable in place on its storage). ``copy_in``: a ``variable``
    that does not view its piece (an update that was not made in place) first gives
    its value to the piece; otherwise ``flat`` wins. ``flat`` and ``variable`` are 1-d,
    of one dtype. Only on ``device="cpu"`` (``ValueError`` elsewhere: JAX arrays view
    nothing).
    """
    session, front, targets, _ = begin("piece_view", [flat, variable])
    _need_views(session, "piece_view")
    if targets.ndims != (1, 1) or targets.dtypes[0] != targets.dtypes[1]:
        raise ValueError(f"steps.piece_view needs two 1-d variables of one dtype; got "
                         f"{targets.labels}")
    bounds = pieces(flat)
    return Step(lambda s: fused.piece_view_step(s, front, flat, variable, bounds, copy_in),
                f"piece_view copy_in={copy_in}")


def pieces(shared_var: Any) -> list[tuple[int, int]]:
    """``(start, stop)`` of each process's piece of a 1-d shared variable, by rank: the
    pieces :func:`reduce_scatter` and :func:`all_gather_pieces` cut it into (about
    equal, on cache-line boundaries; a piece may be empty)."""
    session, front, targets, _ = begin("pieces", shared_var)
    if targets.ndims != (1,):
        raise ValueError(f"steps.pieces takes one 1-d shared variable; got {targets.labels}")
    layout = FusedLayout(targets.dtypes, [value(targets.variables[0]).shape])
    bounds, end = [], 0
    for mine in layout.pieces(session.n):
        start, end = (mine[0][1], mine[0][2]) if mine else (end, end)  # empty: where it is
        bounds.append((start, end))
    return bounds


def piece_length(size: int, dtype: Any) -> int:
    """The length ``L`` of every process's piece of a 1-d vector of ``size`` elements of
    ``dtype`` padded to ``n * L``: ``ceil(size / n)`` rounded up to whole cache lines
    (64 bytes).

    :func:`reduce_scatter`, :func:`all_gather_pieces` and :func:`pieces` cut a 1-d
    shared variable of ``n * L`` elements into exactly ``[r * L, (r + 1) * L)`` for
    rank ``r``: every piece has one length, as a function compiled for static shapes
    (JAX, ``device="gpu"``) needs. The padding is the vector's tail.
    """
    session = require("synk.steps.piece_length()")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"steps.piece_length needs a size >= 1; got {size!r}")
    return even_piece_length(int(size), session.n, dtype)


def run(steps: Sequence[Step]) -> list[Any]:
    """Run ``steps`` in order, in one command; return each one's result.

    Collective: every process takes part; returns when all have finished.

    Raises
    ------
    TypeError, ValueError
        As each step would raise on its own, before any process moves.
    synkhronos.WorkerError
        A process raised in some step (every process stopped at that step).
    """
    if not steps:
        return []
    for i, step in enumerate(steps):
        if not isinstance(step, Step):
            raise TypeError(f"steps[{i}] is not a step of synkhronos.steps; got {step!r}")
    session = require("synk.steps.run()")
    backend = FRONT.get(session.ctx).backend
    took = session.enter()
    try:
        built = [step._build(session) for step in steps]
        return fused.run_steps(session, backend, built)
    finally:
        session.leave(took)
