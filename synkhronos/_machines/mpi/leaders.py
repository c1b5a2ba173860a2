"""The node leaders' MPI communicator: start, the machine table, waits, failure, end.

This module and its base class's (``exchange.py``: the collectives, what travels
between machines) make every MPI call synkhronos makes; this one owns the rest:
``MPI_Init`` and the machine table (:func:`start`), the communicators, the wait that
every operation ends in, the alarm channel, failure reports, abort and finalisation.
Only node leaders (one process per machine, MPI rank = machine index) call it; their
local workers were forked before ``MPI_Init`` and never touch MPI. Numpy buffers and
small pickled objects go in and out; nothing here knows about PyTensor, sessions or
shared-memory segments.

How a wait works (every primitive ends in one): the operation is posted as
nonblocking requests, then :meth:`Leaders.wait` tests them in a loop. Between tests
it yields the core (``sched_yield``) for ``spin`` seconds, then sleeps with a growing
pause (at most 1 ms). Every ``CHECK_INTERVAL`` seconds it also

1. calls the caller's ``liveness`` callback (the core checks its local workers there;
   whatever it raises propagates),
2. reads the alarm channel: on the master, a failure another leader reported with
   :meth:`Leaders.report_failure` becomes :class:`RemoteFailureError`; on the other
   leaders, the master's :meth:`Leaders.abort` becomes :class:`JobAbortedError`,
3. checks the optional timeout (:class:`LeaderTimeoutError`).

An MPI error saying a process failed (Open MPI's ULFM, ``mpiexec --with-ft ulfm``)
becomes :class:`PeerLostError` naming the lost ranks and their hosts, after the
communicator is revoked so every other leader's pending wait fails too instead of
hanging. Without ULFM the MPI runtime ends the whole job when any rank dies: Open MPI
sends SIGTERM (the session's handler turns it into ``SystemExit(143)``, to which the
wait adds a note saying why) and later SIGKILL; MPICH sends SIGKILL at once.

Any exception out of a wait leaves the leaders *broken* (``Leaders.broken`` says why):
the other leaders may be inside the same collective, so no later operation is
possible; the way out is :meth:`Leaders.abort`. The one exception is a
``KeyboardInterrupt`` in a wait the caller declares ``interruptible``: its requests
stay posted, and the caller waits for them again later (the core does so for the
status rounds between machines, so that Ctrl-C keeps a session). Buffers of
abandoned requests are kept alive until the process ends, so MPI never writes into
freed memory.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from .errors import (
    JobAbortedError,
    LeaderError,
    LeaderTimeoutError,
    MPIUnavailableError,
    PeerLostError,
    RemoteFailureError,
    import_mpi,
    ulfm_enabled,
)
from .exchange import Exchange

__all__ = ["CHECK_INTERVAL", "Leaders", "start"]

log = logging.getLogger("synkhronos")

CHECK_INTERVAL = 0.01  # seconds between liveness/alarm/timeout checks inside a wait
_MAX_SLEEP = 1e-3  # the longest pause between two tests once spinning is over
_DETECTOR_WAIT = 2.0  # seconds to let ULFM name a failed process after a transport error
_TAG_FAILURE = 11  # another leader -> master: a failure on that machine (utf-8 text)
_TAG_ABORT = 12  # master -> other leaders: end the job (utf-8 reason)
_TAG_ACK = 13  # other leader -> master: my machine is clean, kill me when you like
_FAILURE_CLASSES = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")


@dataclass
class Leaders(Exchange):
    """This machine's leader in the job: who the machines are, and how to talk to them.

    Made by :func:`start`; one per process. ``hosts``, ``local_sizes``, ``pids`` and
    ``offsets`` are indexed by leader rank (machine index). The collectives come from
    :class:`~.exchange.Exchange`, through the interface it declares (``MPI``, ``comm``,
    ``p2p``, :meth:`check_usable`, :meth:`wait`).

    Attributes
    ----------
    rank, size : int
        This machine's index and the number of machines (MPI ranks).
    hosts : tuple of str
        Every machine's host name (``socket.gethostname()`` on it).
    local_sizes : tuple of int
        Processes on every machine (leader included).
    pids : tuple of int
        Every leader's process id.
    offsets : tuple of int
        Global rank of every machine's first process: ranks are numbered machine by
        machine, so machine ``m``'s processes are ``offsets[m] .. offsets[m] +
        local_sizes[m] - 1``.
    total : int
        Processes in the whole job.
    ulfm : bool
        Whether Open MPI's fault tolerance is on (process failures are reported
        instead of ending the job).
    library : str
        The MPI library's version line.
    liveness : callable or None
        Called with no argument every ``CHECK_INTERVAL`` seconds inside each wait;
        raise from it to stop waiting (e.g. a local worker died).
    timeout : float or None
        Default limit in seconds of every wait (None: no limit).
    spin : float
        Seconds a wait tests without sleeping (yielding the core) before it sleeps.
    fast_chunked_from : int
        Bytes from which ``all_reduce(mode="fast")`` uses the chunk-owner scheme
        instead of the MPI library's all-reduce.
    broken : str or None
        Why no further operation is possible, once a wait failed.
    """

    rank: int
    size: int
    hosts: tuple[str, ...]
    local_sizes: tuple[int, ...]
    pids: tuple[int, ...]
    ulfm: bool
    library: str
    liveness: Callable[[], None] | None = None
    timeout: float | None = None
    spin: float = 0.05
    fast_chunked_from: int = 1 << 20
    broken: str | None = None
    MPI: Any = field(default=None, repr=False)
    comm: Any = field(default=None, repr=False)  # collectives
    p2p: Any = field(default=None, repr=False)  # exact all-reduce's sends
    _alarm: Any = field(default=None, repr=False)  # failure reports, abort notices
    _abandoned: list = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    _failed_ranks: set = field(default_factory=set, repr=False)
    _next_check: float = field(default=0.0, repr=False)  # when waits check again

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(int(x) for x in np.cumsum((0,) + self.local_sizes[:-1]))

    @property
    def total(self) -> int:
        return sum(self.local_sizes)

    @property
    def host(self) -> str:
        """This machine's host name."""
        return self.hosts[self.rank]

    @property
    def is_master(self) -> bool:
        """True on the master's machine (rank 0)."""
        return self.rank == 0

    def host_of(self, global_rank: int) -> str:
        """The host that runs process ``global_rank`` of the whole job."""
        for machine, offset in enumerate(self.offsets):
            if offset <= global_rank < offset + self.local_sizes[machine]:
                return self.hosts[machine]
        raise ValueError(f"global rank {global_rank} is outside 0..{self.total - 1}")

    # ---- waiting -------------------------------------------------------------------

    def check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("the leaders' MPI communicator is closed")
        if self.broken is not None:
            raise LeaderError(f"no operation between machines is possible any more: "
                              f"{self.broken}; call abort()")

    def wait(self, requests: list, what: str, *, timeout: float | None = None,
             spin: float | None = None, keep: Sequence[Any] = (),
             interruptible: bool = False) -> None:
        """Test ``requests`` until all are complete; see the module docstring.

        ``keep`` holds the buffers the requests use, kept alive if the wait fails.
        ``interruptible``: a ``KeyboardInterrupt`` leaves the requests posted and the
        leaders usable; the caller, which keeps the requests and their buffers, waits
        for them again later (a request already complete tests complete again).
        """
        MPI = self.MPI
        timeout = self.timeout if timeout is None else timeout
        spin = self.spin if spin is None else spin
        start = time.monotonic()
        # checks come every CHECK_INTERVAL of waiting, counted across waits: a loop of
        # short waits checks as often as one long wait, and not at every wait (the
        # caller's liveness and the alarm channel cost more than a round of tests)
        next_check = self._next_check
        pause = 0.0
        pending = list(requests)
        try:
            while True:
                # one request at a time: each failure keeps its own error class
                pending = [r for r in pending if not r.Test()]
                if not pending:
                    return
                now = time.monotonic()
                if now >= next_check:
                    if self._alarm is not None:
                        self._read_alarms()
                    if self.liveness is not None:
                        self.liveness()
                    if timeout is not None and now - start > timeout:
                        raise LeaderTimeoutError(
                            f"{what} did not finish within {timeout:g} s "
                            f"(machines: {', '.join(self.hosts)})", self.hosts)
                    next_check = self._next_check = now + CHECK_INTERVAL
                if now - start < spin:
                    os.sched_yield()
                else:
                    pause = min(max(2 * pause, 2e-5), _MAX_SLEEP)
                    time.sleep(pause)
        except MPI.Exception as exc:
            self._abandon(requests, keep, f"{what} failed")
            raise self._translate(exc, what) from exc
        except BaseException as exc:
            if interruptible and isinstance(exc, KeyboardInterrupt):
                raise
            self._abandon(requests, keep, f"{what} was interrupted by "
                                          f"{type(exc).__name__}: {exc}")
            if isinstance(exc, SystemExit) and exc.code == 143 and self.size > 1:
                exc.add_note(self._terminated_note())
            raise

    def _abandon(self, requests: list, keep: Sequence[Any], reason: str) -> None:
        self._abandoned.append((requests, keep))
        if self.broken is None:
            self.broken = reason

    def _terminated_note(self) -> str:
        if self.ulfm:
            return "SIGTERM came while the machines were exchanging data"
        return ("SIGTERM came while the machines were exchanging data: without fault "
                "tolerance the MPI runtime ends the whole job when any machine's leader "
                "dies; Open MPI's 'mpiexec --with-ft ulfm' reports the lost host instead")

    def _translate(self, exc: Any, what: str) -> Exception:
        """An MPI error as PeerLostError (naming hosts) or LeaderError."""
        MPI = self.MPI
        error_class = exc.Get_error_class()
        failure = {getattr(MPI, name, None) for name in _FAILURE_CLASSES} - {None}
        ranks = self._failed()
        if error_class not in failure and not ranks and self.ulfm:
            # a transport error (e.g. Open MPI's TCP: a closed socket) may come before
            # ULFM's detector has named the failed process: give it a moment
            deadline = time.monotonic() + _DETECTOR_WAIT
            while not ranks and time.monotonic() < deadline:
                time.sleep(0.01)
                ranks = self._failed()
        if error_class not in failure and not ranks:
            return LeaderError(f"{what} failed in MPI: {exc.Get_error_string()}")
        for comm in (self.comm, self.p2p, self._alarm):
            if comm is None:
                continue
            try:
                comm.Revoke()  # everyone else's pending wait fails now, not never
            except Exception:  # already revoked, or no ULFM: nothing more to do
                log.debug("revoking a leaders' communicator failed", exc_info=True)
        hosts = [self.hosts[r] for r in ranks]
        if ranks:
            names = ", ".join(f"machine {r} ({h})" for r, h in zip(ranks, hosts, strict=True))
            message = f"{what} failed: lost {names}"
        else:
            message = (f"{what} failed: another machine lost a process "
                       f"({exc.Get_error_string()})")
        return PeerLostError(message, ranks, hosts)

    def _failed(self) -> list[int]:
        """Ranks ULFM reports as failed (empty if the library cannot say)."""
        MPI = self.MPI
        for comm in (self.comm, self.p2p, self._alarm):
            if comm is None:
                continue
            try:
                group = comm.Get_failed()
            except Exception:
                continue
            try:
                count = group.Get_size()
                ranks = MPI.Group.Translate_ranks(group, list(range(count)),
                                                  comm.Get_group())
            finally:
                group.Free()
            self._failed_ranks.update(int(r) for r in ranks)
        return sorted(self._failed_ranks)

    def check_alarms(self) -> None:
        """Raise what the alarm channel holds, as a wait would: on the master a failure
        another leader reported (:class:`RemoteFailureError`), elsewhere the master's
        abort notice (:class:`JobAbortedError`). For callers waiting outside MPI (a
        leader waiting for its local workers). Does nothing once closed."""
        if self._alarm is not None and not self._closed:
            self._read_alarms()

    def _read_alarms(self) -> None:
        """Raise a reported failure (master) or an abort notice (other leaders)."""
        MPI = self.MPI
        status = MPI.Status()
        if self.is_master:
            if self._alarm.Iprobe(MPI.ANY_SOURCE, _TAG_FAILURE, status):
                source = status.Get_source()
                report = self._receive_text(source, _TAG_FAILURE, status)
                raise RemoteFailureError(source, self.hosts[source], report)
        elif self._alarm.Iprobe(0, _TAG_ABORT, status):
            reason = self._receive_text(0, _TAG_ABORT, status)
            raise JobAbortedError(f"the master ({self.hosts[0]}) ends the job: {reason}",
                                  (self.hosts[0],))

    def _receive_text(self, source: int, tag: int, status) -> str:
        buffer = np.empty(status.Get_count(self.MPI.BYTE), np.uint8)
        self._alarm.Recv([buffer, self.MPI.BYTE], source, tag)
        return buffer.tobytes().decode("utf-8", "replace")

    # ---- failure and end -----------------------------------------------------------

    def report_failure(self, report: str, *, timeout: float = 2.0) -> None:
        """Tell the master that something failed on this machine (not on the master).

        The master's current or next wait raises :class:`RemoteFailureError` with
        ``report`` and this host. Works while this leader is broken; returns once the
        message left (or after ``timeout`` s).
        """
        if self.is_master:
            raise RuntimeError("report_failure is for the other machines' leaders; the "
                               "master raises its own errors")
        data = np.frombuffer(report.encode("utf-8"), np.uint8).copy()
        request = self._alarm.Isend([data, self.MPI.BYTE], 0, _TAG_FAILURE)
        self._settle([request], timeout, keep=[data])

    def _settle(self, requests: list, timeout: float, keep: Sequence[Any]) -> bool:
        """Best-effort wait used on failure paths: no alarms, errors ignored."""
        deadline = time.monotonic() + timeout
        try:
            while not self.MPI.Request.Testall(requests):
                if time.monotonic() > deadline:
                    self._abandoned.append((requests, keep))
                    return False
                time.sleep(1e-3)
        except self.MPI.Exception:
            self._abandoned.append((requests, keep))
            return False
        return True

    def abort(self, reason: str, code: int = 1, *, grace: float = 2.0) -> NoReturn:
        """End the whole job; never returns. Call once this machine is cleaned up.

        On the master: every other leader is told (its waits raise
        :class:`JobAbortedError`, so its core can stop its workers and sweep its
        segments, then call ``abort`` itself); the master waits up to ``grace`` seconds
        for them to say they are done, then calls ``MPI_Abort``, which makes the
        launcher kill every remaining process and exit with a non-zero status.
        On another leader: tells the master this machine is clean, and waits up to
        ``grace`` seconds for the master's ``MPI_Abort`` before calling it itself (at
        once if the master is known to be lost).
        """
        if self.broken is None:
            self.broken = f"aborted: {reason}"
        text = np.frombuffer(reason.encode("utf-8"), np.uint8).copy()
        MPI = self.MPI
        if self.is_master:
            others = [r for r in range(1, self.size) if r not in self._failed_ranks]
            requests = [self._alarm.Isend([text, MPI.BYTE], r, _TAG_ABORT) for r in others]
            self._settle(requests, grace, keep=[text])
            self._collect_acks(others, grace)
            log.error("ending the MPI job (exit code %d): %s", code, reason)
        elif 0 not in self._failed_ranks:
            request = self._alarm.Isend([text, MPI.BYTE], 0, _TAG_ACK)
            self._settle([request], grace, keep=[text])
            time.sleep(grace)  # the master's MPI_Abort normally kills this process here
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(code)
        os._exit(code)  # MPICH's MPI_Abort can return before the launcher kills us

    def _collect_acks(self, ranks: list[int], grace: float) -> None:
        MPI = self.MPI
        waiting = set(ranks)
        deadline = time.monotonic() + grace
        status = MPI.Status()
        while waiting and time.monotonic() < deadline:
            try:
                if self._alarm.Iprobe(MPI.ANY_SOURCE, _TAG_ACK, status):
                    source = status.Get_source()
                    self._receive_text(source, _TAG_ACK, status)
                    waiting.discard(source)
                    continue
            except MPI.Exception:
                return
            time.sleep(1e-3)

    def _at_exit(self) -> None:
        """The interpreter is leaving without close(): end the job, never hang in it.

        A leader that leaves through Python's exit while the others wait in a
        collective would hang in ``MPI_Finalize`` (run by mpi4py at exit); ending the
        job instead makes the launcher stop everyone.
        """
        if self._closed:
            return
        reason = "a leader left without closing the session"
        if self.broken is None and not self.is_master:
            try:
                self.report_failure(f"the leader on {self.host} exited without close()")
            except Exception:  # best effort: abort below ends the job anyway
                log.debug("reporting the exit failed", exc_info=True)
        log.error("%s (%s): ending the MPI job", reason, self.host)
        self.abort(reason, code=1)

    def close(self, *, timeout: float | None = None) -> None:
        """Leave the job cleanly: a barrier, then ``MPI_Finalize``. Collective.

        Every leader calls it once its machine's workers are stopped; calling it again
        does nothing. After a failure (``broken``) use :meth:`abort` instead: the other
        leaders may be stuck in an operation that can no longer complete.
        """
        if self._closed:
            return
        self.barrier(timeout=timeout)
        for comm in (self.comm, self.p2p, self._alarm):
            comm.Free()
        self._closed = True
        self.MPI.Finalize()


def start(local_size: int, *, liveness: Callable[[], None] | None = None,
          timeout: float | None = None, spin: float = 0.05,
          expected_rank: int | None = None, exit_hook: bool = True) -> Leaders:
    """Initialise MPI in this node leader and meet the other machines' leaders.

    Call it after the local workers are forked (they must never call it). It sets
    ``mpi4py.rc.initialize = False`` and ``rc.finalize = True`` (unless ``mpi4py.MPI``
    was already imported not initialised), calls ``MPI_Init_thread`` asking for
    ``MPI_THREAD_SERIALIZED`` (any thread may call, one at a time), duplicates
    ``COMM_WORLD`` three times (collectives, exact-reduction sends, alarms: the user's
    own MPI traffic never mixes with ours), and exchanges host name, local process
    count and pid between all leaders.

    Parameters
    ----------
    local_size : int
        Processes on this machine, the leader included (>= 1).
    liveness, timeout, spin
        Defaults for the waits; see :class:`Leaders`.
    expected_rank : int, optional
        The rank that launch detection found; a different MPI rank raises.
    exit_hook : bool
        Register an ``atexit`` hook that calls :meth:`Leaders.abort` if the process
        leaves without :meth:`Leaders.close` (a leader leaving through Python's exit
        while others wait would otherwise hang the job in ``MPI_Finalize``). ``atexit``
        runs hooks last-registered first: a session whose own exit hook calls
        ``close()`` must register it after ``start`` returns.

    Returns
    -------
    Leaders

    Raises
    ------
    MPIUnavailableError
        If mpi4py or the MPI library is missing, or MPI is already initialised.
    LeaderError
        If the exchange between leaders fails (e.g. one of them died).
    """
    if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
        raise ValueError(f"local_size must be a positive int; got {local_size!r}")
    MPI = import_mpi()
    if MPI.Is_initialized():
        raise MPIUnavailableError(
            "MPI is already initialised in this process; the node leader must fork its "
            "workers before MPI starts (import mpi4py.MPI only after synk.fork())")
    provided = MPI.Init_thread(MPI.THREAD_SERIALIZED)
    if provided < MPI.THREAD_SERIALIZED:
        log.warning("the MPI library gives thread level %d, below MPI_THREAD_SERIALIZED: "
                    "call synkhronos from one thread only", provided)
    world = MPI.COMM_WORLD
    world.Set_errhandler(MPI.ERRORS_RETURN)
    if expected_rank is not None and world.Get_rank() != expected_rank:
        raise MPIUnavailableError(f"the launcher's environment said rank {expected_rank} but "
                                  f"MPI says {world.Get_rank()}")
    leaders = Leaders(rank=world.Get_rank(), size=world.Get_size(),
                      hosts=(socket.gethostname(),), local_sizes=(local_size,),
                      pids=(os.getpid(),), ulfm=ulfm_enabled(),
                      library=MPI.Get_library_version().splitlines()[0].strip(),
                      liveness=liveness, timeout=timeout, spin=spin, MPI=MPI)
    comms = []
    leaders.comm = leaders.p2p = world  # _translate revokes what it finds here
    for _ in range(3):
        comm, request = world.Idup()
        leaders.wait([request], "starting MPI between the machines", keep=[comm])
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        comms.append(comm)
    leaders.comm, leaders.p2p, leaders._alarm = comms
    mine = (socket.gethostname(), local_size, os.getpid())
    every = leaders.all_gather_objects(mine, timeout=timeout)
    leaders.hosts = tuple(str(e[0]) for e in every)
    leaders.local_sizes = tuple(int(e[1]) for e in every)
    leaders.pids = tuple(int(e[2]) for e in every)
    if exit_hook:
        atexit.register(leaders._at_exit)
    log.debug("MPI leaders: %s", leaders)
    return leaders
