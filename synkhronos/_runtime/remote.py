"""Exceptions as data: what a process records when its handler raises.

A handler's exception never escapes a process's command loop. It becomes a
``RemoteFailure`` (class name, message, formatted traceback), travels back to the
master in the process's reply slot, and is raised there by the session as a
``WorkerError``. Keeping it as plain strings means any exception, even one whose class
cannot be pickled, reaches the master.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

__all__ = ["RemoteFailure", "RemoteTraceback", "BarrierAborted"]


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in another process.

    Attached as the ``__cause__`` of the master's ``WorkerError``, so that an uncaught
    error prints where in the worker it happened.
    """

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.text.rstrip()}\n\"\"\""


class BarrierAborted(Exception):
    """Raised inside a handler whose command was abandoned by another process.

    Another rank failed (or died) before reaching a barrier this rank waits on; the
    root cause is reported from that rank, so this one is secondary.
    """


@dataclass(frozen=True)
class RemoteFailure:
    """An exception raised by a handler, reduced to strings."""

    exc_type: str
    message: str
    traceback: str
    secondary: bool = False

    @classmethod
    def from_exception(cls, exc: BaseException) -> RemoteFailure:
        kind = type(exc)
        name = kind.__qualname__
        if kind.__module__ not in ("builtins", "__main__"):
            name = f"{kind.__module__}.{name}"
        return cls(
            exc_type=name,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            secondary=isinstance(exc, BarrierAborted),
        )
