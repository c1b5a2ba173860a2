"""The crash matrix across the phases of the public calls.

One worker rank misbehaves at one phase of ``synk.distribute()``, of a function call,
or of a collective, in one of five ways: it raises, it calls ``os._exit(3)``, it is
SIGKILLed, it segfaults, or it stops (SIGSTOP, with ``fork(timeout=...)``). Phases:

- ``unpickle``: a custom Op in the function's graph misbehaves while the worker
  unpickles the distributed functions (its ``__reduce__`` rebuilds it through
  ``_unpickle_fault``, which runs in the worker only);
- ``perform``: the same Op misbehaves in its Python ``perform`` (``FAST_COMPILE``
  runs Python ``perform``);
- ``gather``: the worker misbehaves while it gathers its share of the ``batch``
  indices (``_shard.select_rows`` wrapped before the fork, so the workers inherit it);
  two more cases reach that phase through the real code path: a ``synk.data``
  segment unlinked, or truncated, under the workers;
- ``reply``: the Op's output is an array whose pickling misbehaves, so the worker
  fails while it returns its results, right after it computed them;
- ``collective``: ``all_reduce`` of a large variable over three ranks (the path with
  two barriers); the worker's backend is wrapped through a ``CALLABLE`` command to
  misbehave before its first barrier or right after it; and every other collective
  (its rank's step wrapped the same way) with a worker that raises or is killed.

Also: a real allocation failure in a worker (its address space capped through a
``CALLABLE``), which ``num_slices`` then avoids; a function that can never be pickled
or unpickled, which must not block the functions built after it; and what an
uncaught ``WorkerError`` prints.

Each case must be reported as ``SPEC.md`` section 6 says: a ``WorkerError`` with the
remote traceback, within 2 s, and a correct call afterwards; or a
``WorkerDiedError`` / ``WorkerTimeoutError`` naming rank and pid (and the signal or
exit code) within 5 s, the session staying broken. After ``synk.close()`` no child
process and no segment remain. Detection times are recorded as the ``detect_s``
property of each test (``--junitxml`` shows them).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import time
import traceback

import numpy as np
import posix_ipc
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

import synkhronos as synk
from synkhronos import _shard
from synkhronos import session as S
from synkhronos._runtime import shmem
from synkhronos.collectives.backend import Step, backend_for
from synkhronos.errors import WorkerDiedError, WorkerError, WorkerTimeoutError

from ..conftest import child_pids, segments_of

pytestmark = pytest.mark.timeout(60)

N = 3  # master rank 0 and two workers: the faulty one has a healthy peer
CRASH = 2  # the faulty rank; rank 1 is the healthy peer (waits in barriers)
RAISE_S = 2.0  # a worker exception must be reported within this
DETECT_S = 5.0  # a dead or stopped worker must be reported within this
TIMEOUT_S = 1.0  # fork(timeout=...) for the SIGSTOP cases
ROWS = 7
X = np.arange(ROWS * 4, dtype=np.float64).reshape(ROWS, 4)
IDX = [5, 0, 6, 3, 1, 4, 2]  # a shuffled batch: every process gathers its indices
W_SIZE = 10_000  # 80 kB: all_reduce takes the path with two barriers

# action -> the WorkerDiedError reason, None for an exception, "timeout" for a stop
ACTIONS = {
    "raise": None,
    "exit": "exited with code 3",
    "sigkill": "killed by SIGKILL",
    "sigsegv": "killed by SIGSEGV",
    "sigstop": "timeout",
}


# ---------------------------------------------------------------- the faults


class InjectedFault(Exception):
    """What the ``raise`` action raises."""


_fired: set[str] = set()  # per process: each phase misbehaves once (then calls work)


def fire(phase: str, action: str, rank: int) -> None:
    """In process ``rank`` only, and once per phase: misbehave as ``action`` says."""
    session = S.current()
    if session is None or session.rank != rank or phase in _fired:
        return
    _fired.add(phase)
    if action == "raise":
        raise InjectedFault(f"injected in rank {rank} while {phase}")
    if action == "exit":
        os._exit(3)
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "sigsegv":
        ctypes.string_at(0)
    elif action == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        raise AssertionError(f"unknown action {action!r}")


class Poison(np.ndarray):
    """An array whose pickling (a worker's reply) misbehaves in one rank."""

    fault: tuple[str, int] | None = None

    def __reduce__(self):
        if self.fault is not None:
            fire("reply", *self.fault)
        return (np.array, (np.asarray(self),))


class Fault(Op):
    """The identity on a matrix that misbehaves in rank ``rank`` during ``phase``."""

    __props__ = ("phase", "action", "rank")

    def __init__(self, phase: str, action: str, rank: int):
        self.phase = phase
        self.action = action
        self.rank = rank

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        if self.phase == "perform":
            fire("perform", self.action, self.rank)
        value = np.array(inputs[0])
        if self.phase == "reply":
            value = value.view(Poison)
            value.fault = (self.action, self.rank)
        output_storage[0][0] = value

    def __reduce__(self):
        return (_unpickle_fault, (self.phase, self.action, self.rank))


def _unpickle_fault(phase: str, action: str, rank: int) -> Fault:
    """Rebuilds a pickled ``Fault``: runs in each worker during ``distribute()``."""
    if phase == "unpickle":
        fire("unpickle", action, rank)
    return Fault(phase, action, rank)


def _faulty_select(original, action: str, rank: int):
    """``_shard.select_rows`` that misbehaves when it gathers rows by ``batch`` indices."""

    def select(array, batch):
        if batch is not None and batch.indices is not None:
            fire("gather", action, rank)
        return original(array, batch)

    return select


def _arm_collective(where: str, action: str) -> None:
    """In the faulty worker: make its next all_reduce misbehave at ``where``."""
    session = S.current()
    rank = session.rank
    if where == "before_barrier":
        backend = backend_for(session)
        load = backend._load

        def faulty_load(session, group):
            fire("collective", action, rank)
            return load(session, group)

        backend._load = faulty_load
    else:
        barrier = session.barrier

        def faulty_barrier():
            barrier()
            fire("collective", action, rank)

        session.barrier = faulty_barrier


def _arm_step(step: int, action: str) -> None:
    """In the faulty worker: make its part of the next ``step`` collective misbehave."""
    session = S.current()
    rank = session.rank
    backend = backend_for(session)
    original = backend._steps[step]

    def faulty(*args):
        fire("collective", action, rank)
        return original(*args)

    backend._steps[step] = faulty


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
_HELD: list = []  # a worker's blocks taken out of its free heap while capped


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _limit_memory(headroom: int) -> int:
    """In a worker: cap its address space at its current size plus ``headroom`` bytes.

    A cap only stops allocations that need new address space; a free chunk of the heap
    (inherited from the master, whose history depends on the tests before, or kept
    from an earlier call) would serve the same allocation under it. So large blocks
    are made to come from fresh mappings (a fixed glibc mmap threshold of 1 MiB) and
    the free chunks of 4 MiB or more are taken first and held until the cap is lifted.
    """
    ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    for size in (256 << 20, 64 << 20, 16 << 20, 4 << 20):
        while True:
            before = _address_space()
            block = np.empty(size, dtype=np.uint8)
            if _address_space() > before:  # a fresh mapping: no free chunk this big left
                del block
                break
            _HELD.append(block)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + headroom, hard))
    return soft


def _restore_memory(soft: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))
    _HELD.clear()


# ---------------------------------------------------------------- helpers


def _session() -> S.Session:
    session = S.current()
    assert session is not None
    return session


def _function(phase: str, action: str):
    """The module's one small function: gather the rows back, and their sum."""
    x = pt.dmatrix("x")
    y = Fault(phase, action, CRASH)(x)
    return synk.function([x], [(y, None), (y.sum(), "sum")], mode="FAST_COMPILE")


def _assert_correct_call(f) -> None:
    rows, total = f(X, batch=IDX)
    np.testing.assert_array_equal(rows, X[IDX])
    assert total == X[IDX].sum()
    want = f.as_pytensor(X[IDX])
    np.testing.assert_array_equal(rows, want[0])


def _expect_failure(trigger, action: str, pids: dict[int, int], frame: str,
                    record_property) -> BaseException:
    """Run ``trigger``; check what it raised for ``action``, and how fast."""
    outcome = ACTIONS[action]
    expected = {None: WorkerError, "timeout": WorkerTimeoutError}.get(outcome, WorkerDiedError)
    start = time.monotonic()
    with pytest.raises(expected) as info:
        trigger()
    elapsed = time.monotonic() - start
    record_property("detect_s", round(elapsed, 3))
    error = info.value
    assert error.rank == CRASH, f"named rank {error.rank}, not the faulty rank {CRASH}: {error}"
    if outcome is None:
        assert elapsed < RAISE_S, f"reported after {elapsed:.2f} s"
        assert error.exc_type.endswith("InjectedFault")
        assert f"injected in rank {CRASH}" in error.message
        assert "Traceback (most recent call last)" in error.remote_traceback
        assert frame in error.remote_traceback, error.remote_traceback
        assert "InjectedFault" in error.remote_traceback
        return error
    assert error.pid == pids[CRASH]
    assert f"rank {CRASH} (pid {pids[CRASH]})" in str(error)
    if outcome == "timeout":
        assert isinstance(error, TimeoutError)
        assert error.timeout == TIMEOUT_S
        assert TIMEOUT_S <= elapsed < DETECT_S, f"reported after {elapsed:.2f} s"
    else:
        assert error.reason == outcome
        assert f"died: {outcome}" in str(error)
        assert elapsed < DETECT_S, f"reported after {elapsed:.2f} s"
    return error


def _assert_stays_broken(error: BaseException, again) -> None:
    with pytest.raises(type(error), match=rf"rank {error.rank} \(pid {error.pid}\)"):
        again()


def _close_clean(pids: list[int]) -> None:
    synk.close()
    assert S.current() is None
    assert child_pids() == []
    assert [pid for pid in pids if os.path.exists(f"/proc/{pid}")] == []
    assert segments_of() == []


def _fork(action: str) -> dict[int, int]:
    synk.fork(N, timeout=TIMEOUT_S if action == "sigstop" else None)
    return {w.rank: w.pid for w in _session().workers}


# ---------------------------------------------------------------- distribute and call

CALL_PHASES = {
    # phase -> the frame the remote traceback of an exception must show
    "unpickle": "_unpickle_fault",
    "perform": "perform",
    "gather": "_gather_inputs",
    "reply": "__reduce__",
}


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("phase", list(CALL_PHASES))
def test_fault_in_a_phase_of_distribute_or_call(phase, action, monkeypatch, record_property):
    if phase == "gather":  # before the fork: the workers inherit it
        faulty = _faulty_select(_shard.select_rows, action, CRASH)
        monkeypatch.setattr(_shard, "select_rows", faulty)
    pids = _fork(action)
    try:
        f = _function(phase, action)
        if phase == "unpickle":
            trigger = synk.distribute
        else:
            synk.distribute()
            trigger = lambda: f(X, batch=IDX)  # noqa: E731
        error = _expect_failure(trigger, action, pids, CALL_PHASES[phase], record_property)
        if isinstance(error, WorkerError):
            _assert_correct_call(f)  # for "unpickle": distributes again, then calls
            _assert_correct_call(f)
        else:
            _assert_stays_broken(error, lambda: f(X, batch=IDX))
    finally:
        _close_clean(list(pids.values()))


def _die_after_creating_a_segment() -> None:
    """In a worker: be SIGKILLed right after the next segment it creates (its reply)."""
    create = shmem.create_segment

    def create_then_die(name, nbytes):
        segment = create(name, nbytes)
        os.kill(os.getpid(), signal.SIGKILL)
        return segment

    shmem.create_segment = create_then_die


def test_worker_killed_after_writing_an_oversized_reply(record_property):
    """A reply too large for its slot goes into a segment the worker creates; the
    worker dies right after creating it. close() must remove that segment too."""
    pids = _fork("sigkill")
    try:
        f = _function("none", "none")
        synk.distribute()
        rows = np.arange(3 * 3000 * 4, dtype=np.float64).reshape(3 * 3000, 4)  # 96 kB a rank
        np.testing.assert_array_equal(f(rows)[0], rows)
        _session().run(S.Opcode.CALLABLE, (_die_after_creating_a_segment, (), [CRASH]))
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="killed by SIGKILL") as info:
            f(rows)
        elapsed = time.monotonic() - start
        record_property("detect_s", round(elapsed, 3))
        assert elapsed < DETECT_S
        assert (info.value.rank, info.value.pid) == (CRASH, pids[CRASH])
        assert any(f"r{CRASH}_x{pids[CRASH]}" in name for name in segments_of())
    finally:
        _close_clean(list(pids.values()))


def test_a_printed_worker_error_shows_the_remote_traceback():
    """An uncaught WorkerError must show where the worker failed, not only its message.

    STYLE.md (after loky) and the reliability conventions: the remote traceback is
    chained as ``__cause__``, so Python prints it above the master's own traceback.
    """
    pids = _fork("raise")
    try:
        f = _function("perform", "raise")
        synk.distribute()
        with pytest.raises(WorkerError) as info:
            f(X, batch=IDX)
        assert "in perform" in info.value.remote_traceback  # the worker's own frames
        printed = "".join(traceback.format_exception(info.value))
        assert "in perform" in printed and "in fire" in printed, printed
    finally:
        _close_clean(list(pids.values()))


# ---------------------------------------------------------------- collectives


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("where", ["before_barrier", "after_barrier"])
def test_fault_in_a_collective(where, action, record_property):
    pids = _fork(action)
    try:
        w = pytensor.shared(np.zeros(W_SIZE), name="w")
        g = synk.function([], (w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        values = np.arange(W_SIZE, dtype=np.float64)
        synk.broadcast(w, values)
        session = _session()
        session.run(S.Opcode.CALLABLE, (_arm_collective, (where, action), [CRASH]))
        error = _expect_failure(
            lambda: synk.all_reduce(w, op="sum"), action, pids, "_all_reduce", record_property
        )
        if isinstance(error, WorkerError):
            synk.broadcast(w, values)  # the failed all_reduce left the slots half reduced
            synk.all_reduce(w, op="sum")
            for rank in range(N):
                np.testing.assert_array_equal(synk.get_value(rank, w), N * values)
            assert g() == N * N * values.sum()
        else:
            _assert_stays_broken(error, lambda: synk.all_reduce(w, op="sum"))
    finally:
        _close_clean(list(pids.values()))


VALUES = np.arange(6, dtype=np.float64)
COLLECTIVES = {
    # name -> (the step the faulty rank misbehaves in, the call)
    "broadcast": (Step.BROADCAST, lambda w: synk.broadcast(w, VALUES)),
    "scatter": (Step.SCATTER, lambda w: synk.scatter(w, np.arange(9.0))),
    "gather": (Step.GATHER, lambda w: synk.gather(w)),
    "all_gather": (Step.ALL_GATHER, lambda w: synk.all_gather(w)),
    "reduce": (Step.REDUCE, lambda w: synk.reduce(w, op="max")),
    "all_reduce_small": (Step.ALL_REDUCE, lambda w: synk.all_reduce(w, op="min")),
    "set_value": (Step.SET_VALUE, lambda w: synk.set_value(CRASH, w, VALUES + 1)),
    "get_value": (Step.GET_VALUE, lambda w: synk.get_value(CRASH, w)),
}


@pytest.mark.parametrize("action", ["raise", "sigkill"])
@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_fault_in_each_collective(name, action, record_property):
    """Every collective: a worker raising keeps all in step, a killed one is reported."""
    step, call = COLLECTIVES[name]
    pids = _fork(action)
    try:
        w = pytensor.shared(np.zeros(6), name="w")
        g = synk.function([], (w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        synk.broadcast(w, VALUES)
        _session().run(S.Opcode.CALLABLE, (_arm_step, (int(step), action), [CRASH]))
        error = _expect_failure(lambda: call(w), action, pids, "faulty", record_property)
        if isinstance(error, WorkerError):
            synk.broadcast(w, VALUES)
            synk.all_reduce(w, op="sum")
            assert [synk.get_value(r, w).tolist() for r in range(N)] == [(N * VALUES).tolist()] * N
            assert g() == N * N * VALUES.sum()
            call(w)  # the same collective works now
        else:
            _assert_stays_broken(error, lambda: call(w))
    finally:
        _close_clean(list(pids.values()))


# ---------------------------------------------------------------- allocation failure


def test_allocation_failure_in_a_worker_then_sliced_call_fits(record_property):
    """A worker's address space is capped: a call that needs more memory than that
    raises MemoryError there (a WorkerError naming the rank, peers not stuck); the same
    call with ``num_slices`` fits, and equals the serial result.
    """
    pids = _fork("raise")
    session = _session()
    try:
        x, y = pt.dvector("x"), pt.dvector("y")
        # elementwise, no BLAS: OpenBLAS exits the process when it cannot allocate
        f = synk.function([x], ((x[:, None] * y[None, :]).sum(), "sum"), bcast_inputs=[y],
                          mode="FAST_COMPILE")
        synk.distribute()
        xs, ys = np.linspace(0, 1, 3 * 3000), np.linspace(1, 2, 3000)  # 72 MB per rank
        want = f.as_pytensor(xs, ys)
        np.testing.assert_allclose(f(xs, ys), want, rtol=1e-12)
        soft = session.run(S.Opcode.CALLABLE, (_limit_memory, (32 << 20,), [CRASH]))[CRASH]
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            f(xs, ys)
        elapsed = time.monotonic() - start
        record_property("detect_s", round(elapsed, 3))
        assert elapsed < RAISE_S
        assert info.value.rank == CRASH
        assert "MemoryError" in info.value.exc_type
        np.testing.assert_allclose(f(xs, ys, num_slices=8), want, rtol=1e-12)
        session.run(S.Opcode.CALLABLE, (_restore_memory, (soft,), [CRASH]))
        np.testing.assert_allclose(f(xs, ys), want, rtol=1e-12)
    finally:
        _close_clean(list(pids.values()))


# ---------------------------------------------------------------- gathering, the real path


def test_data_unlinked_under_the_workers_is_a_worker_error(record_property):
    """Another program removed a Data's segment before the workers mapped it."""
    pids = _fork("raise")
    try:
        f = _function("none", "none")
        synk.distribute()
        xd = synk.data(X)
        segment = xd.ref().segment
        assert shmem.unlink_segment(segment)
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            f(xd, batch=IDX)
        elapsed = time.monotonic() - start
        record_property("detect_s", round(elapsed, 3))
        assert elapsed < RAISE_S
        error = info.value
        assert error.rank == 1  # every worker failed; the lowest rank is reported
        assert error.exc_type == "FileNotFoundError"
        assert segment in error.message
        assert "_gather_inputs" in error.remote_traceback
        np.testing.assert_array_equal(f(synk.data(X), batch=IDX)[0], X[IDX])
        _assert_correct_call(f)
    finally:
        _close_clean(list(pids.values()))


def test_data_truncated_under_a_worker_kills_it_with_sigbus(record_property):
    """Rows a worker gathers lie past the end of a segment shrunk under it: SIGBUS.

    One row is one page; the master's rows stay inside the shrunk segment (it must
    not touch the rest either: it would get SIGBUS itself).
    """
    synk.fork(2)
    session = _session()
    pids = {w.rank: w.pid for w in session.workers}
    try:
        f = _function("none", "none")
        synk.distribute()
        page = os.sysconf("SC_PAGE_SIZE")
        rows = np.arange(4 * page // 8, dtype=np.float64).reshape(4, page // 8)
        xd = synk.data(rows)
        batch = [1, 0, 3, 2]  # the master gathers rows 1 and 0, the worker 3 and 2
        np.testing.assert_array_equal(f(xd, batch=batch)[0], rows[batch])  # worker maps it
        shm = posix_ipc.SharedMemory("/" + xd.ref().segment)
        try:
            os.ftruncate(shm.fd, 2 * page)
        finally:
            shm.close_fd()
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            f(xd, batch=batch)
        elapsed = time.monotonic() - start
        record_property("detect_s", round(elapsed, 3))
        assert elapsed < DETECT_S
        assert (info.value.rank, info.value.pid, info.value.reason) == (
            1, pids[1], "killed by SIGBUS"
        )
    finally:
        _close_clean(list(pids.values()))


# ---------------------------------------------------------------- distribution that never works


@pytest.mark.parametrize("where", ["pickling_in_the_master", "unpickling_in_the_workers"])
def test_a_function_that_never_distributes_does_not_block_later_functions(where):
    """A function that cannot be pickled (master) or unpickled (workers) is reported.

    The session must stay usable: functions built afterwards must still distribute
    and run (SPEC 6: "all processes stay in step and the next call works").
    """
    synk.fork(2)
    pids = [w.pid for w in _session().workers]
    try:
        x = pt.dmatrix("x")
        synk.function([x], Never(where)(x).sum(), mode="FAST_COMPILE")
        if where == "pickling_in_the_master":
            with pytest.raises(InjectedFault, match=r"never pickles in rank 0"):
                synk.distribute()
        else:
            with pytest.raises(WorkerError, match=r"never unpickles in rank 1") as info:
                synk.distribute()
            assert "_never_unpickles" in info.value.remote_traceback
        assert _session().run(S.Opcode.CALLABLE, (os.getpid, (), None))[1] == pids[0]
        good = synk.function([x], (x.sum(), "sum"), mode="FAST_COMPILE")
        assert good(X) == X.sum()
    finally:
        _close_clean(pids)


class Never(Op):
    """The identity on a matrix that cannot be pickled in the master, or unpickled in
    any worker."""

    __props__ = ("where",)

    def __init__(self, where: str):
        self.where = where

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = np.array(inputs[0])

    def __reduce__(self):
        if self.where == "pickling_in_the_master":
            raise InjectedFault(f"never pickles in rank {S.current().rank}")
        return (_never_unpickles, ())


def _never_unpickles() -> Never:
    session = S.current()
    if session is not None and not session.is_master:
        raise InjectedFault(f"never unpickles in rank {session.rank}")
    return Never("unpickling_in_the_workers")
