"""The link between the machines' leaders (``Machines``), for the several-machines
transport and meeting (``transport.py``).

A session under ``mpiexec`` has one leader per machine; only leaders talk MPI, and only
through this link (its communicator is private). It owns, and knows nothing of what a
command means:

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
- **Ctrl-C** in the master (SPEC 6: the session stays usable) must leave every machine
  in step: the master still takes part in every status round the others take part in,
  with the codes that end the command there. From ``begin`` (the command sent) to the
  end of ``finish`` it *owes* the others the command's end (``owed``). Ctrl-C while it
  waits in a status round (``meet``, ``finish``) is raised at once and leaves the round
  posted (``_await``: an interruptible wait); the next command's ``finish`` waits for
  that round, then posts "ended" until every machine has ended, and throws the replies
  away. Where the others would wait inside a transfer that the master abandoned -- the
  envelope of a command, a ``Data`` write, and everything from ``exchange`` to the end
  of the transfers after it (the next status round, or the end of the master's share:
  ``end_transfers``) -- Ctrl-C is held (``held``, ``_runtime/signals.py``) and raised
  once they are over. A wait that a held Ctrl-C finds still going after
  ``INTERRUPT_GRACE`` (a machine that has not reached the transfer, a transfer that
  long) is the one state that cannot be kept: the ``KeyboardInterrupt`` is raised with a
  note, the link is broken, and ``close()`` ends the job.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np

from .._core.execute import Outcome
from .._core.protocol import Message
from .._runtime import signals
from .._runtime.memo import Decoded, Memo
from .._runtime.remote import BarrierAborted
from ..errors import WorkerDiedError, WorkerTimeoutError
from . import mpi

__all__ = ["Machines", "COMMAND", "LEADERS_ONLY", "END", "fatal", "INTERRUPT_GRACE"]

COMMAND, LEADERS_ONLY, END = "command", "leaders", "end"
_HERE_YES, _HERE_NO, _ENDED = 0, 1, 2
_RECORD = 1024  # bytes of a status record: code, payload length, payload
_HEAD = 16
_CARRIED = _RECORD - _HEAD  # payload bytes the record itself carries
_IDLE_SPIN = 0.002  # seconds an idle leader spins before it sleeps between commands
#: Seconds a Ctrl-C held during a transfer between machines waits for its end before
#: it breaks the session (SPEC 6: the master raises it within a second).
INTERRUPT_GRACE = 1.0


def fatal(exc: BaseException | None) -> bool:
    """Whether ``exc`` means the session cannot go on (a machine, a process lost)."""
    return isinstance(exc, (mpi.LeaderError, WorkerDiedError, WorkerTimeoutError))


class Machines:
    """One leader's link to the other machines' leaders (see the module docstring).

    Parameters
    ----------
    leaders : synkhronos._machines.mpi.Leaders
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
        #: The master sent a command (``begin``) and has not met the other machines at
        #: its end (``finish``) yet: Ctrl-C left it pending there.
        self.owed = False
        self._in_flight: tuple[Any, np.ndarray] | None = None  # a status round posted,
        # not yet seen complete: (request, every leader's record)
        self._holding = False  # Ctrl-C waits (``signals.hold``): data are moving
        self._local_watch: Callable[[], None] | None = None

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
        """What every wait between machines runs while it polls (None: nothing), with
        the grace of a held Ctrl-C (``INTERRUPT_GRACE``)."""
        self._local_watch = watch
        self._comm.liveness = None if watch is None else self._watch

    def _watch(self) -> None:
        assert self._local_watch is not None
        self._local_watch()
        if self._holding:
            since = signals.held()
            if since is not None and time.monotonic() - since > INTERRUPT_GRACE:
                self._drop_hold()
                interrupt = KeyboardInterrupt()
                interrupt.add_note(
                    f"Ctrl-C came while the machines were moving data between them, and "
                    f"that did not end within {INTERRUPT_GRACE:g} s: the machines are no "
                    f"longer in step, so the synkhronos session is broken (close() ends "
                    f"the MPI job)")
                raise interrupt  # out of the wait: the link is broken (Leaders.wait)

    def close(self, timeout: float) -> None:
        """Leave the machines together (every leader, collective)."""
        self._comm.close(timeout=timeout)

    def abort(self, reason: str, grace: float = 2.0) -> NoReturn:
        """End every machine's processes (does not return)."""
        self._comm.abort(reason, grace=grace)

    def host_of(self, rank: int) -> str:
        return self._comm.host_of(rank)

    # -- Ctrl-C while data move between machines -----------------------------------------
    def _hold(self) -> None:
        if not self._holding:
            self._holding = True  # (first: a Ctrl-C between the two is raised at once)
            signals.hold()

    def _release(self) -> None:
        """Stop holding Ctrl-C; raise the ``KeyboardInterrupt`` held meanwhile."""
        if self._holding:
            self._holding = False
            signals.release()

    def _drop_hold(self) -> None:
        """Stop holding Ctrl-C, dropping one held meanwhile (an error goes up instead)."""
        self._holding = False
        signals.release(raise_held=False)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Ctrl-C waits until the block has ended, then is raised: the block moves data
        that the other leaders wait to move with this one. A wait in it that a held
        Ctrl-C finds past ``INTERRUPT_GRACE`` breaks the link instead."""
        self._hold()
        try:
            yield
        except BaseException:
            self._drop_hold()
            raise
        self._release()

    def end_transfers(self, raise_held: bool = True) -> None:
        """The master's share of a command has ended: a hold that ``exchange`` began ends
        (its transfers are over), and a Ctrl-C held meanwhile is raised (unless not
        ``raise_held``: the share raised, and that goes up instead)."""
        if raise_held:
            self._release()
        elif self._holding:
            self._drop_hold()

    # -- commands ----------------------------------------------------------------------
    def begin(self, message: Message, journal: tuple, key: Any = None) -> None:
        """The master: ``message``, a command, to every other leader; once it left, the
        master owes them the command's end (``owed``) whatever interrupts it."""
        self._hold()  # (``held``, written out: every command comes here)
        try:
            self.send(COMMAND, message, journal, key)
        except BaseException:
            self._drop_hold()
            raise
        self.owed = True
        self._release()

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
    def _fill(self, code: int, payload: bytes = b"") -> np.ndarray:
        """This leader's record of a status round: ``code``, then ``payload``."""
        self._release()  # the transfers after an exchange are over (a held Ctrl-C: here)
        assert self._in_flight is None, "a status round is still in flight"
        record, head = self._record, self._head
        head[0] = code
        head[1] = len(payload)
        carried = min(len(payload), _CARRIED)
        if carried:
            record[_HEAD:_HEAD + carried] = np.frombuffer(payload, np.uint8, carried)
        return record

    def _post(self, code: int, payload: bytes = b"") -> None:
        """Post a status round that Ctrl-C may leave in flight (``_await``)."""
        record = self._fill(code, payload)
        self._hold()  # posted and noted as in flight: one step for Ctrl-C
        try:
            self._in_flight = self._comm.post_all_gather_fixed(record)
        except BaseException:
            self._drop_hold()
            raise
        self._release()

    def _await(self, timeout: float | None = None) -> np.ndarray:
        """Every leader's record of the status round in flight, ``(machines,
        _RECORD)``, once complete. Ctrl-C leaves it in flight, for ``finish``."""
        assert self._in_flight is not None
        request, every = self._in_flight
        self._comm.wait([request], "exchanging status between machines",
                        timeout=timeout, keep=[self._record, every], interruptible=True)
        return every

    @staticmethod
    def _codes(records: np.ndarray) -> np.ndarray:
        return records[:, :_HEAD].view(np.int64)

    def meet(self, ok: bool) -> bool:
        """Every leader's vote at a meeting point: whether all passed ``ok``.

        Ctrl-C while the master waits here leaves the round in flight (``finish``
        completes it): the vote is cast, and nothing but status rounds follows it."""
        self._post(_HERE_YES if ok else _HERE_NO)
        codes = self._codes(self._await())[:, 0]
        self._in_flight = None
        if (codes == _ENDED).any():
            raise BarrierAborted("another machine stopped before this meeting point")
        return bool((codes == _HERE_YES).all())

    def exchange(self) -> None:
        """Before moving data between machines: every machine is here (or raise).

        From this round to the end of the transfers that follow it (the next status
        round, or the end of the master's share: ``end_transfers``) Ctrl-C waits
        (``held``): once every machine has said it is here, each starts the transfers,
        which none can finish without the others."""
        record = self._fill(_HERE_YES)
        self._hold()
        try:
            codes = self._codes(self._comm.all_gather_fixed(record))[:, 0]
        except BaseException:
            self._drop_hold()
            raise
        if (codes == _ENDED).any():
            self._release()  # no transfer follows
            raise BarrierAborted("another machine stopped before this exchange")

    def finish(self, payload: bytes = b"", timeout: float | None = None
               ) -> list[bytes] | None:
        """The end of a command on this machine: wait until every machine has ended;
        the master gets every machine's ``payload`` (its replies), by machine.

        On the master, Ctrl-C while it waits for the others leaves the command
        ``owed`` (and a status round perhaps in flight): a later ``finish`` takes up
        from there. ``timeout``: seconds a status round may wait (else the leaders'
        own limit)."""
        self._release()
        while True:
            if self._in_flight is None:
                self._post(_ENDED, payload)
            records = self._await(timeout)
            self._hold()  # seen complete, and what follows, as one step for Ctrl-C
            self._in_flight = None
            heads = self._codes(records)
            if (heads[:, 0] == _ENDED).all():
                break
            self._release()
        try:
            lengths = [int(length) for length in heads[:, 1]]
            rest = None
            if max(lengths) > _CARRIED:  # every leader sees it: a gather for the rest
                rest = self._comm.gather(np.frombuffer(payload[_CARRIED:], np.uint8),
                                         root=0)
        except BaseException:
            self._drop_hold()
            raise
        self.owed = False
        replies = None if self.node != 0 else [
            records[m, _HEAD:_HEAD + min(length, _CARRIED)].tobytes()
            + (rest[m].tobytes() if rest is not None and length > _CARRIED else b"")
            for m, length in enumerate(lengths)]
        self._release()
        return replies

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
