"""A worker's main: wait for a command, run it, report, repeat.

The loop never dies of a command's exception: ``Executor.run`` turns it into a
``RemoteFailure`` in this rank's reply slot, the rank marks the command done, and the
master raises it (as ``WorkerError``, or as the ``ValueError`` a rank-side check
refused). Every process therefore reaches the end of every command and stays in step.
Before each command the worker drops the mappings of segments released since the
last one (the arena's release log), and skips a command the master abandoned before
this worker began it (Ctrl-C in the master's own share, or a broken session). A
command that repeats the one before (a training loop's call) takes that command's
lane (``Executor.lanes``) when it has one: the same work, without the lookups. The
loop leaves on ``Exit`` or when the master is gone (then it sweeps the program's
segments itself).
"""

from __future__ import annotations

import os

from ._core import faults
from ._core import session as core_session
from ._core.context import RankContext, install
from ._core.execute import Executor, Outcome, at_reply, failed
from ._core.protocol import Exit, Message
from ._runtime import processes, shmem
from ._runtime.arena import Arena
from ._runtime.remote import BarrierAborted, RemoteFailure

__all__ = ["main", "worker_context"]


lane_runs = 0  # commands this process ran through a lane (``testing.lane_runs``)

_SKIPPED = RemoteFailure.from_exception(
    BarrierAborted("the master abandoned this command before this process began it"),
    keep=False)


def worker_context(master: RankContext, rank: int) -> RankContext:
    """Worker ``rank``'s own context, made in the child right after the fork.

    Nothing of the master's per-process state is kept: only who the program is.
    """
    control = master.control
    assert control is not None
    ctx = RankContext(
        rank=rank,
        size=master.size,
        master_rank=master.master_rank,
        prefix=master.prefix,
        arena=Arena(master.prefix, rank, False, control.release_log),
        control=control,
        master_pid=master.master_pid,
        device=master.device,
        placement=master.placement,
    )

    def watch_master() -> None:
        if processes.master_gone(ctx.master_pid):
            shmem.sweep_prefix(ctx.prefix)
            os._exit(1)

    ctx.watch = watch_master
    return ctx


def main(master: RankContext, executor: Executor, rank: int, forked_seq: int) -> None:
    """Run worker ``rank`` until the master says ``Exit`` (called in the forked child).

    ``forked_seq``: the control block's sequence number at the fork (not read again
    here: the master may have posted already).
    """
    global lane_runs
    master.placement.bind(rank)  # before any device library starts in this process
    ctx = worker_context(master, rank)
    core_session.install(None)  # the master's session is not this process's
    install(ctx)
    control, replies, arena = ctx.control, ctx.replies, ctx.arena
    assert control is not None and replies is not None
    master_rank = ctx.master_rank
    seen = forked_seq
    watch = ctx.watch
    lanes = executor.lanes
    last: Message | None = None  # the last command run, if it has a lane
    lane = None
    while True:
        seen = control.next_command(rank, seen, watch)
        arena.catch_up()
        if faults.PENDING:
            faults.activate()
        if control.aborted(seen):  # abandoned by the master before this rank began it
            replies.finish(rank, seen, _SKIPPED, True, master_rank, arena)
            continue
        try:
            message = control.read_command(arena)
        except Exception as exc:  # e.g. a class this process cannot import
            replies.finish(rank, seen, RemoteFailure.from_exception(exc, keep=False), True,
                           master_rank, arena)
            continue
        outcome: Outcome | None = None
        if message is last and lane is not None:  # again (a training loop's call)
            try:
                if lane(seen, rank):
                    lane_runs += 1
                    continue
            except (Exception, SystemExit) as exc:
                outcome = failed(exc, True)
        elif isinstance(message, Exit):
            return
        assert isinstance(message, Message)
        if outcome is None:  # the usual way
            outcome = executor.run(ctx, message, True)  # keep the exception (positional)
        if faults.ARMED:
            outcome = at_reply(outcome)
        failure = outcome.failure
        try:
            replies.finish(rank, seen, failure if failure is not None else outcome.reply,
                           failure is not None, master_rank, arena)
        except Exception as exc:  # e.g. a reply that cannot be pickled
            failure = RemoteFailure.from_exception(exc, keep=False)
            replies.finish(rank, seen, failure, True, master_rank, arena)
        make = lanes.get(type(message)) if failure is None else None
        lane = make(ctx, message) if make is not None else None
        last = message if lane is not None else None
