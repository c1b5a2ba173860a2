"""DataRef: how any process finds a ``Data``'s memory, and lets go of it.

A command never carries a ``Data`` itself, only its ``DataRef`` -- segment name,
dtype, shape: a few bytes. This module owns the other side of that: each process's
mapping of a segment (the owner's own mapping in the master, else the session's
segment cache, which maps a name once), the views a loop of calls keeps
(``call_view``), and the release of a segment once its ``Data`` is freed, reallocated
or collected (``_release_segment``: unlink the name, drop the master's mapping and
views, and have every worker drop its own with the next command).
"""

from __future__ import annotations

import mmap
import os
from typing import NamedTuple

import numpy as np
import posix_ipc

from . import session as synk_session
from ._runtime import shmem

__all__ = ["DataRef", "call_view"]

_OWNED = "synkhronos.data.owned"  # session.local: segment name -> the owner's mapping


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

    def view(self, session: synk_session.Session | None = None) -> np.ndarray:
        """A writable, C-contiguous array over the segment (no copy).

        Parameters
        ----------
        session
            The session of the calling process (default: the current one). Its segment
            cache keeps the mapping, so each process maps a segment once; without a
            session the segment is mapped afresh.

        Raises
        ------
        FileNotFoundError
            The segment no longer exists: its ``Data`` was freed or reallocated, or its
            session was closed.
        """
        if not self.segment:
            return np.empty(self.shape, self.dtype)
        if session is None:
            session = synk_session.current()
        return shmem.array_view(_mapping(self.segment, session), self.dtype, self.shape)


def call_view(ref: DataRef, session: synk_session.Session) -> np.ndarray:
    """``ref.view(session)``, kept per segment: a loop of calls views its inputs once.

    The array is shared by every caller in this process: use its items, never change
    its shape in place. It goes when the segment is released (``SegmentCache.forget``).
    """
    cached = session.segments.views.get(ref.segment)
    if cached is not None and cached[0] == ref:
        return cached[1]
    array = ref.view(session)
    if ref.segment.startswith(session.prefix):  # only these are ever forgotten
        session.segments.views[ref.segment] = (ref, array)
    return array


def _mapping(segment: str, session: synk_session.Session | None) -> mmap.mmap:
    """This process's mapping of ``segment``: the owner's own, cached, or a new one."""
    try:
        if session is None or not segment.startswith(session.prefix):
            return shmem.open_segment(segment)
        if session.is_master:
            owned = session.local(_OWNED, dict).get(segment)
            if owned is not None:
                return owned
        return session.segments.get(segment)
    except posix_ipc.ExistentialError as exc:
        raise FileNotFoundError(
            f"shared-memory segment {segment!r} does not exist: its Data was freed or "
            "reallocated, or its session was closed"
        ) from exc


def _release_segment(session: synk_session.Session, segment: str, pid: int) -> None:
    """Unlink ``segment`` and have every process drop its mapping (a finalizer).

    Holds no reference to the ``Data``, so it can run when the ``Data`` is collected.
    Does nothing in a process other than the owner (a fork inherits the finalizer).
    """
    if os.getpid() != pid:
        return
    session.local(_OWNED, dict).pop(segment, None)
    session.segments.forget(segment)
    shmem.unlink_segment(segment)
    session.release_later(segment)
