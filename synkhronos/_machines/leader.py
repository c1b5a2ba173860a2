"""The leader of a machine other than the master's: it serves commands until the end.

Under ``mpiexec`` every machine's first process forks its local workers, as the master
does, and starts MPI; on the master's machine ``fork()`` then returns, and on every
other machine it calls ``serve``, which never returns. For each envelope from the
master (``Machines.receive``) the leader

1. replays the arena's journal (replicas of the master's segments created, copied,
   released) on this machine;
2. for a message to the leaders alone (a ``Data`` write): applies it, and waits for the
   next envelope -- the local workers are not woken;
3. for a command: prepares what must come before the workers see it (``prepare``: the
   functions of ``distribute()`` are unpickled and compiled here first, so this
   machine compiles once), then runs the same command round as the master on its
   machine (``LocalGroup.round``: post, own share, wait, collect), meets the other
   leaders at the end of the command (``Machines.finish``) and sends the replies of
   its processes, by global rank, to the master;
4. at the end (the master closed): stops its workers, removes its segments, leaves
   MPI, and ends the process (``os._exit``: nothing of the script after ``fork()`` runs
   on this machine).

Failure: a local worker that dies (or outlives the timeout), an error between
machines, a signal: the leader reports it to the master (``Machines.report``: the
master raises ``WorkerDiedError`` naming this host), stops its workers, removes its
segments, and ends the job (``Leaders.abort``): after a failure between machines, no
machine can trust a collective half done. It waits ``FAILURE_GRACE`` seconds for the
master to end the job first (its ``close()``, or the end of its script).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from .._core import faults
from .._core.execute import Executor, Outcome, at_reply
from .._core.group import LocalGroup
from .._core.protocol import Message
from .._runtime.remote import RemoteFailure
from . import mpi
from .link import COMMAND, END, LEADERS_ONLY, Machines

__all__ = ["Leader", "FAILURE_GRACE"]

log = logging.getLogger("synkhronos")

FAILURE_GRACE = 60.0  # seconds a failed machine waits for the master to end the job
_STOP_GRACE = 5.0  # seconds workers get to leave after Exit


class Leader:
    """This machine's leader, serving the master's commands (see the module docstring).

    Parameters
    ----------
    group
        This machine's processes (``_core/group.py``), forked.
    machines
        The link to the other machines' leaders (this process's meeting holds it).
    executor
        The handler table every process runs.
    leaders_only
        Handlers of the messages to the leaders alone (``Data`` writes).
    prepare
        Per message type: what the leader does before posting the command.
    """

    def __init__(self, group: LocalGroup, machines: Machines, executor: Executor,
                 leaders_only: Mapping[type, Callable[..., Any]],
                 prepare: Mapping[type, Callable[..., Any]]):
        self.group = group
        self.ctx = group.ctx
        self.machines = machines
        self.executor = executor
        self._leaders_only = leaders_only
        self._prepare = prepare
        group.host = self.machines.host
        group.also = self.machines.check_alarms  # the master ended the job?
        self.machines.set_liveness(group.watch)

    # -- the loop --------------------------------------------------------------------------
    def join(self, message: Message) -> None:
        """Run ``message`` on this machine's processes only (``Join``, at the start)."""
        ctx = self.ctx
        try:
            _, own, parts = self.group.round(
                message, lambda m: self.executor.run(ctx, m, keep_exception=True))
            if own.failure is not None:
                raise RuntimeError(f"joining the machines failed: {own.failure.message}")
            for rank, failed, reply in parts:
                if failed:
                    raise RuntimeError(f"joining the machines failed in local process "
                                       f"{rank}: {reply.message}")
        except BaseException as exc:
            self._fail(exc)

    def serve(self) -> NoReturn:
        """Serve commands until the master closes; never returns."""
        try:
            while True:
                journal, kind, ident, message = self.machines.receive()
                self.ctx.arena.replay(journal)
                if kind == END:
                    break
                if kind == LEADERS_ONLY:
                    self._leaders_only[type(message)](self.ctx, message)
                elif kind == COMMAND:
                    self._command(message, ident)
        except BaseException as exc:
            self._fail(exc)
        self._close()

    def _command(self, message: Message, ident: int) -> None:
        ctx = self.ctx
        if faults.PENDING:
            faults.activate()
        prepared: Outcome | None = None
        prepare = self._prepare.get(type(message))
        if prepare is not None:
            try:
                prepare(ctx, message)
            except (Exception, SystemExit) as exc:
                prepared = Outcome(None, RemoteFailure.from_exception(exc), exc)
        _, own, parts = self.group.round(
            message,
            lambda m: at_reply(prepared or self.executor.run(ctx, m, keep_exception=True)),
            ident or None, fatal=self.machines.ends_command)
        failed = own.failure is not None
        offset = ctx.offsets[ctx.node]
        part = [(ctx.rank, failed, own.failure if failed else own.reply)]
        part += [(offset + rank, bad, reply) for rank, bad, reply in parts]
        self.machines.finish(_pickled(part))

    # -- the end -----------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> NoReturn:
        """Report, clean up, end the job (never returns)."""
        master_lost = isinstance(exc, mpi.PeerLostError) and 0 in exc.ranks
        told = isinstance(exc, mpi.JobAbortedError) or master_lost
        if not told:
            try:
                self.machines.report(exc)
            except Exception:  # best effort: abort below ends the job anyway
                log.debug("reporting a failure to the master failed", exc_info=True)
            log.error("synkhronos on %s: %s: %s; ending the job", self.machines.host,
                      type(exc).__name__, exc)
        try:
            self.group.teardown(None)  # the workers killed at once, the segments removed
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                self.machines.abort(f"{type(exc).__name__} on {self.machines.host}: {exc}",
                                    grace=2.0 if told else FAILURE_GRACE)
            finally:  # a signal during the wait (the launcher ending the job): go now
                os._exit(1)

    def _close(self) -> NoReturn:
        """The master closed: stop the workers, clean up, leave MPI, end the process."""
        try:
            self.group.teardown(_STOP_GRACE)
            self.machines.set_liveness(None)  # the workers are gone, as they should be
            self.machines.close(timeout=30.0)
        except BaseException as exc:
            self._fail(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _pickled(part: list) -> bytes:
    """This machine's replies, pickled; a reply that cannot be becomes its failure."""
    try:
        return pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        kept = []
        for rank, failed, value in part:
            try:
                pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                failed, value = True, RemoteFailure.from_exception(exc, keep=False)
            kept.append((rank, failed, value))
        return pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL)
