"""A worker's main: wait for a command, run its handler, report, repeat.

The loop never dies of a handler's exception: the exception becomes a
``RemoteFailure`` in this rank's reply slot, the rank marks the command done, and the
master raises it as ``WorkerError``. Every process therefore reaches the end of every
command and stays in step. The loop leaves on ``EXIT`` or when the master is gone.
"""

from __future__ import annotations

from functools import partial

from ._runtime.control import ControlBlock
from ._runtime.remote import RemoteFailure
from .session import Opcode, Session, handler_for

__all__ = ["main"]


def _is_new(control: ControlBlock, seen: int) -> bool:
    return control.seq != seen


def main(session: Session, rank: int) -> None:
    """Run worker ``rank`` until the master says ``EXIT`` (called in the forked child)."""
    session.become_worker(rank)
    control = session.control
    master = session.master_rank
    seen = session.forked_seq  # not control.seq: the master may have posted already
    while True:
        control.wait(rank, partial(_is_new, control, seen), session._watch_master)
        seen = control.seq
        try:
            opcode, (releases, payload) = control.read_command()
        except Exception as exc:  # e.g. a class this process cannot import
            control.finish(rank, seen, RemoteFailure.from_exception(exc), True, master)
            continue
        for name in releases:
            session.segments.forget(name)
        if opcode == Opcode.EXIT:
            return
        try:
            reply, failed = handler_for(opcode)(session, payload), False
        except Exception as exc:
            reply, failed = RemoteFailure.from_exception(exc), True
        try:
            control.finish(rank, seen, reply, failed, master)
        except Exception as exc:  # e.g. a reply that cannot be pickled
            control.finish(rank, seen, RemoteFailure.from_exception(exc), True, master)
