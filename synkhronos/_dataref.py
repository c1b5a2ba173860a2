"""DataRef: how any process finds a ``Data``'s memory, and how the owner lets it go.

A command never carries a ``Data`` itself, only its ``DataRef`` -- segment name,
dtype, shape: a few bytes. Any process turns a ref into a numpy view of the segment
through its arena (``ref.view(ctx)``), which maps each segment once. The views a loop
of calls keeps are cached per process (``call_view``) and dropped whenever the
process's epoch moves on (``_runtime/epoch.py``: the arena dropped a mapping, among
others), so no view keeps released memory.

The owner's side is ``allocate``: a new segment from the arena, with the finalizer
(``release_segment``) that unlinks it and logs the release for every worker when the
owner -- a ``Data``, or a call's staging buffer (``_staging.py``) -- frees it, moves to
a new one, or is collected; and ``publish``, which sends the owner's writes to the other
machines' replicas (over several machines).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, NamedTuple

import numpy as np
import posix_ipc

from ._core import context
from ._core.context import RankContext, RankVar
from ._runtime import epoch, shmem
from ._runtime.arena import Segment

__all__ = ["DataRef", "allocate", "call_view", "publish", "release_segment"]


class DataRef(NamedTuple):
    """What a command carries for one ``Data``: enough for any process to view it.

    Attributes
    ----------
    segment
        Name of the shared-memory segment; ``""`` when the data has zero items.
    dtype
        The numpy dtype, as ``np.dtype(...).str`` (for example ``"<f4"``).
    shape
        The visible shape; its items are the leading items of the segment.
    """

    segment: str
    dtype: str
    shape: tuple[int, ...]

    def view(self, ctx: RankContext | None = None) -> np.ndarray:
        """A writable, C-contiguous array over the segment (no copy).

        Parameters
        ----------
        ctx
            The calling process's context (default: the current one). Its arena keeps
            the mapping, so each process maps a segment once; without a session the
            segment is mapped afresh.

        Raises
        ------
        FileNotFoundError
            The segment no longer exists: its ``Data`` was freed or reallocated, or its
            session was closed.
        """
        if not self.segment:
            return np.empty(self.shape, self.dtype)
        if ctx is None:
            ctx = context.current()
        return shmem.array_view(mapping(self.segment, ctx), self.dtype, self.shape)


def mapping(segment: str, ctx: RankContext | None) -> Any:
    """This process's mapping of ``segment``: the arena's, or a fresh one."""
    try:
        if ctx is None:
            return shmem.open_segment(segment)
        return ctx.arena.map(segment)
    except posix_ipc.ExistentialError as exc:
        raise FileNotFoundError(
            f"shared-memory segment {segment!r} does not exist: its Data was freed or "
            "reallocated, or its session was closed"
        ) from exc


class _Views:
    """The last view of each segment this process made for calls, valid while the
    epoch stays (the arena keeps every mapping it had, among others)."""

    def __init__(self) -> None:
        self.epoch = -1
        self.by_segment: dict[str, tuple[DataRef, np.ndarray]] = {}


_VIEWS: RankVar[_Views] = RankVar("data views", lambda ctx: _Views())


def call_view(ref: DataRef, ctx: RankContext) -> np.ndarray:
    """``ref.view(ctx)``, kept per segment: a loop of calls views its inputs once.

    The array is shared by every caller in this process: use its items, never change
    its shape in place.
    """
    views = _VIEWS.get(ctx)
    if views.epoch != epoch.current:
        views.by_segment.clear()
        views.epoch = epoch.current
    cached = views.by_segment.get(ref.segment)
    if cached is not None and cached[0] == ref:
        return cached[1]
    array = ref.view(ctx)
    if ctx.arena.owns(ref.segment):  # only these are ever released through the arena
        views.by_segment[ref.segment] = (ref, array)
    return array


def allocate(owner: Any, session: Any, nbytes: int) -> tuple[Segment, weakref.finalize]:
    """A new segment of ``nbytes`` for ``owner`` (in the master), and the finalizer that
    releases it: call it to free the segment; it runs by itself when ``owner`` is
    collected, and does nothing once the session is closed (its sweep took the rest)."""
    ctx = session.ctx
    segment = ctx.arena.create(nbytes)
    release = weakref.finalize(owner, release_segment, ctx, segment.id, os.getpid(),
                               session.is_closed)
    return segment, release


def publish(session: Any, segment: str, buffer: Any, view: np.ndarray,
            rows: list[tuple[int, int]] | None = None) -> None:
    """Over several machines: ``view``'s values, the first bytes of ``buffer`` (the
    mapping of ``segment``), to every other machine's replica of ``segment``
    (``rows``: each machine only these rows of ``view``)."""
    if rows is None:
        values = np.frombuffer(buffer, np.uint8, view.nbytes)
        session.replicate(lambda transport: transport.publish_values(segment, values))
    else:
        session.replicate(lambda transport: transport.publish_rows(segment, view, rows))


def release_segment(ctx: RankContext, segment_id: int, pid: int, closed: Any) -> None:
    """Release one allocation (``allocate``'s finalizer: holds no reference to its owner).

    Does nothing in a process other than the owner (a fork inherits the finalizer),
    or once the session is closed (``closed()`` true: the sweep took everything).
    """
    if os.getpid() != pid or closed():
        return
    ctx.arena.release(segment_id)
