"""Helpers for testing programs that use synkhronos (and synkhronos itself).

Everything a test needs to look inside a session without reaching into private
modules:

- run code on chosen ranks: :func:`run_on_ranks`, :func:`ping`; inside it,
  :func:`this_rank` and :func:`mapped` (whether a segment is mapped there);
- read and set every process's value of a shared variable: :func:`rank_values`,
  :func:`set_rank_values`, :func:`on_variable`;
- break a process on purpose: :func:`crash` (raise, ``sys.exit``, ``os._exit``,
  SIGKILL, SIGSEGV, SIGABRT, SIGSTOP), now, or at a named point of a later command
  (:func:`fault_at`: unpickling, gathering rows, running, replying, inside a
  collective);
- check that nothing is left behind: :func:`child_pids`, :func:`leftover_segments`,
  :func:`assert_clean`;
- the session's state: :func:`session_open`, :func:`session_state`,
  :func:`program_prefix`, :func:`process_pids`, :func:`commands_run` (to count round
  trips), :func:`lane_runs` (round trips a worker took its shortcut for),
  :func:`distribute_seconds`; over several machines, where each rank runs:
  :func:`rank_hosts`, :func:`rank_machines`;
- the rule that splits rows over processes: :func:`split_bounds`, and by ``shares``:
  :func:`weighted_counts`.

Collective: the functions that run code on the processes are commands like any other
(every process takes part; they return when all have finished).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from . import _pytensor
from ._core import context, faults
from ._core.faults import POINTS
from ._core.protocol import Ping, RunCallable
from ._core.session import current, require
from ._machines.transport import leaders_of
from ._runtime import shmem
from ._scatter import split_bounds, weighted_counts
from .distribute import REGISTRY

__all__ = [
    "run_on_ranks",
    "ping",
    "spin_seconds",
    "this_rank",
    "mapped",
    "rank_values",
    "set_rank_values",
    "on_variable",
    "crash",
    "CRASHES",
    "fault_at",
    "POINTS",
    "session_state",
    "commands_run",
    "lane_runs",
    "process_pids",
    "rank_hosts",
    "rank_machines",
    "distribute_seconds",
    "compiled",
    "session_open",
    "program_prefix",
    "child_pids",
    "leftover_segments",
    "assert_clean",
    "split_bounds",
    "weighted_counts",
    "barrier",
    "skip_backend_preimport",
    "skip_watcher",
]

Crash = Literal["raise", "sys_exit", "exit", "kill", "segv", "abort", "stop", "slow"]
CRASHES: tuple[str, ...] = faults.HOWS
"""Every way :func:`crash` can break a process."""


def run_on_ranks(fn: Callable[..., Any], *args: Any, ranks: Sequence[int] | None = None
                 ) -> list[Any]:
    """Run ``fn(*args)`` in the processes of ``ranks`` (default: all); reply per rank.

    ``fn`` and ``args`` must pickle (a module-level function). Ranks not chosen reply
    None. An exception in ``fn`` is raised as ``WorkerError``, as a function call's.
    """
    session = require("synkhronos.testing.run_on_ranks()")
    chosen = None if ranks is None else tuple(int(r) for r in ranks)
    return session.run(RunCallable(fn, tuple(args), chosen))


def this_rank() -> int:
    """The rank of the calling process (inside a function run by :func:`run_on_ranks`)."""
    ctx = context.current()
    if ctx is None:
        raise RuntimeError("this_rank() needs an open session in this process")
    return ctx.rank


def mapped(segment: str) -> bool:
    """Whether the calling process holds a mapping of the shared-memory ``segment``
    (for example a ``Data``'s, ``x.ref().segment``)."""
    ctx = context.current()
    return ctx is not None and segment in ctx.arena


_PING = Ping()


def ping() -> None:
    """The empty command: every process wakes, does nothing, and replies (a benchmark
    of one round trip)."""
    session = current() or require("synkhronos.testing.ping()")
    session.run(_PING, repeats=True)  # pickled once, as every repeated command is


def spin_seconds() -> float:
    """How long a waiting process spins before it sleeps (``fork(spin=...)``; 0 with
    one process)."""
    control = require("synkhronos.testing.spin_seconds()").ctx.control
    return control.spin if control is not None else 0.0


def _value_of(uid: int) -> np.ndarray:
    ctx = context.current()
    assert ctx is not None
    return np.array(_pytensor.value(REGISTRY.get(ctx).shared[uid]))


def _set_value_of(uid: int, values: list) -> None:
    ctx = context.current()
    assert ctx is not None
    REGISTRY.get(ctx).shared[uid].set_value(values[ctx.rank])


def _uid(var: Any) -> int:
    session = require("synkhronos.testing")
    uid = REGISTRY.get(session.ctx).uid(var)
    if uid is None:
        raise ValueError(f"shared variable {var} is not used by any distributed function")
    return uid


def _apply(uid: int, fn: Callable[..., Any], args: tuple) -> Any:
    ctx = context.current()
    assert ctx is not None
    return fn(REGISTRY.get(ctx).shared[uid], ctx.rank, *args)


def on_variable(var: Any, fn: Callable[..., Any], *args: Any,
                ranks: Sequence[int] | None = None) -> list[Any]:
    """Run ``fn(variable, rank, *args)`` in each process of ``ranks`` (default: all),
    with that process's own copy of the distributed shared variable ``var``.

    For tests that set or inspect a value in place (a strided array, a storage that
    must be a given object), which pickled values cannot do.
    """
    return run_on_ranks(_apply, _uid(var), fn, tuple(args), ranks=ranks)


def rank_values(var: Any) -> list[np.ndarray]:
    """Every process's value of a distributed shared variable, by rank (copies)."""
    return run_on_ranks(_value_of, _uid(var))


def set_rank_values(var: Any, values: Sequence[Any]) -> None:
    """Give process ``r`` the value ``values[r]`` of a distributed shared variable."""
    session = require("synkhronos.testing.set_rank_values()")
    if len(values) != session.n:
        raise ValueError(f"values must hold one value per process ({session.n}); "
                         f"got {len(values)}")
    run_on_ranks(_set_value_of, _uid(var), list(values))


def crash(rank: int, how: Crash = "kill", code: int = 3) -> Any:
    """Break process ``rank`` inside a command, the way ``how`` says.

    ``"raise"`` and ``"sys_exit"`` are exceptions in user code: the master raises
    ``WorkerError`` and the session stays usable. ``"exit"`` (``os._exit(code)``),
    ``"kill"``, ``"segv"``, ``"abort"`` end the process: ``WorkerDiedError``, and the
    session is broken until ``close()``. ``"stop"`` (SIGSTOP) never finishes: only a
    ``fork(timeout=...)`` ends the wait (``WorkerTimeoutError``). On the master's own
    rank the process-ending ways end the program itself. ``"slow"`` breaks nothing: the
    process lags 0.3 s behind the others, then goes on (a race's test).

    Returns what the command returns (it raises in every case but a stopped process
    that a test later continues).
    """
    if how not in CRASHES:
        raise ValueError(f"how must be one of {', '.join(CRASHES)}; got {how!r}")
    return run_on_ranks(faults.break_process, how, code, ranks=[rank])


def _arm(point: str, how: str, code: int) -> None:
    faults.arm(point, how, code, now=False)  # from the next command on


@contextlib.contextmanager
def fault_at(point: str, how: Crash, ranks: Sequence[int], code: int = 3) -> Iterator[None]:
    """Inside the block, processes ``ranks`` break at ``point`` the next time they pass it
    (once each); see ``POINTS``.

    ``point``: ``"unpickle"`` (a worker unpickling distributed functions),
    ``"gather"`` (a rank gathering its rows of a call), ``"function"`` (before its
    PyTensor function runs), ``"reply"`` (a worker after its part, before its reply),
    ``"collective"`` (inside any collective, before it moves data), ``"exchange"``
    (after its first barrier, or after it moved its data). ``how`` as for
    :func:`crash`. Arming is itself a command (its own reply passes no point); points
    armed in a process that did not pass them are disarmed at the end of the block
    when the session is still usable.
    """
    if point not in POINTS:
        raise ValueError(f"point must be one of {', '.join(POINTS)}; got {point!r}")
    if how not in CRASHES:
        raise ValueError(f"how must be one of {', '.join(CRASHES)}; got {how!r}")
    session = require("synkhronos.testing.fault_at()")
    master = session.ctx.master_rank
    workers = [r for r in ranks if r != master]
    if workers:
        run_on_ranks(_arm, point, how, code, ranks=workers)
    if master in ranks:
        faults.arm(point, how, code)  # after the arming command: it passes no point
    try:
        yield
    finally:
        faults.disarm()
        if workers and session.state.value == "ready":
            run_on_ranks(faults.disarm, ranks=workers)


def session_state() -> str | None:
    """``"ready"``, ``"broken"`` (a process died or timed out: call ``close()``),
    ``"closed"``, or None without a session."""
    session = current()
    return None if session is None else session.state.value


def process_pids() -> list[int]:
    """The pid of every process of the session, by rank (over several machines, each
    on its own machine: a command asks them)."""
    session = require("synkhronos.testing.process_pids()")
    if session.replica_groups is not None:  # several machines
        return run_on_ranks(os.getpid)
    pids = [0] * session.n
    pids[session.ctx.master_rank] = session.ctx.master_pid
    for worker in session.workers:
        pids[worker.rank] = worker.pid
    return pids


def rank_hosts() -> list[str]:
    """The host name of the machine of every rank (one machine: this host's name)."""
    session = require("synkhronos.testing.rank_hosts()")
    machines = leaders_of(session.ctx)  # the master is machine 0's leader
    if machines is None:
        return [socket.gethostname()] * session.n
    return [machines.host_of(rank) for rank in range(session.n)]


def rank_machines() -> list[int]:
    """The machine (0 is the master's) of every rank (one machine: all 0)."""
    session = require("synkhronos.testing.rank_machines()")
    return [session.ctx.machine_of(rank) for rank in range(session.n)]


def compiled(function: Any) -> bool:
    """Whether ``function`` (a ``synk.Function``) has been compiled for its calls in
    the master: at its first call, not at ``synk.distribute()``."""
    reg = REGISTRY.get(require("synkhronos.testing.compiled()").ctx)
    local = function._local
    return any(fn is local and fn_id in reg.compiled for fn_id, fn in reg.functions.items())


def distribute_seconds() -> dict[str, Any]:
    """What the last ``synk.distribute()`` that shipped something cost: each worker's
    unpickling time (``"unpickle"``), and the master's compile time of the functions
    first called since (``"compile"``: a function compiles at its first call)."""
    reg = REGISTRY.get(require("synkhronos.testing.distribute_seconds()").ctx)
    return {"compile": reg.compile_seconds, "unpickle": list(reg.unpickle_seconds)}


def commands_run() -> int:
    """How many commands the session has run (each a round trip to every worker)."""
    return require("synkhronos.testing.commands_run()").commands


def lane_runs() -> list[int]:
    """Per rank, how many commands its process has run through a lane, a shortcut for
    a command that repeats the one before (a training loop's call): a worker's
    (``Executor.lanes``), and the master's command posted again as it stood
    (``ControlBlock.post``; none at ``n_parallel=1``, where nothing is posted)."""
    return run_on_ranks(_lane_runs)


def _lane_runs() -> int:
    from . import worker

    session = current()
    if session is None:
        return worker.lane_runs
    control = session.ctx.control
    return 0 if control is None else control.reposts


def session_open() -> bool:
    """Whether this program has an open session (``fork()`` called, not closed)."""
    return current() is not None


def program_prefix() -> str:
    """The prefix of every shared-memory name of this program's session."""
    return require("synkhronos.testing.program_prefix()").ctx.prefix


def child_pids(parent: int | None = None) -> list[int]:
    """Live (non-zombie) children of ``parent`` (default: this process), from /proc."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry))
    return found


def leftover_segments(pid: int | None = None) -> list[str]:
    """Entries in ``/dev/shm`` of synkhronos programs whose master is ``pid``
    (default: this process)."""
    pid = os.getpid() if pid is None else pid
    mark = f"{shmem.PREFIX}{pid}_"
    try:
        entries = os.listdir(shmem.SHM_DIR)
    except FileNotFoundError:
        return []
    return [e for e in entries if e.startswith(mark) or e.startswith("sem." + mark)]


def assert_clean(pid: int | None = None) -> None:
    """Assert that the program of ``pid`` (default: this one) left no child process
    and no shared-memory entry behind."""
    children = child_pids(pid)
    assert children == [], f"child processes left behind: {children}"
    left = leftover_segments(pid)
    assert left == [], f"shared-memory entries left behind: {left}"


# -- added for the fault suite (tests/faults) ---------------------------------------------------


def barrier() -> None:
    """Inside a function run by :func:`run_on_ranks` on every rank: wait until every
    process reaches this point (the meeting point collectives use; it watches that
    the peers are alive while it waits, and raises if one failed before it)."""
    ctx = context.current()
    if ctx is None:
        raise RuntimeError("barrier() needs an open session in this process")
    ctx.meeting.barrier(ctx)


def skip_backend_preimport() -> None:
    """Make this program's later ``fork()`` calls skip the pre-import of PyTensor's Numba
    backend (a second or more per program), which only saves the workers compile time.

    For test programs that compile nothing for Numba (process handling, fault tests).
    """
    from . import lifecycle

    lifecycle.PREIMPORT_BACKEND = False


def skip_watcher() -> None:
    """Make this program's later ``fork()`` calls start no watcher process, as versions
    before it did: a session whose processes are all killed at once then leaves its
    segments until the next ``fork()`` on the machine sweeps them.

    For tests of that sweep.
    """
    from ._runtime import watcher

    watcher.ENABLED = False
