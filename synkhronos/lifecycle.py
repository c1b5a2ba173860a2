"""fork(), close(), and what a program asks about its session: the front door's lifecycle.

``fork()`` checks its arguments, then builds the session in this order, so that a
failure at any step leaves nothing behind:

1. sweep ``/dev/shm`` of programs that died without cleaning up;
2. a fresh prefix, the program lock and its watcher (which sweeps the prefix if every
   process is killed at once), the control block (with more than one process);
3. the master's ``RankContext`` and ``Session``, with the one handler table;
4. fork the workers (each builds its own context and runs ``worker.main``); limit this
   process's BLAS and Numba threads; take over SIGINT/SIGTERM where Python's defaults
   are in place, so Ctrl-C interrupts a command and SIGTERM closes the session.

``close()`` undoes all of it (``Session.close``) and runs at interpreter exit.

Under an MPI launcher (``mpiexec``, ``srun``; ``launch`` tells from the environment,
before anything else) every MPI process is its machine's leader and does steps 1-4
for its own machine -- the workers are forked before MPI starts -- then starts MPI
(``_machines.mpi.start``), learns the machine table, and tells its processes their
global ranks (a ``Join`` command). On machine 0 ``fork()`` returns; on every other
machine the leader serves commands (``_machines.leader``) and its process ends when the
master closes.
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
from ._core.execute import Executor
from ._core.group import LocalGroup
from ._core.protocol import Join
from ._core.session import Session
from ._machines import backend as _machines_backend  # noqa: F401  (its collectives register)
from ._machines import mpi
from ._machines.leader import Leader
from ._machines.link import Machines
from ._machines.transport import AcrossMachines, Several
from ._runtime import devices, shmem
from ._threads import limit_threads
from .collectives.fresh import Fresh
from .distribute import REGISTRY

__all__ = ["fork", "close", "n_parallel", "device", "master_rank", "get_n_gpu"]

log = logging.getLogger("synkhronos")

_DEFAULT_SPIN = 1e-3
_REDUCTIONS = ("fast", "exact")
_atexit_registered = False
_mpi_started = False  # MPI cannot start twice in one process
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
    launcher: Literal["auto", "mpi", "local"] = "auto",
    reduction: Literal["fast", "exact"] | None = None,
    profile_workers: Any = None,
    max_n_var: Any = None,
    max_dim: Any = None,
) -> int:
    """Fork the worker processes; the caller becomes the master and rank ``master_rank``.

    Under an MPI launcher (``mpiexec``, ``srun``), every machine runs this: each forks
    its own processes, and ``fork()`` returns on the first machine only (see
    :doc:`/several_machines`).

    Parameters
    ----------
    n_parallel : int, optional
        Number of processes, the master included. Default: the environment variable
        ``SYNK_N_PARALLEL`` when it is set, else one per usable CPU core
        (``device="gpu"``: one per visible GPU).
        ``1`` forks nothing: every call runs in the master alone. Under an MPI
        launcher: the processes of each machine (default: its usable cores).
    device : {"cpu", "gpu"}, default "cpu"
        ``"gpu"``: one process per visible GPU by default (fewer, or more sharing
        GPUs, as ``n_parallel`` says), each bound to its GPU before CUDA starts;
        functions compile with PyTensor's JAX backend and shared variables live on
        the device (see :doc:`/gpu`). With ``SYNKHRONOS_GPU_PLATFORM=cpu`` in the
        environment the same path runs on JAX's CPU platform (no GPU needed). Without
        a GPU or the ``gpu`` extra it raises ``RuntimeError`` naming what is missing.
        A program forks a ``"gpu"`` session once: its master has started JAX, and a
        process that has cannot fork again.
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
    launcher : {"auto", "mpi", "local"}, default "auto"
        ``"auto"``: run on several machines when an MPI launcher started this
        process (read from its environment variables), else on this machine alone;
        ``"mpi"``: insist on an MPI launch (``RuntimeError`` otherwise); ``"local"``:
        this machine alone, whatever the environment says.
    reduction : {"fast", "exact"}, optional
        How reductions (function outputs are always exact) combine values between
        machines: ``"fast"`` (default) lets the MPI library choose the summation
        order, which differs from one machine's by rounding; ``"exact"`` folds every
        process's value in rank order, bit-identical to one machine with the same
        number of processes, at the cost of more traffic and memory (every machine
        holds every process's values of a collective). ``SYNK_REDUCTION`` in the
        environment sets the default. On one machine both are the same.
    profile_workers, max_n_var, max_dim
        The original's options, no longer needed (there is no fixed-size variable
        table, and profiling is :func:`synk.profile <synkhronos.profile>`): accepted
        with a ``DeprecationWarning`` and ignored.

    Returns
    -------
    int
        The number of processes (under an MPI launcher: of every machine together).

    Raises
    ------
    RuntimeError
        ``fork`` was already called, JAX was initialised before forking, the
        requested device cannot be used here, ``launcher="mpi"`` without an MPI
        launch, MPI was initialised before ``fork()``, or (under MPI) ``fork()`` was
        called a second time in the program.
    ValueError
        ``SYNK_N_PARALLEL`` (when read) is not an integer >= 1, or ``device``,
        ``n_parallel``, ``master_rank``, ``timeout``, ``launcher`` or
        ``reduction`` is not valid.
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
    launch = mpi.detect_launch(launcher)  # the environment only: no MPI yet
    exact = _exact_of(reduction)
    several = launch.is_mpi and launch.size != 1
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
        if several:
            raise RuntimeError(
                "device='gpu' runs on one machine for now; under an MPI launcher use "
                "device='cpu' (several machines with GPUs are not supported yet)"
            )
    cores = devices.usable_cores()
    if n_parallel is None:
        default = devices.device_count() if device == "gpu" else len(cores)
        n_parallel = n_parallel_from_environment(default)
    if isinstance(n_parallel, bool) or not isinstance(n_parallel, int) or n_parallel < 1:
        raise ValueError(f"n_parallel must be an integer >= 1; got {n_parallel!r}")
    if isinstance(master_rank, bool) or not isinstance(master_rank, int) or not (
        0 <= master_rank < (n_parallel if launch.is_master else master_rank + 1)
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
            "JAX was initialised before synk.fork() (by the program, by an earlier "
            "device='gpu' session in this process, or by sampling with numpyro or "
            "blackjax): forked children of a JAX process hang; call synk.fork() before "
            "any JAX computation, and fork a device='gpu' session once per program (in "
            "a notebook: once per kernel)"
        )
    if several:
        mpi.check_not_initialized()
        if _mpi_started:
            raise RuntimeError(
                "under an MPI launcher synk.fork() can run once per program (MPI cannot "
                "start again after synk.close()); keep one session for the whole script"
            )
    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    _preimport_backend()
    shmem.sweep_dead_programs()
    if several:
        return _fork_machines(launch, n_parallel, device, master_rank, spin, timeout,
                              _cores_of(cores, n_parallel, pin), exact)
    restore = devices.saved_environment() if device == "gpu" else None
    try:
        gpu_ids = devices.prepare_gpu(n_parallel) if restore is not None else []
        group = LocalGroup.create(n_parallel, device, master_rank, master_rank, spin,
                                  timeout, gpu_ids=gpu_ids)
    except BaseException:
        if restore is not None:
            restore()
        raise
    if restore is not None:
        group.on_release(restore)  # after close, the master's environment as it was
    _build(group, _cores_of(cores, n_parallel, pin), mpi_job=False)
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    log.info("synkhronos forked %d processes (%s)", n_parallel, device)
    return n_parallel


def _cores_of(cores: list[int], n: int, pin: bool) -> list[int] | None:
    """The core of each local rank when pinning, else None."""
    return [cores[r % len(cores)] for r in range(n)] if pin else None


def _build(group: LocalGroup, cores: list[int] | None, mpi_job: bool) -> Session:
    """Steps 3-4 on the master's machine: its session, installed, and its workers
    forked (the session closed again if that fails)."""
    session = Session(group, Executor(handlers.TABLE, handlers.LANES))
    core_session.install(session)
    try:
        _fork(group, session.executor, cores, mpi_job)
    except BaseException:
        session.close()
        raise
    if session.n > 1:  # the master's set_value reaches the other processes (the
        registry = REGISTRY.get(session.ctx)  # session holds it once it watches any)
        registry.fresh = Fresh(registry.row_holders)
    return session


def _fork(group: LocalGroup, executor: Executor, cores: list[int] | None,
          mpi_job: bool) -> None:
    """Step 4: fork the group's workers, limit threads, take over the signals."""
    group.fork(lambda ctx, rank, seq: worker.main(ctx, executor, rank, seq), cores,
               setup=_own_group if mpi_job else limit_threads, limits=limit_threads)


def _own_group() -> object:
    """In a worker of an MPI job: leave the leader's process group, so that the MPI
    launcher's signals to the job (which reach a process's whole group) do not end the
    worker before it sees its leader die (it then removes the machine's segments)."""
    os.setpgid(0, 0)
    return limit_threads()


def n_parallel_from_environment(default: int) -> int:
    """``SYNK_N_PARALLEL`` when it is set and not empty (SPEC 2), else ``default``.

    Cluster scripts choose the process count in the environment; a value that is not
    an integer >= 1 is refused here, naming the variable, before any process moves.
    """
    value = os.environ.get("SYNK_N_PARALLEL", "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(
            f"the environment variable SYNK_N_PARALLEL must be an integer >= 1 (the number "
            f"of processes fork() starts); got {value!r}"
        )
    return number


def _exact_of(reduction: Any) -> bool:
    """Whether reductions between machines are exact (``reduction`` or SYNK_REDUCTION)."""
    if reduction is None:
        reduction = os.environ.get("SYNK_REDUCTION") or "fast"
        what = "SYNK_REDUCTION"
    else:
        what = "reduction"
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, _REDUCTIONS))}; "
                         f"got {reduction!r}")
    return reduction == "exact"


def _fork_machines(launch: mpi.Launch, n: int, device: str, master_rank: int, spin: float,
                   timeout: float | None, cores: list[int] | None, exact: bool) -> int:
    """``fork()`` under an MPI launcher: this machine's part (see the module docstring).

    Returns the total number of processes on machine 0; never returns elsewhere.
    """
    global _mpi_started, _atexit_registered
    on_master = launch.is_master
    local = master_rank if on_master else 0  # the leader's local rank
    if on_master:
        group = LocalGroup.create(n, device, master_rank, master_rank, spin, timeout)
        session = _build(group, cores, mpi_job=True)
        executor = session.executor
    else:  # not the master: rank 0 here until Join, and no master rank
        group = LocalGroup.create(n, device, 0, -1, spin, timeout, owner=False)
        executor = Executor(handlers.TABLE, handlers.LANES)
        core_context.install(group.ctx)
        try:
            _fork(group, executor, cores, mpi_job=True)
        except BaseException:
            group.teardown(None)
            raise
    ctx = group.ctx

    try:  # the group's watch: no timeout outside a round, no other machine yet
        leaders = mpi.start(n, liveness=group.watch, spin=max(spin, 1e-3),
                            expected_rank=launch.rank)
    except BaseException:
        if on_master:
            session.close()
        else:
            group.teardown(None)
        raise
    _mpi_started = True
    if on_master:
        # atexit runs the last registered first: the session's close comes before the
        # leaders' own exit hook (which would end the job if close() had not run)
        atexit.register(_at_exit)
        _atexit_registered = True
    if leaders.size == 1:  # mpiexec -n 1 (a launcher that did not say its size)
        leaders.close()
        log.info("synkhronos forked %d processes (%s)", n, device)
        return n
    setup = (ctx.prefix, master_rank, exact, timeout) if on_master else None
    try:
        master_prefix, master_rank, exact, timeout = leaders.broadcast_object(setup)
    except BaseException as exc:
        if on_master:
            session.close()
        leaders.abort(f"starting the session failed: {exc}")
    machines = Machines(leaders)
    join = Join(leaders.rank, machines.offsets, machines.local_sizes, master_rank,
                machines.offsets[leaders.rank] + local, master_prefix, exact)
    ctx.meeting = AcrossMachines(machines)  # the leader's; its workers choose at Join
    if on_master:
        session.run(join)  # this machine's processes only: the transport is still local
        session.use(Several(group, machines))
        ctx.arena.start_journal()
        # a little over the workers' limit: the leader of a machine whose worker is late
        # reports which one first (WorkerTimeoutError naming it)
        leaders.timeout = None if timeout is None else timeout + 0.5
        log.info("synkhronos forked %d processes on %d machines (%s)", ctx.size,
                 leaders.size, device)
        return ctx.size
    leader = Leader(group, machines, executor, handlers.LEADERS_ONLY, handlers.PREPARE)
    leader.join(join)
    leader.serve()  # never returns


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
