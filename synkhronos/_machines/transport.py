"""Several machines: the transport over them and the meeting across them.

A session under ``mpiexec`` has one leader per machine (the master on machine 0); only
leaders talk MPI, and only through ``Machines`` (``link.py``: the link between
leaders, its communicator private). This module owns what the core needs of several
machines above that link:

- **The transport** (``Several``, chosen at ``fork``): wraps one machine's
  (``_core/transport.py``): each command goes to the other leaders first, the master's
  machine runs its local round, and the other machines' replies come back by global
  rank at the end; a ``Data`` write is published to the other machines' replicas
  (``DataWrite``, ``DataRows``, ``DataSetItem``, applied by their leaders alone:
  ``LEADERS_ONLY``); ``Join`` gives every process its global place (``HANDLERS``).
- **The meeting** (``AcrossMachines``, chosen as each process joins): a meeting point
  inside a command spans the machines -- the local ranks agree on the control block,
  the leaders agree (``Machines.meet``), the local ranks read the outcome after a
  second local barrier. A leader's meeting holds its link to the other leaders
  (``leaders_of``: what the several-machines collectives move data through).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.context import RankContext
from .._core.execute import Handler, Outcome
from .._core.group import LocalGroup, Share
from .._core.protocol import Join, Message
from .._core.transport import First, Transport, merge, root_failure
from .._runtime import shmem, signals
from . import mpi
from .link import END, LEADERS_ONLY, Machines

__all__ = ["Several", "AcrossMachines", "HANDLERS", "LEADERS_ONLY_HANDLERS", "DataWrite",
           "DataRows", "DataSetItem", "join", "leaders_of"]

_CLOSE_GRACE = 5.0  # seconds close() waits for the other machines to end a command
# that Ctrl-C left pending, before it ends the job instead


# -- the meeting over several machines ------------------------------------------------------
class AcrossMachines:
    """A process's meeting in a session over several machines (see the module
    docstring), chosen as it joins them.

    Parameters
    ----------
    leaders
        On a machine's leader, its link to the other leaders; None on its workers.
    """

    __slots__ = ("leaders",)

    def __init__(self, leaders: Machines | None):
        self.leaders = leaders

    def barrier(self, ctx: RankContext) -> None:
        self.agree(ctx, True)

    def agree(self, ctx: RankContext, ok: bool) -> bool:
        control = ctx.control
        if control is not None:
            ok = control.agree(ctx.local_rank, ok, ctx.watch)
        leaders = self.leaders
        if leaders is not None:
            ok = leaders.meet(ok)
            if control is not None:
                control.set_cross(ok)
        if control is not None:
            control.barrier(ctx.local_rank, ctx.watch)
            ok = control.cross()
        return ok


def leaders_of(ctx: RankContext) -> Machines | None:
    """This process's link to the other machines' leaders: on a machine's leader in a
    session over several machines (its meeting holds it); None on any other process."""
    meeting = ctx.meeting
    return meeting.leaders if isinstance(meeting, AcrossMachines) else None


# -- the transport over several machines ---------------------------------------------------
class Several(Transport):
    """The master's transport over several machines (see the module docstring): one
    machine's, wrapped.

    Parameters
    ----------
    group
        The master's machine.
    machines
        The link to the other machines' leaders.
    """

    close_on_failure = False  # the exception goes up first; close() then ends the job

    def __init__(self, group: LocalGroup, machines: Machines):
        super().__init__(group)
        self._machines = machines
        self._healthy = False
        self._closing: BaseException | None = None
        self.replica_groups = tuple(zip(machines.offsets, machines.local_sizes, strict=True))
        group.host = machines.host
        group.also = machines.check_alarms  # another machine's report, while waiting here
        machines.set_liveness(group.watch)

    @property
    def interrupt_breaks(self) -> bool:
        """Ctrl-C breaks the session only where it broke the link between machines: it
        came while data moved between them, and that did not end within
        ``INTERRUPT_GRACE``. Anywhere else it leaves the command pending (``settle``)."""
        return self._machines.broken is not None

    def run(self, message: Message, own_share: Share, key: Any
            ) -> tuple[list[Any], Outcome, First]:
        machines, group = self._machines, self.group
        self.pending_elsewhere = True  # (until the command's end, or ``settle``)
        machines.begin(message, group.ctx.arena.take_journal(), key)

        def share(message: Message) -> Outcome:
            try:
                outcome = own_share(message)
            except BaseException:  # (this goes up, not a Ctrl-C held meanwhile)
                machines.end_transfers(raise_held=False)
                raise
            machines.end_transfers()  # a Ctrl-C held during its transfers: raised here
            return outcome

        local, own, parts = group.round(message, share, key, fatal=machines.ends_command)
        replies: list[Any] = [None] * group.ctx.size
        replies[local] = own.reply
        first = merge(replies, parts, None, 0)  # on machine 0, local ranks are global
        others = machines.finish()
        self.pending_elsewhere = False
        assert others is not None
        for part in others[1:]:
            for rank, failed, value in pickle.loads(part):
                if failed:
                    first = root_failure(first, rank, value)
                else:
                    replies[rank] = value
        return replies, own, first

    def settle(self) -> None:
        """This machine's workers done with the command Ctrl-C left pending (as on one
        machine), then the other machines met at its end, their replies thrown away
        (``Machines.finish``: it takes up from where Ctrl-C left the master). Ctrl-C
        here leaves it pending again."""
        super().settle()
        if self._machines.owed:
            self._machines.finish()
        self.pending_elsewhere = False

    def error(self, exc: BaseException) -> BaseException:
        return self._machines.error(exc)

    def _to_leaders(self, message: Message) -> None:
        """``message`` to the other leaders alone (their workers are not woken), with
        the arena's journal, as every command."""
        self._machines.send(LEADERS_ONLY, message, self.group.ctx.arena.take_journal())

    def publish_values(self, segment: str, buffer: Any) -> None:
        nbytes = len(buffer)
        with self._machines.held():  # Ctrl-C waits for the other machines' copies
            self._to_leaders(DataWrite(segment, nbytes))
            self._machines.broadcast(buffer)

    def publish_rows(self, segment: str, view: Any, bounds: list[tuple[int, int]]) -> None:
        empty = np.empty(0, np.uint8)
        parts = [view[lo:hi].reshape(-1).view(np.uint8) if copy else empty
                 for copy, (lo, hi) in enumerate(bounds)]
        with self._machines.held():
            self._to_leaders(DataRows(segment, view.dtype.str, view.shape, tuple(bounds)))
            self._machines.scatter(parts, root=0)

    def publish_item(self, segment: str, view: Any, key: Any, value: Any) -> bool:
        message = DataSetItem(segment, view.dtype.str, view.shape, key, np.asarray(value))
        try:
            pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a key that does not pickle: the caller sends the values
            return False
        with self._machines.held():
            self._to_leaders(message)
        return True

    def begin_close(self, orderly: bool) -> None:
        machines = self._machines
        self._healthy = orderly and machines.broken is None
        self._closing = None
        # a Ctrl-C noted before (the program may end on it) is not one during close():
        # the waits below would raise it again
        signals.forget()
        if self._healthy:
            try:
                if machines.owed:  # Ctrl-C left a command pending: its end comes first
                    self._end_pending()
                machines.send(END, None, ())
            except BaseException as exc:  # the others cannot be reached: abort at the end
                self._healthy = False
                self._closing = exc

    def _end_pending(self) -> None:
        """At close: meet the other machines at the end of the command Ctrl-C left
        pending, if they get there within ``_CLOSE_GRACE`` (this machine's workers are
        stopped anyway); else raise, and the job ends (``end_close``)."""
        try:
            self._machines.finish(timeout=_CLOSE_GRACE)
        except mpi.LeaderTimeoutError as exc:
            raise RuntimeError(
                f"the other machines were still in the command that Ctrl-C left pending "
                f"{_CLOSE_GRACE:g} s after close(): ending the job") from exc
        except KeyboardInterrupt as exc:
            raise RuntimeError(
                "Ctrl-C while close() waited for the other machines to end the command "
                "that Ctrl-C left pending: ending the job") from exc

    def end_close(self, broken: BaseException | None) -> None:
        """After this machine is clean: leave MPI with the others, or end the job."""
        machines = self._machines
        broken = self._closing or broken
        if self._healthy:
            machines.set_liveness(None)  # the workers are gone, as they should be
            try:
                machines.close(timeout=30.0)
                return
            except BaseException as exc:
                broken = exc
        reason = (" ".join([f"{type(broken).__name__}: {broken}",
                            *getattr(broken, "__notes__", ())]) if broken is not None
                  else "the master closed the session during a command")
        machines.abort(reason)  # never returns: ends every machine's processes


# -- the messages to the leaders alone: a Data write on each machine's replica ---------------
@dataclass(frozen=True)
class DataWrite(Message):
    """To the other machines' leaders: the first ``nbytes`` of the master's ``segment``
    follow, broadcast straight into each machine's replica."""

    segment: str
    nbytes: int


@dataclass(frozen=True)
class DataSetItem(Message):
    """To the other machines' leaders: ``replica[key] = value`` (``x[key] = value``)."""

    segment: str
    dtype: str
    shape: tuple[int, ...]
    key: Any
    value: Any


@dataclass(frozen=True)
class DataRows(Message):
    """To the other machines' leaders: each machine's rows (``bounds[machine]``) of the
    master's ``segment`` follow, scattered between leaders (a function's staged input,
    of which each machine takes only its own rows)."""

    segment: str
    dtype: str
    shape: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]


def _apply_write(ctx: RankContext, message: DataWrite) -> None:
    buffer = ctx.arena.map(message.segment)
    leaders = leaders_of(ctx)
    assert leaders is not None
    leaders.broadcast(np.frombuffer(buffer, np.uint8, message.nbytes))


def _apply_rows(ctx: RankContext, message: DataRows) -> None:
    view = shmem.array_view(ctx.arena.map(message.segment), message.dtype, message.shape)
    lo, hi = message.bounds[ctx.node]
    leaders = leaders_of(ctx)
    assert leaders is not None
    received = leaders.scatter(None, root=0)
    view[lo:hi] = received.view(view.dtype).reshape((hi - lo,) + view.shape[1:])


def _apply_set_item(ctx: RankContext, message: DataSetItem) -> None:
    view = shmem.array_view(ctx.arena.map(message.segment), message.dtype, message.shape)
    view[message.key] = message.value


LEADERS_ONLY_HANDLERS: dict[type[Message], Handler] = {
    DataWrite: _apply_write,
    DataSetItem: _apply_set_item,
    DataRows: _apply_rows,
}


def join(ctx: RankContext, message: Join) -> None:
    """Take this process's place among several machines (see ``Join``), and its
    meeting there (``AcrossMachines``)."""
    ctx.node = message.node
    ctx.n_nodes = len(message.offsets)
    ctx.offsets = message.offsets
    ctx.local_sizes = message.local_sizes
    ctx.local_size = message.local_sizes[message.node]
    ctx.rank = message.offsets[message.node] + ctx.local_rank
    ctx.size = sum(message.local_sizes)
    ctx.master_rank = message.master_rank
    ctx.leader_rank = message.leader_rank
    ctx.exact = message.exact
    if ctx.rank != message.leader_rank:  # the leader joined with its link (fork())
        ctx.meeting = AcrossMachines(None)
    if message.node != 0:
        ctx.arena.set_alias(message.master_prefix)


HANDLERS: dict[type[Message], Handler] = {Join: join}  # every process runs these
