"""Several machines: the transport over them, the meeting across them, and the link
between their leaders.

A session under ``mpiexec`` has one leader per machine (the master on machine 0); only
leaders talk MPI, and only through ``Machines`` (its communicator is private). This
module owns everything the core needs of several machines:

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

The link between leaders (``Machines``) owns, and knows nothing of what a command means:

- **Commands** (``send``, ``receive``): the master broadcasts each command to the
  other leaders in an *envelope*: the arena's journal since the last one (replicas to
  create, copy, release), the kind (a command for every process, a message for the
  leaders alone, or the end), and the message -- or, for a message that repeats, only
  its id (``_runtime/memo.py``, the control block's memo: each leader keeps what it
  decoded, and empties it when the master's memo was emptied).
- **Meeting points** (``meet``, ``exchange``, ``finish``): inside a command the leaders
  stay in step through one all-gather of a fixed-size record
  (``Leaders.all_gather_fixed``) holding a status code: 0 "here, yes", 1 "here, no" (a
  vote), 2 "my machine has ended this command". ``meet`` is a vote, and raises
  ``BarrierAborted`` when another machine has ended (it failed before this point);
  ``exchange`` comes before every transfer of data between machines, so none starts
  unless every machine reached it; ``finish`` repeats status 2 until every machine has
  ended. A machine that fails early thus meets the others at their next meeting
  point, and every machine leaves the command together -- never one in a transfer
  while another waits elsewhere. Every status round is the same collective with the
  same sizes, whatever each leader is doing, as MPI requires.
- **Replies**: the record of ``finish`` carries each machine's replies (pickled, by
  global rank), so a command ends in one collective; replies longer than the record
  follow in a gather to the master.
- **Failures** (``report``, ``error``): another machine's leader reports what broke
  there (a worker died or did not finish in time, or the leader failed); the master turns it, and
  MPI's own errors (a lost machine under ULFM, a timeout between machines), into
  ``WorkerDiedError`` / ``WorkerTimeoutError`` naming the host.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from .._runtime import mpi, shmem
from .._runtime.memo import Decoded, Memo
from .._runtime.remote import BarrierAborted
from ..errors import WorkerDiedError, WorkerTimeoutError
from .context import RankContext
from .execute import Handler, Outcome
from .group import LocalGroup, Share
from .protocol import Join, Message
from .transport import First, Transport, merge, root_failure

__all__ = ["Machines", "Several", "AcrossMachines", "COMMAND", "LEADERS_ONLY", "END",
           "fatal", "HANDLERS", "LEADERS_ONLY_HANDLERS", "DataWrite", "DataRows",
           "DataSetItem", "join", "leaders_of"]

COMMAND, LEADERS_ONLY, END = "command", "leaders", "end"
_HERE_YES, _HERE_NO, _ENDED = 0, 1, 2
_RECORD = 1024  # bytes of a status record: code, payload length, payload
_HEAD = 16
_CARRIED = _RECORD - _HEAD  # payload bytes the record itself carries
_IDLE_SPIN = 0.002  # seconds an idle leader spins before it sleeps between commands


def fatal(exc: BaseException | None) -> bool:
    """Whether ``exc`` means the session cannot go on (a machine, a process lost)."""
    return isinstance(exc, (mpi.LeaderError, WorkerDiedError, WorkerTimeoutError))


class Machines:
    """One leader's link to the other machines' leaders (see the module docstring).

    Parameters
    ----------
    leaders : synkhronos._runtime.mpi.Leaders
        Started, with the machine table.
    """

    def __init__(self, leaders: mpi.Leaders):
        self._comm = leaders
        self.node = leaders.rank
        self.n = leaders.size
        self.hosts = leaders.hosts
        self.pids = leaders.pids
        self.local_sizes = leaders.local_sizes
        self.offsets = leaders.offsets
        self.total = leaders.total
        self._record = np.zeros(_RECORD, np.uint8)
        self._head = self._record[:_HEAD].view(np.int64)
        self._memo = Memo()  # master: repeated message -> id
        self._decoded = Decoded(size=None)  # other leaders: id -> message (emptied when told)

    @property
    def host(self) -> str:
        return self.hosts[self.node]

    # -- the communicator's own operations, for the core's modules ---------------------
    def broadcast(self, buffer: Any, root: int = 0) -> Any:
        return self._comm.broadcast(buffer, root=root)

    def scatter(self, arrays: Any, root: int = 0) -> Any:
        return self._comm.scatter(arrays, root=root)

    def gather(self, array: Any, root: int = 0) -> Any:
        return self._comm.gather(array, root=root)

    def all_reduce(self, *args: Any, **kwargs: Any) -> Any:
        return self._comm.all_reduce(*args, **kwargs)

    def all_reduce_pieces(self, *args: Any, **kwargs: Any) -> Any:
        return self._comm.all_reduce_pieces(*args, **kwargs)

    def check_alarms(self) -> None:
        """Raise if another machine reported a failure, or the job is ending."""
        self._comm.check_alarms()

    def ends_command(self, own: Outcome) -> bool:
        """Whether this leader's failed share ends the command at once (a machine or a
        process lost, or the link broken), rather than after its workers."""
        return fatal(own.exception) or self._comm.broken is not None

    @property
    def broken(self) -> str | None:
        """What broke the link between machines so far, or None."""
        return self._comm.broken

    def set_liveness(self, watch: Callable[[], None] | None) -> None:
        """What every wait between machines runs while it polls (None: nothing)."""
        self._comm.liveness = watch

    def close(self, timeout: float) -> None:
        """Leave the machines together (every leader, collective)."""
        self._comm.close(timeout=timeout)

    def abort(self, reason: str, grace: float = 2.0) -> NoReturn:
        """End every machine's processes (does not return)."""
        self._comm.abort(reason, grace=grace)

    def host_of(self, rank: int) -> str:
        return self._comm.host_of(rank)

    # -- commands ----------------------------------------------------------------------
    def send(self, kind: str, message: Any, journal: tuple, key: Any = None) -> None:
        """The master: an envelope to every other leader (collective)."""
        ident, reset = 0, False
        if key is not None:
            try:
                entry = self._memo.find(key)
            except TypeError:  # not hashable after all
                entry, key = None, None
            if entry is not None:
                self._comm.broadcast_object((journal, kind, entry[0], None, False))
                return
            if key is not None:
                ident, reset = self._memo.add(key)
        self._comm.broadcast_object((journal, kind, ident, message, reset))

    def receive(self) -> tuple[tuple, str, int, Any]:
        """Another leader: the next envelope, ``(journal, kind, id, message)``; waits
        without a time limit (the master may be busy with other work)."""
        journal, kind, ident, message, reset = self._comm.broadcast_object(
            spin=_IDLE_SPIN, timeout=math.inf)
        if reset:
            self._decoded.clear()
        if ident:
            if message is None:
                message = self._decoded[ident]
            else:
                self._decoded.put(ident, message)
        return journal, kind, ident, message

    # -- meeting points inside a command -----------------------------------------------
    def _round(self, code: int, payload: bytes = b"") -> np.ndarray:
        """One status round: every leader's record, ``(machines, _RECORD)``."""
        record, head = self._record, self._head
        head[0] = code
        head[1] = len(payload)
        carried = min(len(payload), _CARRIED)
        if carried:
            record[_HEAD:_HEAD + carried] = np.frombuffer(payload, np.uint8, carried)
        return self._comm.all_gather_fixed(record)

    @staticmethod
    def _codes(records: np.ndarray) -> np.ndarray:
        return records[:, :_HEAD].view(np.int64)

    def meet(self, ok: bool) -> bool:
        """Every leader's vote at a meeting point: whether all passed ``ok``."""
        codes = self._codes(self._round(_HERE_YES if ok else _HERE_NO))[:, 0]
        if (codes == _ENDED).any():
            raise BarrierAborted("another machine stopped before this meeting point")
        return bool((codes == _HERE_YES).all())

    def exchange(self) -> None:
        """Before moving data between machines: every machine is here (or raise)."""
        if (self._codes(self._round(_HERE_YES))[:, 0] == _ENDED).any():
            raise BarrierAborted("another machine stopped before this exchange")

    def finish(self, payload: bytes = b"") -> list[bytes] | None:
        """The end of a command on this machine: wait until every machine has ended;
        the master gets every machine's ``payload`` (its replies), by machine."""
        while True:
            records = self._round(_ENDED, payload)
            heads = self._codes(records)
            if (heads[:, 0] == _ENDED).all():
                break
        lengths = [int(length) for length in heads[:, 1]]
        rest = None
        if max(lengths) > _CARRIED:  # every leader sees it: a gather for the rest
            rest = self._comm.gather(np.frombuffer(payload[_CARRIED:], np.uint8), root=0)
        if self.node != 0:
            return None
        return [records[m, _HEAD:_HEAD + min(length, _CARRIED)].tobytes()
                + (rest[m].tobytes() if rest is not None and length > _CARRIED else b"")
                for m, length in enumerate(lengths)]

    # -- failures ------------------------------------------------------------------------
    def report(self, exc: BaseException) -> None:
        """Another leader: tell the master what broke here (best effort)."""
        if isinstance(exc, WorkerDiedError):
            info = {"kind": "died", "rank": exc.rank, "pid": exc.pid, "reason": exc.reason}
        elif isinstance(exc, WorkerTimeoutError):
            info = {"kind": "timeout", "rank": exc.rank, "pid": exc.pid,
                    "timeout": exc.timeout}
        else:
            info = {"kind": "leader", "reason": f"{type(exc).__name__}: {exc}"}
        self._comm.report_failure(json.dumps(info))

    def error(self, exc: BaseException) -> BaseException:
        """The master: what a failure between machines means to the caller.

        A report from another machine, or MPI's word that a machine was lost, becomes
        ``WorkerDiedError`` (or ``WorkerTimeoutError``) naming the host; anything else
        is returned as it is.
        """
        if isinstance(exc, mpi.RemoteFailureError):
            try:
                info = json.loads(exc.report)
            except ValueError:
                info = {"kind": "leader", "reason": exc.report}
            if info.get("kind") == "died":
                return WorkerDiedError(info["rank"], info["pid"], info["reason"], exc.host)
            if info.get("kind") == "timeout":
                return WorkerTimeoutError(info["rank"], info["pid"], info["timeout"],
                                          exc.host)
            return WorkerDiedError(self.offsets[exc.rank], self.pids[exc.rank],
                                   f"its machine's leader failed: {info.get('reason')}",
                                   exc.host)
        if isinstance(exc, mpi.PeerLostError):
            if exc.ranks:
                machine = exc.ranks[0]
                return WorkerDiedError(self.offsets[machine], self.pids[machine],
                                       f"machine {machine} was lost ({exc})",
                                       self.hosts[machine])
            return WorkerDiedError(-1, 0, str(exc), ", ".join(exc.hosts) or None)
        if isinstance(exc, mpi.LeaderTimeoutError):
            others = range(1, self.n)
            return WorkerTimeoutError(self.offsets[1], self.pids[1],
                                      self._comm.timeout or 0.0,
                                      ", ".join(self.hosts[m] for m in others))
        return exc



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

    interrupt_breaks = True  # a command half done on other machines cannot be kept
    close_on_failure = False  # the exception goes up first; close() then ends the job

    def __init__(self, group: LocalGroup, machines: Machines):
        super().__init__(group)
        self.round_again = None  # every command goes to the other machines first (run)
        self._machines = machines
        self._healthy = False
        self.replica_groups = tuple(zip(machines.offsets, machines.local_sizes, strict=True))
        group.host = machines.host
        group.also = machines.check_alarms  # another machine's report, while waiting here
        machines.set_liveness(group.watch)

    def run(self, message: Message, own_share: Share, key: Any
            ) -> tuple[list[Any], Outcome, First]:
        machines, group = self._machines, self.group
        machines.send(COMMAND, message, group.ctx.arena.take_journal(), key)
        local, own, parts = group.round(
            message, own_share, key, fatal=machines.ends_command)
        replies: list[Any] = [None] * group.ctx.size
        replies[local] = own.reply
        first = merge(replies, parts, None, 0)  # on machine 0, local ranks are global
        others = machines.finish()
        assert others is not None
        for part in others[1:]:
            for rank, failed, value in pickle.loads(part):
                if failed:
                    first = root_failure(first, rank, value)
                else:
                    replies[rank] = value
        return replies, own, first

    def error(self, exc: BaseException) -> BaseException:
        return self._machines.error(exc)

    def _to_leaders(self, message: Message) -> None:
        """``message`` to the other leaders alone (their workers are not woken), with
        the arena's journal, as every command."""
        self._machines.send(LEADERS_ONLY, message, self.group.ctx.arena.take_journal())

    def publish_values(self, segment: str, buffer: Any) -> None:
        nbytes = len(buffer)
        self._to_leaders(DataWrite(segment, nbytes))
        self._machines.broadcast(buffer)

    def publish_rows(self, segment: str, view: Any, bounds: list[tuple[int, int]]) -> None:
        empty = np.empty(0, np.uint8)
        parts = [view[lo:hi].reshape(-1).view(np.uint8) if copy else empty
                 for copy, (lo, hi) in enumerate(bounds)]
        self._to_leaders(DataRows(segment, view.dtype.str, view.shape, tuple(bounds)))
        self._machines.scatter(parts, root=0)

    def publish_item(self, segment: str, view: Any, key: Any, value: Any) -> bool:
        message = DataSetItem(segment, view.dtype.str, view.shape, key, np.asarray(value))
        try:
            pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a key that does not pickle: the caller sends the values
            return False
        self._to_leaders(message)
        return True

    def begin_close(self, orderly: bool) -> None:
        self._healthy = orderly and self._machines.broken is None
        self._closing: BaseException | None = None
        if self._healthy:
            try:
                self._machines.send(END, None, ())
            except BaseException as exc:  # the others cannot be reached: abort at the end
                self._healthy = False
                self._closing = exc

    def end_close(self, broken: BaseException | None) -> None:
        """After this machine is clean: leave MPI with the others, or end the job."""
        machines = self._machines
        broken = getattr(self, "_closing", None) or broken
        if self._healthy:
            machines.set_liveness(None)  # the workers are gone, as they should be
            try:
                machines.close(timeout=30.0)
                return
            except BaseException as exc:
                broken = exc
        reason = (f"{type(broken).__name__}: {broken}" if broken is not None
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
