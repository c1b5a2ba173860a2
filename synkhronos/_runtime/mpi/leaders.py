"""The node leaders' MPI communicator: start, collectives between machines, failure, end.

This module owns every MPI call synkhronos makes. Only node leaders (one process per
machine, MPI rank = machine index) call it; their local workers were forked before
``MPI_Init`` and never touch MPI. Numpy buffers and small pickled objects go in and
out; nothing here knows about PyTensor, sessions or shared-memory segments.

How a wait works (every primitive ends in one): the operation is posted as
nonblocking requests, then :meth:`Leaders._wait` tests them in a loop. Between tests
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
possible; the way out is :meth:`Leaders.abort`. Buffers of abandoned requests are kept
alive until the process ends, so MPI never writes into freed memory.

Two modes of :meth:`Leaders.all_reduce`:

- ``"exact"``: the *chunk-owner scheme*. The elements are split into one chunk per
  leader; leader ``j`` receives every machine's pieces of chunk ``j`` (point to point)
  and folds them in global rank order (``acc = p0; acc = op(acc, p1); ...``, with
  the ufuncs of ``_runtime/reducers.py``, as one machine's ``combine_into`` does),
  then an all-gather spreads the chunks. With every local process's piece passed
  (:meth:`Leaders.all_reduce_pieces`) the result is bit-identical to one machine
  folding all processes in rank order.
- ``"fast"``: the MPI library's ``Iallreduce`` below ``Leaders.fast_chunked_from``
  bytes (1 MiB; its summation order is the library's choice and differed from a
  rank-order fold by rounding at 4 ranks), the chunk-owner scheme from there on, where
  it was the faster of the two here.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

import numpy as np

from ..reducers import ReduceOp, ufunc_of
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

__all__ = ["CHECK_INTERVAL", "Leaders", "chunk_bounds", "start"]

log = logging.getLogger("synkhronos")

CHECK_INTERVAL = 0.01  # seconds between liveness/alarm/timeout checks inside a wait
_MAX_SLEEP = 1e-3  # the longest pause between two tests once spinning is over
_DETECTOR_WAIT = 2.0  # seconds to let ULFM name a failed process after a transport error
_INLINE = 1024  # bytes of a command that travel in the first broadcast (4 KiB was
# slower between two leaders on one host with Open MPI: 100-200 us vs 20-30 us a round)
_HEADER = 40  # int64 slots describing one array: nbytes, ndim, 32 dims, 6 for dtype
_MAX_NDIM = 32
_DTYPE_SLOTS = 6
_TAG_FAILURE = 11  # another leader -> master: a failure on that machine (utf-8 text)
_TAG_ABORT = 12  # master -> other leaders: end the job (utf-8 reason)
_TAG_ACK = 13  # other leader -> master: my machine is clean, kill me when you like
_TAG_EXACT = 21  # exact all-reduce: pieces of a chunk sent to its owner
_OPS = ("sum", "prod", "max", "min")  # "avg" is the caller's sum, then divide
_FAILURE_CLASSES = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` blocks of ``n`` items over ``parts``, the first ones longer.

    The same rule splits rows across processes (SPEC section 3).
    """
    base, extra = divmod(n, parts)
    bounds, lo = [], 0
    for part in range(parts):
        hi = lo + base + (1 if part < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _op_name(op: Any) -> str:
    name = str(getattr(op, "value", op)).lower()
    if name not in _OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, _OPS))} between machines "
                         f"('avg' is 'sum' divided by the caller); got {op!r}")
    return name


def _as_bytes(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array (zero copy)."""
    return array.reshape(-1).view(np.uint8)


def _describe(array: np.ndarray) -> np.ndarray:
    """The int64 header that lets a receiver rebuild ``array``'s dtype and shape."""
    header = np.zeros(_HEADER, np.int64)
    if array.ndim > _MAX_NDIM:
        raise ValueError(f"arrays sent between machines have at most {_MAX_NDIM} dimensions; "
                         f"got {array.ndim}")
    code = array.dtype.str.encode("ascii")
    if array.dtype.hasobject or len(code) > 8 * _DTYPE_SLOTS or array.dtype.fields:
        raise TypeError(f"arrays sent between machines need a plain numeric dtype; "
                        f"got {array.dtype}")
    header[0] = array.nbytes
    header[1] = array.ndim
    header[2:2 + array.ndim] = array.shape
    header[2 + _MAX_NDIM:] = np.frombuffer(code.ljust(8 * _DTYPE_SLOTS, b"\0"), np.int64)
    return header


def _dtype_shape(header: np.ndarray) -> tuple[np.dtype, tuple[int, ...]]:
    code = header[2 + _MAX_NDIM:].tobytes().rstrip(b"\0").decode("ascii")
    ndim = int(header[1])
    return np.dtype(code), tuple(int(d) for d in header[2:2 + ndim])


@dataclass
class Leaders:
    """This machine's leader in the job: who the machines are, and how to talk to them.

    Made by :func:`start`; one per process. ``hosts``, ``local_sizes``, ``pids`` and
    ``offsets`` are indexed by leader rank (machine index).

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
    _mpi: Any = field(default=None, repr=False)
    _comm: Any = field(default=None, repr=False)  # collectives
    _p2p: Any = field(default=None, repr=False)  # exact all-reduce's sends
    _alarm: Any = field(default=None, repr=False)  # failure reports, abort notices
    _abandoned: list = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    _failed_ranks: set = field(default_factory=set, repr=False)
    _next_check: float = field(default=0.0, repr=False)  # when waits check again
    _inline: np.ndarray = field(default_factory=lambda: np.zeros(_INLINE, np.uint8),
                                repr=False)

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

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("the leaders' MPI communicator is closed")
        if self.broken is not None:
            raise LeaderError(f"no operation between machines is possible any more: "
                              f"{self.broken}; call abort()")

    def _wait(self, requests: list, what: str, *, timeout: float | None = None,
              spin: float | None = None, keep: Sequence[Any] = ()) -> None:
        """Test ``requests`` until all are complete; see the module docstring.

        ``keep`` holds the buffers the requests use, kept alive if the wait fails.
        """
        MPI = self._mpi
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
        MPI = self._mpi
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
        for comm in (self._comm, self._p2p, self._alarm):
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
        MPI = self._mpi
        for comm in (self._comm, self._p2p, self._alarm):
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
        MPI = self._mpi
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
        buffer = np.empty(status.Get_count(self._mpi.BYTE), np.uint8)
        self._alarm.Recv([buffer, self._mpi.BYTE], source, tag)
        return buffer.tobytes().decode("utf-8", "replace")

    # ---- objects -------------------------------------------------------------------

    def broadcast_object(self, obj: Any = None, *, timeout: float | None = None,
                         spin: float | None = None) -> Any:
        """The master's ``obj`` on every leader (pickled; e.g. a command).

        Collective over leaders: every leader calls it; only the master's ``obj`` is
        used. Short pickles travel in one broadcast, longer ones in two. ``spin``
        overrides the default for this wait (a leader idling between commands may
        prefer a short spin).
        """
        self._check_usable()
        inline = self._inline
        payload = b""
        if self.is_master:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            inline[:8] = np.frombuffer(np.int64(len(payload)).tobytes(), np.uint8)
            head = min(len(payload), _INLINE - 8)
            inline[8:8 + head] = np.frombuffer(payload, np.uint8, head)
        request = self._comm.Ibcast([inline, self._mpi.BYTE], 0)
        self._wait([request], "broadcasting a command to the machines", timeout=timeout,
                   spin=spin, keep=[inline])
        length = int(inline[:8].view(np.int64)[0])
        if length <= _INLINE - 8:
            data = inline[8:8 + length].tobytes()
            return obj if self.is_master else pickle.loads(data)
        rest = (np.frombuffer(payload, np.uint8)[_INLINE - 8:].copy() if self.is_master
                else np.empty(length - (_INLINE - 8), np.uint8))
        request = self._comm.Ibcast([rest, self._mpi.BYTE], 0)
        self._wait([request], "broadcasting a long command to the machines",
                   timeout=timeout, keep=[rest])
        if self.is_master:
            return obj
        return pickle.loads(inline[8:].tobytes() + rest.tobytes())

    def gather_objects(self, obj: Any, *, timeout: float | None = None) -> list | None:
        """Every leader's ``obj`` (pickled) in a list on the master; None elsewhere.

        Collective over leaders (e.g. replies to a command).
        """
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        parts = self.gather(data, timeout=timeout)
        if parts is None:
            return None
        return [pickle.loads(part.tobytes()) for part in parts]

    def all_gather_fixed(self, record: np.ndarray, *,
                         timeout: float | None = None) -> np.ndarray:
        """Every leader's ``record`` on every leader, stacked by leader rank, in one
        collective (no header exchange: every leader passes the same dtype and shape).
        """
        self._check_usable()
        _check_contiguous(record, "record")
        every = np.empty((self.size,) + record.shape, record.dtype)
        request = self._comm.Iallgather(record, every)
        self._wait([request], "exchanging status between machines", timeout=timeout,
                   keep=[record, every])
        return every

    def all_gather_objects(self, obj: Any, *, timeout: float | None = None) -> list:
        """Every leader's ``obj`` (pickled) in a list on every leader. Collective."""
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        return [pickle.loads(part.tobytes()) for part in self.all_gather(data, timeout=timeout)]

    # ---- arrays --------------------------------------------------------------------

    def broadcast(self, buffer: np.ndarray, *, root: int = 0,
                  timeout: float | None = None) -> np.ndarray:
        """Overwrite ``buffer`` on every leader with ``root``'s, in place. Collective.

        Every leader passes a C-contiguous array of the same number of bytes.
        """
        self._check_usable()
        _check_contiguous(buffer, "buffer")
        request = self._comm.Ibcast([_as_bytes(buffer), self._mpi.BYTE], root)
        self._wait([request], f"broadcasting {buffer.nbytes} bytes from machine {root}",
                   timeout=timeout, keep=[buffer])
        return buffer

    def _headers(self, array: np.ndarray, root: int | None, what: str,
                 timeout: float | None) -> np.ndarray | None:
        """Every leader's array header, on ``root`` (None: on every leader)."""
        mine = _describe(array)
        every = np.empty((self.size, _HEADER), np.int64)
        if root is None:
            request = self._comm.Iallgather(mine, every)
        else:
            request = self._comm.Igather(mine, every if self.rank == root else None, root)
        self._wait([request], what, timeout=timeout, keep=[mine, every])
        return every if root is None or self.rank == root else None

    def _split(self, headers: np.ndarray, flat: np.ndarray) -> list[np.ndarray]:
        parts, start = [], 0
        for header in headers:
            dtype, shape = _dtype_shape(header)
            stop = start + int(header[0])
            parts.append(flat[start:stop].view(dtype).reshape(shape))
            start = stop
        return parts

    def gather(self, array: np.ndarray, *, root: int = 0,
               timeout: float | None = None) -> list[np.ndarray] | None:
        """Every leader's array, on ``root``: a list indexed by leader rank.

        Collective. Arrays may differ in dtype, shape and size; each comes back with
        its own (as views of one received buffer). Other leaders get None.
        """
        self._check_usable()
        array = np.ascontiguousarray(array)
        what = f"gathering arrays on machine {root}"
        headers = self._headers(array, root, what, timeout)
        flat = counts = None
        if headers is not None:
            counts = headers[:, 0].astype(np.int64)
            flat = np.empty(int(counts.sum()), np.uint8)
            displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
            receive = [flat, (counts, displacements), self._mpi.BYTE]
        else:
            receive = None
        request = self._comm.Igatherv([_as_bytes(array), self._mpi.BYTE], receive, root)
        self._wait([request], what, timeout=timeout, keep=[array, flat, counts])
        if headers is None or flat is None:
            return None
        return self._split(headers, flat)

    def all_gather(self, array: np.ndarray, *,
                   timeout: float | None = None) -> list[np.ndarray]:
        """Every leader's array on every leader: a list indexed by leader rank.

        Collective. Arrays may differ in dtype, shape and size.
        """
        self._check_usable()
        array = np.ascontiguousarray(array)
        what = "all-gathering arrays between machines"
        headers = self._headers(array, None, what, timeout)
        assert headers is not None
        counts = headers[:, 0].astype(np.int64)
        flat = np.empty(int(counts.sum()), np.uint8)
        displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
        request = self._comm.Iallgatherv([_as_bytes(array), self._mpi.BYTE],
                                         [flat, (counts, displacements), self._mpi.BYTE])
        self._wait([request], what, timeout=timeout, keep=[array, flat, counts])
        return self._split(headers, flat)

    def scatter(self, arrays: Sequence[np.ndarray] | None, *, root: int = 0,
                timeout: float | None = None) -> np.ndarray:
        """``root``'s ``arrays[m]`` on leader ``m``. Collective.

        ``root`` passes one array per leader (they may differ in dtype, shape, size:
        e.g. each machine's rows of an input); the others pass None.
        """
        self._check_usable()
        what = f"scattering arrays from machine {root}"
        if self.rank == root:
            if arrays is None or len(arrays) != self.size:
                got = "None" if arrays is None else f"{len(arrays)}"
                raise ValueError(f"scatter needs one array per machine ({self.size}) on "
                                 f"the root; got {got}")
            arrays = [np.ascontiguousarray(a) for a in arrays]
            headers = np.stack([_describe(a) for a in arrays])
            flat = (np.concatenate([_as_bytes(a) for a in arrays]) if arrays
                    else np.empty(0, np.uint8))
        else:
            headers, flat = None, None
        mine = np.empty(_HEADER, np.int64)
        request = self._comm.Iscatter(headers, mine, root)
        self._wait([request], what, timeout=timeout, keep=[headers, mine])
        dtype, shape = _dtype_shape(mine)
        out = np.empty(shape, dtype)
        if self.rank == root:
            assert headers is not None
            counts = headers[:, 0].astype(np.int64)
            displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
            send = [flat, (counts, displacements), self._mpi.BYTE]
        else:
            send, counts = None, None
        request = self._comm.Iscatterv(send, [_as_bytes(out), self._mpi.BYTE], root)
        self._wait([request], what, timeout=timeout, keep=[flat, out, counts])
        return out

    def barrier(self, *, timeout: float | None = None) -> None:
        """Return when every leader has called it. Collective."""
        self._check_usable()
        self._wait([self._comm.Ibarrier()], "a barrier between machines", timeout=timeout)

    # ---- reductions ----------------------------------------------------------------

    def all_reduce(self, buffer: np.ndarray, op: Any = "sum", *,
                   mode: Literal["fast", "exact"] = "fast",
                   timeout: float | None = None) -> np.ndarray:
        """Reduce ``buffer`` elementwise across machines, in place on every leader.

        Collective. ``op`` is ``"sum"``, ``"prod"``, ``"max"`` or ``"min"`` (or an
        enum whose value is one of these); ``"avg"`` is the caller's sum then divide.
        ``mode="exact"`` folds the machines' buffers in rank order with the
        chunk-owner scheme (bit-identical wherever it runs). ``mode="fast"`` uses the
        MPI library's all-reduce below ``fast_chunked_from`` bytes and the chunk-owner
        scheme from there on: the MPI libraries' nonblocking all-reduce was the slower
        of the two on large buffers here (64 MiB between 2 ranks: Open MPI 5's
        ``Iallreduce`` 270-360 ms, the chunk-owner scheme 80-100 ms; MPICH 5 97 vs 82
        ms). A dtype MPI cannot reduce (float16, bool, non-native byte order, complex
        max/min) takes the chunk-owner scheme in both modes.

        Returns
        -------
        np.ndarray
            ``buffer``, now holding the result.
        """
        name = _op_name(op)
        if mode not in ("fast", "exact"):
            raise ValueError(f"mode must be 'fast' or 'exact'; got {mode!r}")
        self._check_usable()
        _check_contiguous(buffer, "buffer")
        if (mode == "exact" or buffer.nbytes >= self.fast_chunked_from
                or not self._mpi_can_reduce(buffer.dtype, name)):
            return self.all_reduce_pieces(buffer.reshape((1,) + buffer.shape), name,
                                          out=buffer, counts=(1,) * self.size,
                                          timeout=timeout)
        MPI = self._mpi
        mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[name]
        flat = buffer.reshape(-1)
        request = self._comm.Iallreduce(MPI.IN_PLACE, flat, mpi_op)
        self._wait([request], f"all-reducing {buffer.nbytes} bytes ({name}) between machines",
                   timeout=timeout, keep=[buffer])
        return buffer

    def _mpi_can_reduce(self, dtype: np.dtype, name: str) -> bool:
        if not dtype.isnative or dtype.kind not in "iufc":
            return False
        if dtype.kind == "c" and name in ("max", "min"):
            return False
        if dtype == np.float16:
            return False
        try:
            self._mpi.Datatype.fromcode(dtype.char)
        except (KeyError, ValueError):
            return False
        return True

    def all_reduce_pieces(self, pieces: np.ndarray, op: Any = "sum", *,
                          out: np.ndarray | None = None,
                          counts: Sequence[int] | None = None,
                          timeout: float | None = None) -> np.ndarray:
        """Fold every machine's pieces elementwise in global order; result everywhere.

        Collective. ``pieces`` has shape ``(k, *shape)``: this machine's ``k`` values in
        its local rank order (``k`` may differ between machines, even be 0 on some).
        Every leader gets ``op`` folded over machine 0's pieces, then machine 1's, and
        so on, left to right: with each local process's value as a piece this is
        bit-identical to one machine folding all processes in rank order. A machine
        may pass its first pieces pre-folded only if it is machine 0 (a prefix of the
        fold). Traffic grows with ``k``: each piece crosses the network once.

        Parameters
        ----------
        pieces : np.ndarray
            Shape ``(k, *shape)``, the same ``shape`` and dtype on every machine.
        op : str or enum
            ``"sum"``, ``"prod"``, ``"max"`` or ``"min"``.
        out : np.ndarray, optional
            C-contiguous, ``shape`` and dtype of a piece; may be ``pieces[0]``.
            Allocated if None.
        counts : sequence of int, optional
            Every machine's ``k``, when the caller knows them (e.g.
            ``leaders.local_sizes``): saves one exchange. Wrong counts hang or
            corrupt the result; left out, the leaders exchange them (and check that
            every machine has the same number of elements).

        Returns
        -------
        np.ndarray
            ``out``.
        """
        name = _op_name(op)
        self._check_usable()
        pieces = np.asarray(pieces)
        if pieces.ndim < 1:
            raise ValueError("pieces must have a leading axis of pieces; got a 0-d array")
        shape = pieces.shape[1:]
        if out is None:
            out = np.empty(shape, pieces.dtype)
        _check_contiguous(out, "out")
        if out.shape != shape or out.dtype != pieces.dtype:
            raise ValueError(f"out must have one piece's shape {shape} and dtype "
                             f"{pieces.dtype}; got {out.shape} and {out.dtype}")
        MPI = self._mpi
        what = f"exact all-reduce ({name}) of {out.nbytes} bytes between machines"
        n = int(np.prod(shape, dtype=np.int64))
        flat = pieces.reshape(pieces.shape[0], n)
        # out may be this machine's first piece (in place): then that piece is folded
        # straight into it, and no other piece may overlap it
        in_place = bool(flat.shape[0]) and np.may_share_memory(out, pieces)
        if in_place and not (_same_memory(out.reshape(-1), flat[0])
                             and not np.may_share_memory(out, pieces[1:])):
            raise ValueError("out may be pieces[0] itself but must not overlap any other "
                             "piece")
        if counts is None:
            # each machine's piece count, and a check that every machine has the same n
            mine = np.array([flat.shape[0], n], np.int64)
            every = np.empty((self.size, 2), np.int64)
            self._wait([self._comm.Iallgather(mine, every)], what, timeout=timeout,
                       keep=[mine, every])
            if (every[:, 1] != n).any():
                raise ValueError(f"exact all-reduce needs the same number of elements on "
                                 f"every machine; got {every[:, 1].tolist()}")
        else:
            if len(counts) != self.size or counts[self.rank] != flat.shape[0]:
                raise ValueError(f"counts must give every machine's piece count "
                                 f"({self.size} values, this machine's {flat.shape[0]}); "
                                 f"got {list(counts)}")
            every = np.array([[k, n] for k in counts], np.int64)
        bounds = chunk_bounds(n, self.size)
        lo, hi = bounds[self.rank]
        sends, sent = [], []
        for dest, (dlo, dhi) in enumerate(bounds):
            if dest != self.rank and flat.shape[0] and dhi > dlo:
                block = np.ascontiguousarray(flat[:, dlo:dhi])
                sent.append(block)
                sends.append(self._p2p.Isend(block, dest, _TAG_EXACT))
        received: dict[int, np.ndarray] = {}
        receives: dict[int, Any] = {}
        for source in range(self.size):
            k = int(every[source, 0])
            if source != self.rank and k and hi > lo:
                received[source] = np.empty((k, hi - lo), flat.dtype)
                receives[source] = self._p2p.Irecv(received[source], source, _TAG_EXACT)
        keep = [flat, sent, received]
        ufunc = ufunc_of(ReduceOp(name))[0]
        mine = out.reshape(-1)[lo:hi]  # where this leader's chunk of the result goes
        acc = None  # the running fold: a received buffer (ours to change), or mine
        for source in range(self.size):
            if source == self.rank:
                block = flat[:, lo:hi]
            elif source in receives:
                self._wait([receives[source]], what, timeout=timeout, keep=keep)
                block = received[source]
            else:
                continue
            for index, piece in enumerate(block):
                own_first = source == self.rank and index == 0 and in_place
                if acc is None:
                    acc = mine if own_first else (piece if source != self.rank else None)
                    if acc is None:
                        acc = mine
                        np.copyto(mine, piece)
                elif own_first:
                    ufunc(acc, piece, out=mine)  # piece is mine: same elements, safe
                    acc = mine
                else:
                    ufunc(acc, piece, out=acc)
        if acc is None and hi > lo:
            raise ValueError("exact all-reduce needs at least one piece on some machine; "
                             "every machine passed 0")
        if acc is not None and acc is not mine:
            np.copyto(mine, acc)
        self._wait(sends, what, timeout=timeout, keep=keep)
        target = _as_bytes(out)
        item = out.dtype.itemsize
        byte_counts = np.array([(b - a) * item for a, b in bounds], np.int64)
        displacements = np.array([a * item for a, _ in bounds], np.int64)
        request = self._comm.Iallgatherv(MPI.IN_PLACE,
                                         [target, (byte_counts, displacements), MPI.BYTE])
        self._wait([request], what, timeout=timeout, keep=[out, byte_counts, displacements])
        return out

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
        request = self._alarm.Isend([data, self._mpi.BYTE], 0, _TAG_FAILURE)
        self._settle([request], timeout, keep=[data])

    def _settle(self, requests: list, timeout: float, keep: Sequence[Any]) -> bool:
        """Best-effort wait used on failure paths: no alarms, errors ignored."""
        deadline = time.monotonic() + timeout
        try:
            while not self._mpi.Request.Testall(requests):
                if time.monotonic() > deadline:
                    self._abandoned.append((requests, keep))
                    return False
                time.sleep(1e-3)
        except self._mpi.Exception:
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
        MPI = self._mpi
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
        MPI = self._mpi
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
        for comm in (self._comm, self._p2p, self._alarm):
            comm.Free()
        self._closed = True
        self._mpi.Finalize()


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` view exactly the same elements."""
    return (a.shape == b.shape and a.dtype == b.dtype and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _check_contiguous(array: np.ndarray, name: str) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array; got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (np.ascontiguousarray); it is not")


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
                      liveness=liveness, timeout=timeout, spin=spin, _mpi=MPI)
    comms = []
    leaders._comm = leaders._p2p = world  # _translate revokes what it finds here
    for _ in range(3):
        comm, request = world.Idup()
        leaders._wait([request], "starting MPI between the machines", keep=[comm])
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        comms.append(comm)
    leaders._comm, leaders._p2p, leaders._alarm = comms
    mine = (socket.gethostname(), local_size, os.getpid())
    every = leaders.all_gather_objects(mine, timeout=timeout)
    leaders.hosts = tuple(str(e[0]) for e in every)
    leaders.local_sizes = tuple(int(e[1]) for e in every)
    leaders.pids = tuple(int(e[2]) for e in every)
    if exit_hook:
        atexit.register(leaders._at_exit)
    log.debug("MPI leaders: %s", leaders)
    return leaders
