"""Exceptions as data: what a process records when its part of a command raises.

An exception never escapes a process's command loop. It becomes a ``RemoteFailure``
(class name, message, formatted traceback, and the exception itself pickled when it
can be), travels back to the master in the process's reply slot, and is raised there
as a ``WorkerError`` whose ``__cause__`` is the original exception (carrying the
remote traceback as its own cause) or, when the exception does not pickle, the remote
traceback alone. Strings always arrive, whatever the exception's class.

Two kinds of exception are not the user's code failing:

- ``BarrierAborted``: another rank failed first and this one stopped waiting for it
  (a *secondary* failure: the root cause is reported from that rank);
- ``Refusal``: a check that can only run where the data lives (a rank's own rows)
  refused the arguments on every rank alike, before anything changed; the master
  raises it as the ``ValueError`` or ``TypeError`` it is.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass

__all__ = ["RemoteFailure", "RemoteTraceback", "BarrierAborted", "Refusal"]


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in another process.

    Attached as the ``__cause__`` of the original exception (or of the master's
    ``WorkerError``), so that an uncaught error prints where in the worker it happened.
    """

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.text.rstrip()}\n\"\"\""


class BarrierAborted(Exception):
    """Raised inside a command that another process abandoned.

    Another rank failed (or died) before reaching a barrier this rank waits on; the
    root cause is reported from that rank, so this one is secondary.
    """


class Refusal(ValueError):
    """Arguments that a rank-side check refused (on every rank, nothing changed).

    ``kind`` is the exception class the master raises: ``ValueError`` or ``TypeError``;
    ``secondary`` marks a rank that refuses only because another one did.
    """

    def __init__(self, message: str, kind: type[Exception] = ValueError,
                 secondary: bool = False):
        super().__init__(message)
        self.kind = kind
        self.secondary = secondary  # this rank only echoes another rank's refusal

    def __reduce__(self):
        return type(self), (str(self), self.kind, self.secondary)


@dataclass(frozen=True)
class RemoteFailure:
    """An exception raised in one process's part of a command, as data."""

    exc_type: str
    message: str
    traceback: str
    secondary: bool = False
    pickled: bytes | None = None  # the exception itself, when it pickles

    @classmethod
    def from_exception(cls, exc: BaseException, keep: bool = True) -> RemoteFailure:
        """Record ``exc``; ``keep`` also pickles the exception object (a worker's)."""
        kind = type(exc)
        name = kind.__qualname__
        if kind.__module__ not in ("builtins", "__main__"):
            name = f"{kind.__module__}.{name}"
        pickled = None
        if keep:
            try:
                pickled = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.loads(pickled)  # a class that pickles but cannot come back
            except Exception:
                pickled = None
        return cls(
            exc_type=name,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            secondary=isinstance(exc, BarrierAborted) or getattr(exc, "secondary", False),
            pickled=pickled,
        )

    def exception(self) -> BaseException | None:
        """The original exception, rebuilt here, with the remote traceback as its
        cause; None when it did not pickle."""
        if self.pickled is None:
            return None
        try:
            exc = pickle.loads(self.pickled)
        except Exception:
            return None
        if isinstance(exc, BaseException):
            exc.__cause__ = RemoteTraceback(self.traceback)
            return exc
        return None
