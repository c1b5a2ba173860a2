"""fork(), close(), and what a program asks about its session: the front door's lifecycle.

``fork()`` checks its arguments, then builds the session in this order, so that a
failure at any step leaves nothing behind:

1. sweep ``/dev/shm`` of programs that died without cleaning up;
2. a fresh prefix, the program lock, the control block (with more than one process);
3. the master's ``RankContext`` and ``Session``, with the one handler table;
4. fork the workers (each builds its own context and runs ``worker.main``); limit this
   process's BLAS and Numba threads; take over SIGINT/SIGTERM where Python's defaults
   are in place, so Ctrl-C closes the session.

``close()`` undoes all of it (``Session.close``) and runs at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import warnings
from typing import Any, Literal

import numpy as np

from . import handlers, worker
from ._core import context as core_context
from ._core import session as core_session
from ._core.context import RankContext
from ._core.execute import Executor
from ._core.session import Session
from ._runtime import devices, processes, shmem, signals
from ._runtime.arena import Arena
from ._runtime.control import ControlBlock
from ._threads import limit_threads

__all__ = ["fork", "close", "n_parallel", "device", "master_rank", "get_n_gpu"]

log = logging.getLogger("synkhronos")

_DEFAULT_SPIN = 1e-3
_atexit_registered = False
PREIMPORT_BACKEND = True  # False: fork() skips the Numba pre-import (testing's switch)


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
    global _atexit_registered
    if core_session.current() is not None:
        raise RuntimeError("synk.fork() was already called; call synk.close() first")
    ctx = core_context.current()
    if ctx is not None:
        raise RuntimeError(
            f"synk.fork() cannot be called inside a worker (rank {ctx.rank}): only the "
            "master process forks"
        )
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
    session = _build(n_parallel, device, master_rank, spin, timeout)
    try:
        _start(session, [cores[r % len(cores)] for r in range(n_parallel)] if pin else None)
    except BaseException:
        session.close()
        raise
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    log.info("synkhronos forked %d processes (%s)", n_parallel, device)
    return n_parallel


def _build(n: int, device: str, master_rank: int, spin: float,
           timeout: float | None) -> Session:
    """Steps 2-3: the program's prefix, lock, control block, context and session."""
    prefix = shmem.new_session_prefix()
    lock = shmem.ProgramLock(prefix)  # inherited by the workers
    try:
        control = ControlBlock(prefix, n, spin) if n > 1 else None
    except BaseException:  # e.g. a squatted name: what it made is unlinked already
        lock.close()
        raise
    log_ = control.release_log if control is not None else None
    ctx = RankContext(
        rank=master_rank, size=n, master_rank=master_rank, prefix=prefix,
        arena=Arena(prefix, master_rank, True, log_), control=control,
        master_pid=os.getpid(), device=device,
    )
    session = Session(ctx, Executor(handlers.TABLE), timeout, lock)
    core_session.install(session)
    return session


def _start(session: Session, cores: list[int] | None) -> None:
    """Step 4: fork the workers, limit threads, take over the signals."""
    ctx = session.ctx
    if ctx.control is not None:
        forked_seq = ctx.control.seq
        executor = session.executor
        ranks = [r for r in range(ctx.size) if r != ctx.master_rank]
        session.workers = processes.fork_workers(
            ranks, ctx.prefix, lambda rank: worker.main(ctx, executor, rank, forked_seq), cores,
            setup=limit_threads,
        )
    if cores is not None:
        os.sched_setaffinity(0, {cores[ctx.master_rank]})
    session.on_close(limit_threads().restore)
    old_handlers = signals.install()
    session.on_close(lambda: signals.restore(old_handlers))


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
    if not PREIMPORT_BACKEND:
        return
    try:
        import pytensor.link.numba.dispatch  # noqa: F401
    except Exception as exc:  # pragma: no cover - best effort
        log.debug("could not pre-import the numba backend: %s", exc)


def close() -> None:
    """Stop and join all workers and free every shared-memory segment of this program.

    Safe to call twice, and without a session. Also runs at interpreter exit.
    """
    session = core_session.current()
    if session is not None:
        session.close()


def n_parallel() -> int:
    """Number of processes in the session (the master included).

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    """
    return core_session.require("synk.n_parallel()").ctx.size


def device() -> str:
    """``"cpu"`` or ``"gpu"``.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    """
    return core_session.require("synk.device()").ctx.device


def master_rank() -> int:
    """The rank the master computes as.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    """
    return core_session.require("synk.master_rank()").ctx.master_rank


def _at_exit() -> None:
    session = core_session.current()
    if session is not None:
        session.close()
