"""The session: ``fork()``, ``close()``, and the one object that owns per-process state.

A program has at most one live ``Session``. The master creates it in ``fork()``; each
worker inherits a copy through the fork and turns it into its own view (its rank, its
caches). Its life is a small state machine::

    (none) --fork()--> READY --WorkerDiedError / timeout / Ctrl-C--> BROKEN
                         |                                              |
                         +------------------close()---------------------+--> CLOSED

Every command goes through ``Session.run(opcode, payload)``:

1. the master checks the session is READY, called from the forking thread, and not
   already inside a command;
2. it posts ``(releases, payload)`` on the control block and wakes the workers
   (``releases`` are segment names the workers should stop mapping);
3. it runs the same handler for its own rank, in its own process;
4. it waits for every worker, watching for dead ones and the timeout;
5. it reads the replies and raises the root-cause failure, if any, as ``WorkerError``.

Handlers are registered per ``Opcode`` by the modules that own them
(``@register(Opcode.CALL)``); the worker loop (``worker.py``) looks them up.
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ._runtime import devices, processes, shmem, signals
from ._runtime.control import ControlBlock
from ._runtime.remote import RemoteFailure, RemoteTraceback
from .errors import WorkerDiedError, WorkerError, WorkerTimeoutError

__all__ = [
    "Opcode",
    "Session",
    "register",
    "fork",
    "close",
    "n_parallel",
    "device",
    "master_rank",
    "get_n_gpu",
    "current",
    "require",
]

log = logging.getLogger("synkhronos")


class Opcode(enum.IntEnum):
    """What a command asks every process to do."""

    EXIT = 0
    CALLABLE = 1
    DISTRIBUTE = 2
    CALL = 3
    COLLECTIVE = 4
    PING = 6


Handler = Callable[["Session", Any], Any]
_HANDLERS: dict[int, Handler] = {}


def register(opcode: Opcode) -> Callable[[Handler], Handler]:
    """Decorator: ``handler(session, payload) -> reply`` runs ``opcode`` in each process."""

    def decorate(handler: Handler) -> Handler:
        _HANDLERS[int(opcode)] = handler
        return handler

    return decorate


def handler_for(opcode: int) -> Handler:
    return _HANDLERS[opcode]


@register(Opcode.PING)
def _ping(session: Session, payload) -> None:
    """The empty command: measures the cost of one round trip."""
    return None


@register(Opcode.CALLABLE)
def _run_callable(session: Session, payload):
    """Run a picklable ``fn(*args)`` on the selected ranks (None: all)."""
    fn, args, ranks = payload
    if ranks is None or session.rank in ranks:
        return fn(*args)
    return None


class State(enum.Enum):
    READY = "ready"
    BROKEN = "broken"
    CLOSED = "closed"


_DEFAULT_SPIN = 1e-3
_current: Session | None = None
_atexit_registered = False


class Session:
    """The per-process state of one synkhronos program (master or worker)."""

    def __init__(
        self,
        n: int,
        device: str,
        master_rank: int,
        spin: float,
        timeout: float | None,
        pin: bool,
    ):
        self.n = n
        self.device = device
        self.master_rank = master_rank
        self.rank = master_rank
        self.is_master = True
        self.timeout = timeout
        self.master_pid = os.getpid()
        self.prefix = shmem.new_session_prefix()
        self._lock = shmem.ProgramLock(self.prefix)  # inherited by the workers
        try:
            self.control = ControlBlock(self.prefix, n, spin) if n > 1 else None
        except BaseException:  # e.g. a squatted name: what it made is unlinked already
            self._lock.close()
            raise
        self.segments = shmem.SegmentCache()
        self.state = State.READY
        self.broken: BaseException | None = None
        self.workers: list[processes.Worker] = []
        self._thread = threading.get_ident()
        self._busy = False
        self._seq = 0
        self._started = 0.0
        self._releases: list[str] = []
        self._local: dict[str, Any] = {}
        self.profile = None  # a synk.profile() Profile while one is active
        self.last_timing = (0.0, 0.0)  # (own share, wait for workers) of the last command
        self._thread_limit = None
        self._old_handlers: dict[int, Any] = {}
        cores = devices.usable_cores()
        self._cores = [cores[r % len(cores)] for r in range(n)] if pin else None
        self._worker_ranks = self.worker_ranks

    # -- per-process state of the upper layers ------------------------------------------
    def local(self, key: str, factory: Callable[[], Any]) -> Any:
        """A per-process object owned by an upper layer (a registry, a cache)."""
        value = self._local.get(key)
        if value is None:
            value = self._local[key] = factory()
        return value

    def local_or_none(self, key: str) -> Any:
        """The object ``local(key, ...)`` made, or None (no factory to build per call)."""
        return self._local.get(key)

    @property
    def worker_ranks(self) -> list[int]:
        return [r for r in range(self.n) if r != self.master_rank]

    # -- start -----------------------------------------------------------------------------
    def start(self) -> None:
        from . import worker

        self.forked_seq = self.control.seq if self.control is not None else 0
        if self.n > 1:
            self.workers = processes.fork_workers(
                self.worker_ranks, self.prefix, lambda rank: worker.main(self, rank), self._cores
            )
        if self._cores is not None:
            os.sched_setaffinity(0, {self._cores[self.master_rank]})
        self._thread_limit = processes.limit_threads()
        self._old_handlers = signals.install()

    def become_worker(self, rank: int) -> None:
        """Turn the inherited copy into worker ``rank``'s own session."""
        self.rank = rank
        self.is_master = False
        self.workers = []
        self._thread = threading.get_ident()
        self._releases = []

    # -- commands --------------------------------------------------------------------------
    def check_usable(self) -> None:
        """Raise unless the master may start a command now."""
        if not self.is_master:
            raise RuntimeError(
                "synkhronos commands can only be issued by the master process, "
                "not from inside a worker"
            )
        if self.state is State.CLOSED:
            raise RuntimeError("the synkhronos session is closed; call synk.fork() first")
        if self.state is State.BROKEN:
            raise self._broken_error()
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                "synkhronos commands must come from the thread that called synk.fork()"
            )
        if self._busy:
            raise RuntimeError(
                "a synkhronos command is already running; commands cannot be nested"
            )

    def _broken_error(self) -> BaseException:
        error = self.broken
        if isinstance(error, WorkerDiedError):
            return WorkerDiedError(error.rank, error.pid, error.reason)
        if isinstance(error, WorkerTimeoutError):
            return WorkerTimeoutError(error.rank, error.pid, error.timeout)
        return RuntimeError("the synkhronos session is broken; call synk.close()")

    def release_later(self, name: str) -> None:
        """Ask workers to drop their mapping of segment ``name`` with the next command."""
        if self.n > 1 and self.state is State.READY:
            self._releases.append(name)

    def run(self, opcode: Opcode, payload: Any = None, repeats: bool = False) -> list[Any]:
        """Run ``opcode`` in every process; return the replies, indexed by rank.

        Collective: every process takes part; returns when all have finished.
        ``repeats``: the payload is hashable and likely to be sent again (a function's
        call plan); it is then pickled once and decoded once per worker.
        """
        self.check_usable()
        handler = _HANDLERS[int(opcode)]
        if self.profile is not None:
            return self._run_profiled(opcode, handler, payload, repeats)
        if self.n == 1:
            return [self._run_local(handler, payload)]
        return self._run_all(opcode, handler, payload, repeats)

    def _run_profiled(self, opcode: Opcode, handler: Handler, payload: Any,
                      repeats: bool) -> list[Any]:
        start = time.perf_counter()
        replies = [self._run_local(handler, payload)] if self.n == 1 else self._run_all(
            opcode, handler, payload, repeats
        )
        if opcode == Opcode.COLLECTIVE:
            self.profile.record_command("collective", time.perf_counter() - start)
        return replies

    def _run_all(self, opcode: Opcode, handler: Handler, payload: Any,
                 repeats: bool = False) -> list[Any]:
        control = self.control
        signals.forget()  # only a signal that arrives during this command is ours
        releases, self._releases = self._releases, []
        key = (int(opcode), payload) if repeats and not releases else None
        # Posting pickles first: a payload that cannot be pickled raises here, before
        # any worker moves, and leaves the session usable.
        try:
            self._seq = control.post(
                int(opcode), (releases, payload), self.master_rank, key
            )
        except BaseException:
            self._releases = releases + self._releases
            raise
        self._busy = True
        try:
            if self.timeout is not None:  # only the timeout reads it
                self._started = time.monotonic()
            if self.profile is not None:
                self._started_precise = time.perf_counter()
            failure: tuple[BaseException, RemoteFailure] | None = None
            try:
                reply = handler(self, payload)
            except Exception as exc:
                signals.reraise_interruption(exc)  # Ctrl-C inside compiled code: still Ctrl-C
                failure, reply = (exc, RemoteFailure.from_exception(exc)), None
                control.mark_failed(self.master_rank, self._seq)
            workers = self._worker_ranks
            seq = self._seq
            if self.profile is not None:
                own = time.perf_counter()
                control.wait(self.master_rank, lambda: control.all_done(seq, workers), self._watch)
                self.last_timing = (own - self._started_precise, time.perf_counter() - own)
            else:
                control.wait(self.master_rank, lambda: control.all_done(seq, workers), self._watch)
            replies = [None] * self.n
            replies[self.master_rank] = reply
            first_remote = None
            for rank in workers:
                value = control.reply(rank)
                if control.failed(rank):
                    if first_remote is None or (first_remote[1].secondary and not value.secondary):
                        first_remote = (rank, value)
                else:
                    replies[rank] = value
            control.release_external_payload()
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._busy = False
        if failure is not None and not failure[1].secondary:
            exc, info = failure
            raise WorkerError(self.master_rank, info.exc_type, str(exc), info.traceback) from exc
        if first_remote is not None:
            rank, info = first_remote
            raise WorkerError(rank, info.exc_type, info.message, info.traceback) from (
                RemoteTraceback(info.traceback)
            )
        if failure is not None:
            raise failure[0]
        return replies

    def _run_local(self, handler: Handler, payload: Any) -> Any:
        self._busy = True
        try:
            if self.profile is not None:
                start = time.perf_counter()
                reply = handler(self, payload)
                self.last_timing = (time.perf_counter() - start, 0.0)
                return reply
            return handler(self, payload)
        except Exception as exc:
            signals.reraise_interruption(exc)
            info = RemoteFailure.from_exception(exc)
            raise WorkerError(self.rank, info.exc_type, str(exc), info.traceback) from exc
        finally:
            self._busy = False

    def barrier(self) -> None:
        """Inside a handler: wait until every rank of the command reaches this point."""
        if self.n == 1:
            return
        self.control.barrier(self.rank, self._watch if self.is_master else self._watch_master)

    def _watch(self) -> None:
        """The master's liveness check while it waits (runs every poll interval)."""
        signals.reraise_lost()
        for worker in self.workers:
            reason = worker.poll()
            if reason is not None:
                raise WorkerDiedError(worker.rank, worker.pid, reason)
        if self.timeout is not None and time.monotonic() - self._started > self.timeout:
            for worker in self.workers:
                if self.control.done(worker.rank) != self._seq:
                    raise WorkerTimeoutError(worker.rank, worker.pid, self.timeout)

    def _watch_master(self) -> None:
        """A worker's liveness check: leave if the master is gone."""
        if processes.master_gone(self.master_pid):
            shmem.sweep_prefix(self.prefix)
            os._exit(1)

    def _fail(self, exc: BaseException) -> None:
        """A command was abandoned: the session cannot be trusted any more."""
        if self.state is not State.READY:
            return
        self.state = State.BROKEN
        self.broken = exc
        if self.control is not None:
            self.control.abort(self._seq)
        if isinstance(exc, (WorkerDiedError, WorkerTimeoutError)):
            log.error("synkhronos session broken: %s", exc)
        else:  # Ctrl-C, SystemExit: leave nothing behind
            self.close()

    # -- stop --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and reap the workers and free every segment of this program."""
        global _current
        if self.state is State.CLOSED or not self.is_master:
            return
        was_ready = self.state is State.READY
        self.state = State.CLOSED
        try:
            if self.workers:
                if was_ready and not self._busy:
                    self.control.post(int(Opcode.EXIT), ([], None), self.master_rank)
                    processes.stop_workers(self.workers, timeout=5.0)
                else:
                    processes.stop_workers(self.workers, timeout=0.0)
        finally:
            shmem.sweep_prefix(self.prefix)
            self._lock.close()
            if self._thread_limit is not None:
                self._thread_limit.restore()
            signals.restore(self._old_handlers)
            self._old_handlers = {}
            if _current is self:
                _current = None


def _at_exit() -> None:
    if _current is not None and _current.is_master:
        _current.close()


# -- the public lifecycle API -------------------------------------------------------------
def current() -> Session | None:
    """The live session of this process, or None."""
    return _current


def require(what: str = "this") -> Session:
    """The live master session, or a RuntimeError saying to call fork() first."""
    session = _current
    if session is None:
        raise RuntimeError(f"synk.fork() must be called before {what}")
    return session


def fork(
    n_parallel: int | None = None,
    device: Literal["cpu", "gpu"] | bool = "cpu",
    master_rank: int = 0,
    *,
    spin: float | None = None,
    timeout: float | None = None,
    pin: bool = False,
    use_gpu: bool | None = None,
    profile_workers: Any = None,
    max_n_var: Any = None,
    max_dim: Any = None,
) -> int:
    """Fork the worker processes; the caller becomes the master and rank ``master_rank``.

    Parameters
    ----------
    n_parallel : int, optional
        Number of processes, the master included. Default: one per usable CPU core.
        ``1`` forks nothing: every call runs in the master alone.
    device : {"cpu", "gpu"}, default "cpu"
        ``"gpu"`` is not implemented yet: it raises ``RuntimeError`` naming what is
        missing (no GPU, or the ``gpu`` extra not installed) or saying so.
    master_rank : int, default 0
        The rank the master computes as (it takes that block of every scatter).
    spin : float, optional
        Seconds a waiting process busy-polls before it sleeps on a semaphore. Default:
        1 ms when there is a core per process, else 0. On cores that other programs
        keep busy, pass ``spin=0``: spinning then starves the process being waited for
        (measured at n=2 with other work on both cores: 94 us per empty command
        spinning, 14 us not). The load average was tried as a guide and rejected: it
        lags, and it counts the program's own recent work.
    timeout : float, optional
        Seconds a command may wait for a worker before ``WorkerTimeoutError``; default
        no limit (a dead worker is still detected within a fraction of a second).
        ``SYNK_TIMEOUT`` in the environment sets the default.
    pin : bool, default False
        Pin rank ``r`` to the ``r``-th usable core.
    use_gpu : bool, optional
        The original Synkhronos' way to choose the device: ``True`` means
        ``device="gpu"``, ``False`` ``device="cpu"``. A bool passed second,
        positionally (``synk.fork(2, False)``), means the same.
    profile_workers, max_n_var, max_dim
        The original's options, no longer needed (there is no fixed-size variable
        table, and profiling is :func:`synk.profile <synkhronos.profile>`): accepted
        with a ``DeprecationWarning`` and ignored.

    Returns
    -------
    int
        The number of processes.

    Raises
    ------
    RuntimeError
        ``fork`` was already called, JAX was initialised before forking, or the
        requested device cannot be used here.
    ValueError
        ``device``, ``n_parallel``, ``master_rank`` or ``timeout`` is not valid.
    """
    global _current, _atexit_registered
    if _current is not None:
        raise RuntimeError("synk.fork() was already called; call synk.close() first")
    for option, value in (("profile_workers", profile_workers), ("max_n_var", max_n_var),
                          ("max_dim", max_dim)):
        if value is not None:
            warnings.warn(
                f"synk.fork({option}=...) is no longer needed and is ignored (it was an "
                "option of the original Synkhronos)", DeprecationWarning, stacklevel=2,
            )
    device = _device_of(device, use_gpu)
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu'; got {device!r}")
    if device == "gpu":
        problem = devices.gpu_problem()
        if problem is not None:
            raise RuntimeError(problem)
        raise RuntimeError("device='gpu' is not implemented yet (see the GPU backend issue)")
    cores = devices.usable_cores()
    if n_parallel is None:
        n_parallel = len(cores)
    if isinstance(n_parallel, bool) or not isinstance(n_parallel, int) or n_parallel < 1:
        raise ValueError(f"n_parallel must be an integer >= 1; got {n_parallel!r}")
    if isinstance(master_rank, bool) or not isinstance(master_rank, int) or not (
        0 <= master_rank < n_parallel
    ):
        raise ValueError(
            f"master_rank must be an integer in [0, {n_parallel}); got {master_rank!r}"
        )
    if timeout is None and os.environ.get("SYNK_TIMEOUT"):
        timeout = float(os.environ["SYNK_TIMEOUT"])
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None; got {timeout!r}")
    if spin is None:
        spin = _DEFAULT_SPIN if n_parallel <= len(cores) else 0.0
    if devices.jax_initialised():
        raise RuntimeError(
            "JAX was initialised before synk.fork(): forked children of a JAX process "
            "hang; call synk.fork() before any JAX computation"
        )
    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    _preimport_backend()
    shmem.sweep_dead_programs()
    session = Session(n_parallel, device, master_rank, spin, timeout, pin)
    _current = session
    try:
        session.start()
    except BaseException:
        session.close()
        raise
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    log.info("synkhronos forked %d processes (%s)", n_parallel, device)
    return n_parallel


def _device_of(device: Any, use_gpu: Any) -> Any:
    """The device named by ``device`` or the original's ``use_gpu`` flag."""
    if isinstance(device, (bool, np.bool_)):  # fork(n, use_gpu) positionally
        if use_gpu is not None:
            raise TypeError("synk.fork() got use_gpu twice (second positionally and by name)")
        use_gpu, device = device, "cpu"
    if use_gpu is None:
        return device
    if not isinstance(use_gpu, (bool, np.bool_)):
        raise TypeError(f"use_gpu must be a bool; got {use_gpu!r}")
    if device != "cpu":
        raise TypeError("synk.fork() takes device or use_gpu, not both")
    return "gpu" if use_gpu else "cpu"


def get_n_gpu() -> int:
    """The number of NVIDIA GPUs this process may use, without initialising CUDA.

    Counts the driver's GPUs (``/proc/driver/nvidia/gpus``), limited by
    ``CUDA_VISIBLE_DEVICES``; 0 on a machine without NVIDIA's driver.
    """
    return devices.visible_gpus()


def _preimport_backend() -> None:
    """Import the Numba dispatch before forking: each worker then skips ~0.5 s of it."""
    try:
        import pytensor.link.numba.dispatch  # noqa: F401
    except Exception as exc:  # pragma: no cover - best effort
        log.debug("could not pre-import the numba backend: %s", exc)


def close() -> None:
    """Stop and join all workers and free every shared-memory segment of this program.

    Safe to call twice, and without a session. Also runs at interpreter exit.
    """
    session = _current
    if session is not None:
        session.close()


def n_parallel() -> int:
    """Number of processes in the session (the master included).

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    """
    return require("synk.n_parallel()").n


def device() -> str:
    """``"cpu"`` or ``"gpu"``.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    """
    return require("synk.device()").device


def master_rank() -> int:
    """The rank the master computes as.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    """
    return require("synk.master_rank()").master_rank
