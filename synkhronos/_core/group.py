"""One machine's processes: the local group, held by the master and by each leader alike.

A ``LocalGroup`` owns what one machine's part of a session is made of: its segment
prefix, the program lock (and the watcher started with it, which sweeps the prefix
once every process of the group is gone), the control block, the forked workers, and
the process's ``RankContext`` built on them. The master's ``Session`` holds one, and
so does every other machine's ``Leader``; each step below exists here once:

- **create** (``LocalGroup.create``): the prefix, the lock and its watcher, the
  control block (more than one process), the context;
- **fork** (``fork``): the workers (each runs the caller's main loop), this process's
  core, device binding, thread limits and signal handlers;
- **one command round** (``round``): post the message on the control block, run this
  process's own share, wait for every worker (``watch`` while waiting), collect their
  replies -- ``(local rank, failed, reply)`` -- and free the command's one-off
  segments. Ctrl-C during a round leaves the command *pending* (the workers cannot be
  stopped half-way): if this process had not finished its own share, that share is
  marked failed and the command aborted, so no worker waits for it; ``settle`` then
  waits for the workers to finish it and throws its replies away;
- **watch** (``watch``): a signal turned exception, a dead worker, a worker past the
  timeout in a round, and whatever the owner adds (``also``: another machine's alarm);
- **teardown** (``stop``, then ``release``; ``teardown`` does both): stop the workers
  (``Exit`` posted and ``grace`` seconds to leave, or killed at once), then sweep the
  prefix, close the lock and the control block.

Choosing which failure a command reports, and what a failure does to the session, is
the owner's business, not the group's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .._runtime import processes, shmem, signals, watcher
from .._runtime.arena import Arena
from .._runtime.control import ControlBlock
from .._runtime.placement import placement_for
from ..errors import WorkerDiedError, WorkerTimeoutError
from .context import RankContext
from .execute import Outcome
from .protocol import Exit, Message

__all__ = ["LocalGroup", "Round"]


#: What one command round brought back on this machine: this process's local rank, its
#: own share's outcome, and each worker's ``(local rank, failed, reply)``. A plain
#: tuple: a round runs thousands of times a second, and a named tuple costs a call.
Round = tuple[int, Outcome, list[tuple[int, bool, Any]]]
Share = Callable[[Message], Outcome]  # runs this process's own share of a message


class LocalGroup:
    """One machine's processes (see the module docstring).

    Parameters
    ----------
    ctx
        This process's context, on the group's control block and prefix.
    lock
        The program lock of the group's prefix (its watcher started).
    timeout
        Seconds a round may wait for a worker, or None.
    """

    def __init__(self, ctx: RankContext, lock: shmem.ProgramLock, timeout: float | None):
        self.ctx = ctx
        self.lock = lock
        self.timeout = timeout
        self.workers: list[processes.Worker] = []
        self.ranks = [r for r in range(ctx.local_size) if r != ctx.local_rank]  # workers
        self._done_fields = ctx.control.done_fields(self.ranks) if ctx.control else []
        self.host: str | None = None  # named in failures, over several machines
        self.also: Callable[[], None] | None = None  # the owner's part of ``watch``
        self.seq = 0  # the last command posted (or settled)
        self.pending: int | None = None  # a command Ctrl-C abandoned, workers maybe in it
        self._started: float | None = None  # while a round waits (for the timeout)
        self._restores: list[Callable[[], None]] = []
        ctx.watch = self.watch

    # -- create and fork ---------------------------------------------------------------
    @classmethod
    def create(cls, n: int, device: str, rank: int, master_rank: int, spin: float,
               timeout: float | None, owner: bool = True,
               gpu_ids: list[str] | None = None) -> LocalGroup:
        """A group of ``n`` processes: prefix, lock and watcher, control block, context.

        ``owner``: this process numbers the segments every process maps (the master);
        another machine's leader holds replicas under the master's ids, so its own
        segments (a command too large for the control block) take ids of their own.
        """
        prefix = shmem.new_session_prefix()
        lock = shmem.ProgramLock(prefix)  # inherited by the workers
        try:
            control = ControlBlock(prefix, n, spin) if n > 1 else None
            # The watcher sweeps the prefix once the lock is free (a group kill). It starts
            # after the names the block makes (and unlinks at once): where one of them was
            # squatted, its sweep would have taken the squatter's name too.
            watcher.start(prefix)
        except BaseException:  # e.g. a squatted name: what it made is unlinked already
            lock.close()
            raise
        ctx = RankContext(
            rank=rank, size=n, master_rank=master_rank, prefix=prefix,
            arena=Arena(prefix, rank, owner, control.release_log if control else None),
            control=control, master_pid=os.getpid(), device=device,
            placement=placement_for(device, gpu_ids or ()),
        )
        return cls(ctx, lock, timeout)

    def on_release(self, restore: Callable[[], None]) -> None:
        """Call ``restore`` when the group is released (after what ``fork`` undoes)."""
        self._restores.append(restore)

    def fork(self, main: Callable[[RankContext, int, int], None], cores: list[int] | None,
             setup: Callable[[], object], limits: Callable[[], Any]) -> None:
        """Fork the workers, each running ``main(ctx, local rank, forked seq)`` after
        ``setup``; then pin this process to its core (``cores`` by local rank), bind
        its device, limit its threads (``limits()``, which returns what ``restore``s
        them) and take over SIGINT/SIGTERM (all three undone by ``release``: a process
        left pinned to one core would put every later session's processes, and the
        user's own, on that core)."""
        ctx = self.ctx
        if ctx.control is not None:
            forked_seq = ctx.control.seq
            self.workers = processes.fork_workers(
                self.ranks, ctx.prefix, lambda rank: main(ctx, rank, forked_seq), cores,
                setup=setup)
        if cores is not None:  # pinned: this process too, until ``release``
            before = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {cores[ctx.local_rank]})
            self._restores.append(lambda: os.sched_setaffinity(0, before))
        ctx.placement.bind(ctx.local_rank)  # the workers bound theirs as they started
        self._restores.append(limits().restore)
        old_handlers = signals.install()
        self._restores.append(lambda: signals.restore(old_handlers))

    # -- one command ---------------------------------------------------------------------
    def round(self, message: Message, own_share: Share, key: Any = None,
              fatal: Callable[[Outcome], bool] | None = None) -> Round:
        """Run ``message`` on this machine: post it, run ``own_share(message)``, wait for
        every worker, collect their replies (see the module docstring).

        ``key``: the message repeats (the control block's memo); ``fatal(own)``: a
        failed own share that must end the round at once (its exception raised).
        """
        ctx = self.ctx
        control = ctx.control
        local = ctx.local_rank
        if control is None:
            return local, own_share(message), []
        before = control.seq
        share_done = False
        try:
            seq = control.post(message, local, ctx.arena, key)
            self.seq = seq
            if self.timeout is not None:
                self._started = time.monotonic()
            own = own_share(message)
            share_done = True
            if own.failure is not None:
                control.mark_failed(local, seq)
                if fatal is not None and fatal(own):
                    assert own.exception is not None
                    raise own.exception
            control.wait_done(local, seq, self._done_fields, self.watch)
            return local, own, control.replies.collect(self.ranks, ctx.arena,
                                                       not message.replies_reduced_at_once)
        except KeyboardInterrupt:
            self._interrupted(before, share_done)
            raise
        finally:
            self._started = None

    def _interrupted(self, before: int, share_done: bool) -> None:
        """Ctrl-C during a round: leave the command pending. ``before``: the sequence
        number before the post; ``share_done``: this process's share had finished."""
        control = self.ctx.control
        assert control is not None
        seq = control.seq
        if seq == before:  # interrupted before the post took effect: nothing to wait for
            return
        self.pending = seq
        if not share_done:  # no rank may wait for this process's unfinished share
            control.mark_failed(self.ctx.local_rank, seq)
            control.abort(seq)

    def settle(self) -> None:
        """Wait until every worker is done with the pending command, and throw its
        replies away. Ctrl-C here raises again and leaves it pending."""
        seq = self.pending
        control = self.ctx.control
        assert seq is not None and control is not None
        self.seq = seq
        self._started = time.monotonic()
        try:
            control.wait_done(self.ctx.local_rank, seq, self._done_fields, self.watch)
        finally:
            self._started = None
        arena = self.ctx.arena
        for rank in self.ranks:
            try:
                control.replies.reply(rank, arena)  # unlinks a one-off reply segment
            except Exception:  # nobody asked for it any more (or read already)
                pass
        control.release_external_payload(arena)
        self.pending = None  # last: a Ctrl-C above leaves it to the next command

    def busy(self) -> bool:
        """Whether a worker is still in the pending command."""
        control = self.ctx.control
        return (self.pending is not None and control is not None
                and not control.all_done(self.pending, self.ranks))

    def abort(self) -> None:
        """The last command is abandoned: workers waiting at its barriers give up."""
        if self.ctx.control is not None:
            self.ctx.control.abort(self.seq)

    # -- liveness --------------------------------------------------------------------------
    def watch(self) -> None:
        """Raise if a signal arrived, a worker died, a worker outlived the timeout in a
        round, or the owner's check (``also``) fails; runs every poll interval."""
        signals.reraise_lost()
        if self.also is not None:
            self.also()
        ctx = self.ctx
        offset = ctx.offsets[ctx.node]  # the workers' global ranks
        for worker in self.workers:
            reason = worker.poll()
            if reason is not None:
                raise WorkerDiedError(offset + worker.rank, worker.pid, reason, self.host)
        started, timeout = self._started, self.timeout
        if timeout is not None and started is not None and time.monotonic() - started > timeout:
            control = ctx.control
            if control is None:
                return
            late = [worker for worker in self.workers if control.done(worker.rank) != self.seq]
            if late:
                # The one furthest behind in the command's barriers: a healthy worker
                # waits at a barrier that a stopped one never reached (and may not yet
                # have seen the master give up on it), so the first late one in rank
                # order is not always the one at fault.
                worker = min(late, key=lambda late_one: control.epoch(late_one.rank))
                raise WorkerTimeoutError(offset + worker.rank, worker.pid, timeout, self.host)

    # -- teardown ------------------------------------------------------------------------
    def stop(self, grace: float | None) -> None:
        """Stop the workers: ``Exit`` posted and ``grace`` seconds to leave, then killed;
        ``None``: killed at once (the control block is not trusted)."""
        control = self.ctx.control
        if not self.workers:
            return
        if grace is not None and control is not None:
            control.post(Exit(), self.ctx.local_rank, self.ctx.arena)
        processes.stop_workers(self.workers, timeout=grace or 0.0)

    def release(self, close_control: bool = True) -> None:
        """After ``stop``: undo ``fork``'s thread limits and signal handlers, sweep the
        prefix, close the lock and (``close_control``) the control block."""
        try:
            for restore in reversed(self._restores):
                restore()
        finally:
            self._restores.clear()
            shmem.sweep_prefix(self.ctx.prefix)
            self.lock.close()
            if close_control and self.ctx.control is not None:
                self.ctx.control.close()

    def teardown(self, grace: float | None) -> None:
        """``stop`` then ``release``: nothing of the group is left."""
        try:
            self.stop(grace)
        finally:
            self.release(close_control=False)
