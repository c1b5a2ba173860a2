"""One command on one rank: look the message up, run its handler, return the outcome.

The master's own share and the worker loop both call ``Executor.run``, so every rank
treats an exception the same way:

- ``Exception`` and ``SystemExit`` raised by a handler (user code included, and
  ``sys.exit()`` inside a PyTensor op) become a failure: the rank reports it and stays
  in the session, which stays usable (``WorkerError`` in the master);
- ``KeyboardInterrupt`` passes through: in the master it abandons the command there
  and leaves it pending for the workers (``session.py``; workers ignore SIGINT, so it
  never starts there). Compiled code (Numba, PyTensor's C code, JAX) may turn the
  handler's exception into another failure (Numba's ``SystemError: ... returned a
  result with an exception set``) or drop it: a failure of the master's share during
  a command in which its signal handler ran is the interruption, and is raised as one
  (``_runtime/signals.py``), however the failure looks.

The handler table is explicit: ``synkhronos/handlers.py`` lists every message type and
its handler, and hands the table to the session and the workers. A ``Sequence`` runs
its steps here, in order, each through the same table; a timed one (``synk.profile``)
also says, per step, how long it took this rank, how much of that the rank waited at
meeting points for the others (the control block's ``clock``), and the CPU time this
process spent on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .._runtime import epoch, signals
from .._runtime.remote import RemoteFailure
from . import faults
from .context import RankContext
from .protocol import Message, Ping, RunCallable, Sequence

__all__ = ["Executor", "Handler", "Lane", "Outcome", "CORE_HANDLERS", "at_reply", "failed"]

Handler = Callable[[RankContext, Any], Any]
Lane = Callable[[RankContext, Any], Callable[[int, int], bool] | None]  # Executor.lanes


class Outcome(NamedTuple):
    """What one rank's part of a command produced."""

    reply: Any
    failure: RemoteFailure | None = None
    exception: BaseException | None = None  # the live exception (the master keeps it)


_new_tuple = tuple.__new__
_REPLIED_NONE = Outcome(None)  # most commands reply nothing: one outcome for them all


def at_reply(outcome: Outcome) -> Outcome:
    """A non-master rank's ``outcome``, unless the test fault point ``reply`` (between
    running a command and replying to it) fires here: then that failure."""
    if faults.ARMED:
        try:
            faults.hit("reply")
        except (Exception, SystemExit) as exc:
            return Outcome(None, RemoteFailure.from_exception(exc), exc)
    return outcome


def failed(exc: BaseException, keep_exception: bool) -> Outcome:
    """The outcome of a handler that raised ``exc`` (``Exception`` or ``SystemExit``):
    its failure (``keep_exception``: see ``Executor.run``), or the interruption
    it stands for (Ctrl-C inside compiled code is still Ctrl-C)."""
    signals.reraise_interruption(exc)
    return Outcome(None, RemoteFailure.from_exception(exc, keep=keep_exception), exc)


def _ping(ctx: RankContext, message: Ping) -> None:
    return None


def _run_callable(ctx: RankContext, message: RunCallable) -> Any:
    if message.ranks is None or ctx.rank in message.ranks:
        return message.fn(*message.args)
    return None


CORE_HANDLERS: dict[type[Message], Handler] = {
    Ping: _ping,
    RunCallable: _run_callable,
}


class Executor:
    """Runs messages through one handler table (built once per program)."""

    def __init__(self, table: Mapping[type[Message], Handler],
                 lanes: Mapping[type[Message], Lane] | None = None):
        self._table = dict(CORE_HANDLERS)
        self._table.update(table)
        self._table[Sequence] = self._sequence
        #: Per message type, a worker's shortcut for the next command if it repeats a
        #: message of that type (which the worker has just run): ``lane(ctx,
        #: message)`` gives ``run(seq, slot)``, which does the whole command, its reply
        #: (into the control block's ``slot``, the worker's own) included, and
        #: returns True, or returns False having done nothing (the
        #: command then runs the usual way); it raises what the handler would. It
        #: gives None where there is no shortcut for ``message``. None at all with
        #: ``SYNK_REPLAY=0`` (``_runtime/epoch.py``).
        self.lanes: dict[type[Message], Lane] = dict(lanes or {}) if epoch.REPLAY else {}

    def handler(self, message: Message) -> Handler:
        try:
            return self._table[type(message)]
        except KeyError:
            raise TypeError(f"no handler for message {type(message).__name__}") from None

    def _sequence(self, ctx: RankContext, message: Sequence) -> tuple:
        if not message.timed:
            return tuple(self.handler(step)(ctx, step) for step in message.steps)
        control = ctx.control
        clock: list[float] = []  # the seconds of each wait at a barrier
        replies: list = []
        times: list[tuple[float, float, float]] = []
        if control is not None:
            control.clock = clock
        try:
            for step in message.steps:
                waits, start, cpu = len(clock), time.perf_counter(), time.process_time()
                replies.append(self.handler(step)(ctx, step))
                times.append((time.perf_counter() - start, sum(clock[waits:]),
                              time.process_time() - cpu))
        finally:
            if control is not None:
                control.clock = None
        return (*replies, tuple(times))

    def run(self, ctx: RankContext, message: Message, keep_exception: bool = False,
            handler: Handler | None = None) -> Outcome:
        """This rank's part of ``message``: its reply, or its failure.

        ``keep_exception``: also pickle the exception into the failure (a worker's,
        for the master to raise as the cause); the master keeps the live one.
        ``handler``: run this instead of the table's (``Session.run_held``'s).
        """
        try:
            if handler is None:
                handler = self._table.get(type(message)) or self.handler(message)
            reply = handler(ctx, message)
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as exc:
            return failed(exc, keep_exception)
        if reply is None:
            return _REPLIED_NONE
        return _new_tuple(Outcome, (reply, None, None))  # Outcome(reply), without its call
