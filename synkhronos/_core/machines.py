"""Several machines: the core's link between machine leaders, over ``_runtime.mpi``.

A session under ``mpiexec`` has one leader per machine (the master on machine 0); only
leaders talk MPI. This module owns what the core needs of that link, and nothing of
what a command means:

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
  there (a worker died, timed out, or the leader failed); the master turns it, and
  MPI's own errors (a lost machine under ULFM, a timeout between machines), into
  ``WorkerDiedError`` / ``WorkerTimeoutError`` naming the host.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .._runtime import mpi
from .._runtime.memo import Decoded, Memo
from .._runtime.remote import BarrierAborted
from ..errors import WorkerDiedError, WorkerTimeoutError

__all__ = ["Machines", "COMMAND", "LEADERS_ONLY", "END", "fatal"]

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
        self.mpi = leaders
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

    def host_of(self, rank: int) -> str:
        return self.mpi.host_of(rank)

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
                self.mpi.broadcast_object((journal, kind, entry[0], None, False))
                return
            if key is not None:
                ident, reset = self._memo.add(key)
        self.mpi.broadcast_object((journal, kind, ident, message, reset))

    def receive(self) -> tuple[tuple, str, int, Any]:
        """Another leader: the next envelope, ``(journal, kind, id, message)``; waits
        without a time limit (the master may be busy with other work)."""
        journal, kind, ident, message, reset = self.mpi.broadcast_object(
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
        return self.mpi.all_gather_fixed(record)

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
            rest = self.mpi.gather(np.frombuffer(payload[_CARRIED:], np.uint8), root=0)
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
        self.mpi.report_failure(json.dumps(info))

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
                                      self.mpi.timeout or 0.0,
                                      ", ".join(self.hosts[m] for m in others))
        return exc
