"""Forking workers, setting each one up, watching them, and stopping them.

A worker is a plain ``os.fork()`` child of the master. Right after the fork it:

- ignores SIGINT (Ctrl-C reaches the whole process group; the master alone decides)
  and drops any signal the master's handler had noted (``signals.py``): a failure in
  a worker is never taken for the master's interruption,
- asks the kernel for SIGTERM when the master dies (``PR_SET_PDEATHSIG``), and on
  SIGTERM exits at once, first sweeping the program's segments if the master is gone,
- enables ``faulthandler`` so a segfault leaves a traceback on stderr,
- sets the thread-count variables of BLAS/OpenMP/Numba to one and runs the caller's
  ``setup`` (``fork()`` passes the one that limits the pools already loaded:
  ``synkhronos/_threads.py``), and optionally pins itself to one core.

It then runs the worker main loop and leaves with ``os._exit``: never through the
master's ``atexit`` handlers or buffered output it inherited.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from . import shmem, signals

__all__ = ["Worker", "fork_workers", "stop_workers", "THREAD_ENV"]

log = logging.getLogger("synkhronos")

_PR_SET_PDEATHSIG = 1
_MASTER_EXIT_GRACE = 1.0  # seconds a SIGTERMed worker waits to see whether the master died
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


@dataclass
class Worker:
    """The master's handle on one forked worker."""

    rank: int
    pid: int
    status: int | None = None  # the raw wait status once reaped

    def poll(self) -> str | None:
        """None while alive; otherwise how it ended (reaps the child)."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.status = 0
                return "vanished (reaped elsewhere)"
            if pid == 0:
                return None
            self.status = status
        return describe_status(self.status)


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the idle poll still notices
        pass


def master_gone(master_pid: int) -> bool:
    """True once the master is reparented away, a zombie, or gone from /proc."""
    if os.getppid() != master_pid:
        return True
    try:
        with open(f"/proc/{master_pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X", "x")


def _setup_child(master_pid: int, prefix: str, core: int | None,
                 setup: Callable[[], object] | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signals.forget()

    def on_term(signum, frame):
        # PR_SET_PDEATHSIG fires when the forking *thread* dies: with other threads
        # the master may still be exiting, so give it a moment to be seen gone.
        deadline = time.monotonic() + _MASTER_EXIT_GRACE
        while not master_gone(master_pid):
            if time.monotonic() > deadline:
                os._exit(128 + signum)  # a SIGTERM for this worker alone
            time.sleep(0.005)
        shmem.sweep_prefix(prefix)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    _set_parent_death_signal()
    if os.getppid() != master_pid:  # the master died before prctl took effect
        on_term(signal.SIGTERM, None)
    faulthandler.enable()
    for name in THREAD_ENV:
        os.environ[name] = "1"
    if setup is not None:
        setup()
    if core is not None:
        os.sched_setaffinity(0, {core})


def fork_workers(
    ranks: list[int],
    prefix: str,
    main: Callable[[int], None],
    cores: list[int] | None = None,
    setup: Callable[[], object] | None = None,
) -> list[Worker]:
    """Fork one worker per rank in ``ranks``; each runs ``main(rank)`` and exits.

    ``cores``, when given, maps rank -> the CPU it pins itself to; ``setup`` runs in
    each child before ``main`` (after the process-wide settings above).
    """
    master_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    workers: list[Worker] = []
    try:
        for rank in ranks:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                code = 0
                try:
                    _setup_child(master_pid, prefix, None if cores is None else cores[rank],
                                 setup)
                    main(rank)
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    try:
                        sys.stderr.flush()
                    finally:
                        os._exit(code)
            workers.append(Worker(rank, pid))
    except BaseException:
        stop_workers(workers, timeout=0)
        raise
    return workers


def stop_workers(workers: list[Worker], timeout: float) -> None:
    """Wait up to ``timeout`` s for workers to exit, then SIGKILL and reap the rest."""
    deadline = time.monotonic() + timeout
    pending = [w for w in workers if w.poll() is None]
    try:
        while pending and time.monotonic() < deadline:
            time.sleep(0.002)
            pending = [w for w in pending if w.poll() is None]
    finally:  # also on Ctrl-C during the wait: no worker is left unreaped
        _kill_and_reap(pending)


def _kill_and_reap(pending: list[Worker]) -> None:
    for worker in pending:
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for worker in pending:
        if worker.status is None:
            try:
                _, worker.status = os.waitpid(worker.pid, 0)
            except ChildProcessError:
                worker.status = 0
