"""The master-only ``Session``: the state machine that drives every command.

A program has at most one live ``Session``, in the master process; ``fork()``
(``lifecycle.py``) builds it. Its life::

    (none) --fork()--> READY --WorkerDiedError / timeout / SIGTERM--> BROKEN
                         |  ^                                           |
                  Ctrl-C |  | the workers are done with it              |
                         v  |                                           |
                       READY, a command pending                         |
                         |                                              |
                         +------------------close()---------------------+--> CLOSED

Every command goes through ``Session.run(message)``:

1. admit: the caller is the master process (not a process forked from it later), the
   session is READY, and the command is not nested inside another; then take the
   command lock, so commands from several threads of the master run one at a time;
2. post the message on the control block and wake the workers (a message that cannot
   be pickled raises here, before any worker moves);
3. run the master's own share, through the same ``Executor`` as the workers;
4. wait for every worker, watching for dead ones, the timeout and Ctrl-C;
5. collect the replies and raise the root-cause failure, if any: a rank-side refusal
   of the arguments as the ``ValueError``/``TypeError`` it is, anything else as
   ``WorkerError``.

Ctrl-C (``KeyboardInterrupt`` in the thread that waits) abandons the command in the
master only; the session stays READY (SPEC section 6). Workers ignore SIGINT and
cannot be stopped half-way safely, so the command stays *pending*: if the master had
not finished its own share, it marks that share failed and aborts the command, so
that workers waiting for it at a barrier give up (``BarrierAborted``) and workers that
have not started it skip it; a master interrupted while it waits lets them finish.
The next command (``enter``, and ``run_held`` again) first waits, interruptibly, until
every worker has marked the pending command done, and throws its replies away
(one-off reply segments unlinked): only then may it stage shared memory or post. The
sequence number, the abort flag and the barrier epochs all carry the command's
number, so nothing of the abandoned command is mistaken for the next one. Over
several machines the transport does the same with the other machines
(``Transport.settle``, while ``pending_elsewhere``); it says when an interrupt broke
the session instead (``interrupt_breaks``).

An instrument (``synk.profile()``) may watch commands (as Trio's instruments watch
its run): the session then hands it each command to run, with the master's share, and
it times what it likes around them; without one, a command costs one ``is None`` check
for it. Nothing below the session knows about it.

Steps 2-5 are the transport's (``_core/transport.py``), chosen once at ``fork`` and
held: one machine's runs the local group's round (``_core/group.py``); the one over
several machines wraps it (``_machines/transport.py``). The session's run path is the same
for both; what differs is declared by the transport: what a failure means
(``error``), how a command Ctrl-C left pending is settled (``settle``), whether an
interrupt broke the session (``interrupt_breaks``: over several machines, one that
came while data moved between them and outlasted its grace), and whether a failure
closes it at once or at ``close()``.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from .._runtime import processes, signals
from .._runtime.remote import Refusal, RemoteTraceback
from ..errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from . import context
from .execute import Executor, Handler, Outcome
from .group import LocalGroup, Share
from .protocol import Message
from .transport import First, Transport

__all__ = ["Session", "State", "Instrument", "current", "require", "install"]

log = logging.getLogger("synkhronos")
_get_ident = threading.get_ident


class State(enum.Enum):
    READY = "ready"
    BROKEN = "broken"
    CLOSED = "closed"


# Python 3.11 looks an enum member up through a descriptor (about 0.2 us): every
# command compares the state, so against these.
_READY, _BROKEN, _CLOSED = State.READY, State.BROKEN, State.CLOSED


Run = Callable[[Message, Share, Any], tuple[list[Any], Outcome, Any]]  # a transport's run


class Instrument(Protocol):
    """What watches the session's commands (``synk.profile()``).

    The session calls ``command`` instead of running a command itself; ``command``
    must call ``run(message, share, key)`` once (it may wrap ``share``, the master's
    own share) and return what it returned. The function layer calls ``call`` around
    a whole function call in the same way (``run(*args)`` once, its result returned),
    so that the instrument sees the master's work before and after the command.
    """

    def command(self, message: Message, run: Run, share: Share, key: Any
                ) -> tuple[list[Any], Outcome, Any]: ...

    def call(self, run: Callable[..., Any], *args: Any) -> Any: ...


class Fresh(Protocol):
    """What keeps every process's shared variables as the master's program set them
    (``collectives.fresh.Fresh``): the session calls ``before`` as a thread takes the
    command lock (it may run a command of its own first, or raise) and ``after`` as
    the thread gives it back."""

    def before(self, session: Session) -> None: ...

    def after(self) -> None: ...


class Session:
    """The master's session: its context, workers, and command state machine.

    Parameters
    ----------
    group
        The master's machine: its context, workers, control block, lock and prefix
        (``_core/group.py``).
    executor
        Runs each message's handler (the master's own share).

    Attributes
    ----------
    transport
        How commands reach every process: this machine's group alone until ``fork``
        chooses another (``use``).
    """

    def __init__(self, group: LocalGroup, executor: Executor):
        ctx = group.ctx
        self.group = group
        self.ctx = ctx
        self.executor = executor
        self.timeout = group.timeout
        self.state = _READY
        self.broken: BaseException | None = None
        self.instrument: Instrument | None = None  # ``synk.profile()``, while one runs
        #: Brings the master's ``set_value`` to every process before each command
        #: (``collectives.fresh``; None without workers, or while no shared variable
        #: is distributed: then nothing is checked at all)
        self.fresh: Fresh | None = None
        self.transport = Transport(group)
        # An RLock knows its owner: Python raises a Ctrl-C just after a C call returns,
        # so ``enter`` must be able to tell whether the interrupted acquire() got it.
        self._command_lock = threading.RLock()
        self._holder: int | None = None  # the thread holding the command lock
        self._running = False  # a command is in progress (in the holder's thread)
        self.commands = 0  # commands run so far (a test counts round trips with it)
        # The master's own share of a message (made once: a command runs in microseconds)
        # (no keyword in it: a partial with one costs twice the call)
        self._own_share = functools.partial(executor.run, ctx)

    @property
    def n(self) -> int:
        return self.ctx.size

    @property
    def workers(self) -> list[processes.Worker]:
        return self.group.workers

    def use(self, transport: Transport) -> None:
        """The transport ``fork`` chose (before the session is handed out)."""
        self.transport = transport

    @property
    def replica_groups(self) -> tuple[tuple[int, int], ...] | None:
        """Per copy of the session's memory, (first rank, ranks); None: one copy."""
        return self.transport.replica_groups

    @property
    def busy(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self.state is _CLOSED

    def usable(self) -> bool:
        return self.state is _READY

    # -- admission ---------------------------------------------------------------------
    def check_usable(self) -> None:
        """Raise unless this process may issue a command now (takes no lock)."""
        if context.pid() != self.ctx.master_pid:
            raise RuntimeError(
                f"synkhronos commands can only be issued by the master process (pid "
                f"{self.ctx.master_pid}); this process (pid {os.getpid()}) was forked from "
                "it (a multiprocessing or PyMC chain process?): call synkhronos functions "
                "from the master, and run such samplers with cores=1"
            )
        if self.state is _CLOSED:
            raise RuntimeError("the synkhronos session is closed; call synk.fork() first")
        if self.state is _BROKEN:
            raise self._broken_error()
        if self._running and self._holder == threading.get_ident():
            raise RuntimeError(
                "a synkhronos command is already running in this thread; commands cannot "
                "be nested (is a synkhronos function called from inside another's op?)"
            )

    def _broken_error(self) -> BaseException:
        error = self.broken
        if isinstance(error, WorkerDiedError):
            return WorkerDiedError(error.rank, error.pid, error.reason, error.host)
        if isinstance(error, WorkerTimeoutError):
            return WorkerTimeoutError(error.rank, error.pid, error.timeout, error.host)
        return RuntimeError("the synkhronos session is broken; call synk.close()")

    def enter(self) -> bool:
        """Check the session is usable and take the command lock for this thread.

        Returns whether this call took it (False: this thread holds it already); pass
        that to ``leave``. A caller that stages shared memory before its command holds
        the lock across both, so that calls from several threads never interleave.
        """
        me = _get_ident()
        usable = self.state is _READY and context.pid() == self.ctx.master_pid
        if self._holder == me:
            if not usable or self._running:
                self.check_usable()  # raises: broken, closed, or a nested command
            return False  # this thread took the lock for its command's staging: usable
        if not usable:
            self.check_usable()  # raises
        lock = self._command_lock
        try:
            lock.acquire()  # interruptible by Ctrl-C in the main thread
        except BaseException:
            if lock._is_owned():  # type: ignore[attr-defined]  # raised once it returned
                lock.release()
            raise
        self._holder = me
        if self.state is not _READY:  # another thread broke or closed it meanwhile
            self.leave(True)
            self.check_usable()
        if self.group.pending is not None or self.transport.pending_elsewhere:
            try:  # (before any staging into shared memory)
                self._settle()
            except BaseException:
                self.leave(True)
                raise
        if self.fresh is not None:  # the program's set_value since it last left: sent
            try:  # first (before anything is staged: staging may move the master's
                self.fresh.before(self)  # values into shared memory), or refused
            except BaseException:
                self._holder = None  # (not ``leave``: what it refused stays to be sent)
                lock.release()
                raise
        return True

    def leave(self, took: bool) -> None:
        """Give back the command lock if ``enter`` took it."""
        if took:
            if self.fresh is not None:  # what the library left in the master's cells
                self.fresh.after()
            self._holder = None
            self._command_lock.release()

    # -- commands --------------------------------------------------------------------------
    def run(self, message: Message, repeats: bool = False) -> list[Any]:
        """Run ``message`` on every process; return the replies, indexed by rank.

        Collective: every process takes part; returns when all have finished.
        ``repeats``: the message is hashable and likely to be sent again (a prepared
        call's arguments); it is then pickled once and decoded once per worker.
        """
        took = self.enter()
        try:
            return self.run_held(message, repeats)
        finally:
            if took:  # ``leave``, written out
                if self.fresh is not None:
                    self.fresh.after()
                self._holder = None
                self._command_lock.release()

    def run_held(self, message: Message, repeats: bool = False,
                 handler: Handler | None = None) -> list[Any]:
        """``run`` for a caller that holds the command lock (its ``enter`` returned).

        ``handler``: this process's share of ``message`` runs it instead of the
        handler table's (one process in all: a call on the caller's arrays,
        ``_shard.on_arrays``)."""
        self._running = True
        self.commands += 1
        try:
            if self.group.pending is not None or self.transport.pending_elsewhere:
                self._settle()
            signals.forget()  # only a signal that arrives during this command is ours
            transport = self.transport
            instrument = self.instrument
            key = message if repeats else None
            share = self._own_share if handler is None else functools.partial(
                self.executor.run, self.ctx, handler=handler)
            try:
                if instrument is None:
                    replies, own, first = transport.run(message, share, key)
                else:
                    replies, own, first = instrument.command(message, transport.run,
                                                             share, key)
            except KeyboardInterrupt as exc:
                if not transport.interrupt_breaks:  # the group left the command
                    raise _interrupted(exc) from None  # pending: the session stays
                self._fail_raise(exc)
            except BaseException as exc:
                self._fail_raise(exc)
            if own.failure is not None or first is not None:
                _raise_root_failure(self.ctx.master_rank, own, first)
            return replies
        finally:
            self._running = False

    def _settle(self) -> None:
        """Wait until every worker is done with the command Ctrl-C left pending, and
        throw its replies away (``Transport.settle``). Ctrl-C here raises again and
        leaves it pending; a dead worker or the timeout breaks the session as in any
        command."""
        signals.forget()
        try:
            self.transport.settle()
        except KeyboardInterrupt as exc:
            if not self.transport.interrupt_breaks:
                raise
            self._fail_raise(exc)
        except BaseException as exc:
            self._fail_raise(exc)

    def _fail_raise(self, exc: BaseException) -> NoReturn:
        """Break the session over ``exc`` and raise what it means (the transport's
        word: a lost machine, an abort), or ``exc`` itself."""
        error = self.transport.error(exc)
        self._fail(error)
        if error is exc:
            raise exc
        raise error from exc

    def replicate(self, publish: Callable[[Transport], None]) -> None:
        """``publish(transport)``: a ``Data`` write to the other copies of the session's
        memory (``replica_groups``), under the command lock, a failure breaking the
        session as a command's does."""
        took = self.enter()
        try:
            publish(self.transport)
        except KeyboardInterrupt as exc:  # (raised once the write is everywhere)
            if not self.transport.interrupt_breaks:
                raise
            self._fail_raise(exc)
        except BaseException as exc:
            self._fail_raise(exc)
        finally:
            self.leave(took)

    def _fail(self, exc: BaseException) -> None:
        """A command was abandoned: the session cannot be trusted any more."""
        if self.state is not _READY:
            return
        self.state = _BROKEN
        self.broken = exc
        self.group.abort()
        if isinstance(exc, (WorkerDiedError, WorkerTimeoutError)):
            log.error("synkhronos session broken: %s", exc)
        elif self.transport.close_on_failure:  # SIGTERM: leave nothing behind
            self.close()
        # Otherwise (several machines) the exception goes up first (Python prints it),
        # and close() at exit ends the job: closing here would end the process now.

    # -- stop --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and reap the workers and free every segment of this program.

        Does nothing in a process forked from the master later (its session is the
        master's, not its own), and nothing the second time.
        """
        if self.state is _CLOSED or os.getpid() != self.ctx.master_pid:
            return
        was_ready = self.state is _READY
        self.state = _CLOSED
        # A command in progress (this thread's, when a failure closes the session, or
        # another thread's) is not waited for: the workers are stopped under it, and
        # its wait then fails on its own.
        owned = self._holder is None and self._command_lock.acquire(timeout=5.0)
        try:
            self.transport.begin_close(was_ready and owned)
            group = self.group
            if was_ready and owned:  # busy: with a command nobody waits for any more
                group.stop(0.0 if group.busy() else 5.0)
            else:
                group.stop(None)
        finally:
            self.group.release(close_control=not self._running)
            self.ctx.watch = context.no_watch  # no cycle back to the session
            if owned:
                self._command_lock.release()
            if _current is self:
                install(None)
            self.transport.end_close(self.broken)


def _interrupted(exc: KeyboardInterrupt) -> KeyboardInterrupt:
    """A Ctrl-C that interrupted a command, raised afresh where the program called: its
    traceback is the program's frames down to the session, not those of whatever the
    master's share was running (PyTensor's VM, which may attach a HINT of its own about
    the node it was in, and this package's layers between)."""
    return type(exc)(*exc.args)


def _raise_root_failure(master: int, own: Outcome, first: First) -> None:
    """Raise the command's root cause, if any rank failed: the master's own failure
    unless it is secondary, else the first root failure of another rank."""
    if own.failure is not None and not own.failure.secondary:
        _raise_failure(master, own)
    if first is not None:
        _raise_failure(*first)
    if own.failure is not None:
        _raise_failure(master, own)


def _raise_failure(rank: int, outcome: Outcome) -> None:
    """Raise what one rank's failure means in the master."""
    failure = outcome.failure
    assert failure is not None
    cause = outcome.exception if outcome.exception is not None else failure.exception()
    if isinstance(cause, Refusal):
        raise cause.kind(str(cause)) from None
    if cause is None:
        cause = RemoteTraceback(failure.traceback)
    raise WorkerError(rank, failure.exc_type, failure.message, failure.traceback) from cause


# -- the program's one session ----------------------------------------------------------------
_current: Session | None = None


def current() -> Session | None:
    """The live session of this program, or None."""
    return _current


def require(what: str = "this") -> Session:
    """The live session, or a RuntimeError saying to call fork() first."""
    session = _current
    if session is None:
        ctx = context.current()
        if ctx is not None and not ctx.is_master:
            raise RuntimeError(
                f"{what} can only be called in the master process, not in a worker "
                f"(rank {ctx.rank}): commands come from the master"
            )
        raise RuntimeError(f"synk.fork() must be called before {what}")
    return session


def install(session: Session | None) -> None:
    """Make ``session`` the program's session (``fork``), or clear it (``close``)."""
    global _current
    _current = session
    context.install(session.ctx if session is not None else None)

