"""The crash matrix across the phases of the public calls.

One worker rank misbehaves at one phase of ``synk.distribute()``, of a function call,
or of a collective, in one of six ways: it raises, it calls ``sys.exit(3)`` (a failure
like any exception), it calls ``os._exit(3)``, it is SIGKILLed, it segfaults, or it
stops (SIGSTOP, with ``fork(timeout=...)``). Phases, through the named fault points of
``synkhronos.testing.fault_at``:

- ``unpickle``: while the worker unpickles the distributed functions;
- ``gather``: while it gathers its share of the ``batch`` indices; two more cases reach
  that phase through the real code path: a ``synk.data`` segment unlinked, or
  truncated, under the workers;
- ``function``: right before its PyTensor function runs;
- ``reply``: after its part, before it writes its reply;
- ``collective`` / ``exchange``: inside a collective, before its first barrier or
  right after it (``all_reduce`` of a large variable over three ranks), and every
  other collective with a worker that raises or is killed.

And in user code: a custom Op misbehaves in its Python ``perform`` (``FAST_COMPILE``
runs Python ``perform``), on a worker and on the master's own share.

Also: a worker killed right after it created the segment of an oversized reply (by
SIGXFSZ, its file-size limit lowered), a real allocation failure in a worker (its
address space capped), which ``num_slices`` then avoids; a function that can never be
pickled or unpickled, which must not block the functions built after it; and what an
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
import sys
import threading
import time
import traceback

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

import synkhronos as synk
from synkhronos.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from synkhronos.testing import fault_at, run_on_ranks, session_open, session_state, this_rank

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

# action -> (the way synkhronos.testing breaks a process, the expected outcome):
# ("error", exception type) for a WorkerError, a WorkerDiedError reason, or "timeout"
ACTIONS = {
    "raise": ("raise", ("error", "RuntimeError")),
    "sys_exit": ("sys_exit", ("error", "SystemExit")),
    "exit": ("exit", "exited with code 3"),
    "sigkill": ("kill", "killed by SIGKILL"),
    "sigsegv": ("segv", "killed by SIGSEGV"),
    "sigstop": ("stop", "timeout"),
}


# ---------------------------------------------------------------- faults in user code


class InjectedFault(Exception):
    """What the user Op's ``raise`` action raises."""


_fired: set[str] = set()  # per process: each phase misbehaves once (then calls work)


def fire(phase: str, action: str, rank: int) -> None:
    """In process ``rank`` only, and once per phase: misbehave as ``action`` says."""
    if this_rank() != rank or phase in _fired:
        return
    _fired.add(phase)
    if action == "raise":
        raise InjectedFault(f"injected in rank {rank} while {phase}")
    if action == "sys_exit":
        sys.exit(3)
    if action == "exit":
        os._exit(3)
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "sigsegv":
        ctypes.string_at(0)  # a real segfault, not a signal sent
    elif action == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        raise AssertionError(f"unknown action {action!r}")


class Fault(Op):
    """The identity on a matrix that misbehaves in rank ``rank`` in its ``perform``."""

    __props__ = ("action", "rank")

    def __init__(self, action: str, rank: int):
        self.action = action
        self.rank = rank

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        if self.action != "none":
            fire("perform", self.action, self.rank)
        output_storage[0][0] = np.array(inputs[0])


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


def _limit_file_size(nbytes: int) -> None:
    """In a worker: files (shared-memory segments too) may not grow past ``nbytes``, and
    growing one past that kills the process (SIGXFSZ, which Python ignores by default);
    no core file."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE,
                       (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


# ---------------------------------------------------------------- helpers


def _function(action: str = "none", rank: int = CRASH):
    """The module's one small function: gather the rows back, and their sum."""
    x = pt.dmatrix("x")
    y = Fault(action, rank)(x)
    return synk.function([x], [(y, "gather"), (y.sum(), "sum")], mode="FAST_COMPILE")


def _assert_correct_call(f) -> None:
    rows, total = f(X, batch=IDX)
    np.testing.assert_array_equal(rows, X[IDX])
    assert total == X[IDX].sum()
    want = f.as_pytensor(X[IDX])
    np.testing.assert_array_equal(rows, want[0])


def _expect_failure(trigger, action: str, pids: list[int], record_property,
                    rank: int = CRASH, user_code: bool = False) -> BaseException:
    """Run ``trigger``; check what it raised for ``action`` in ``rank``, and how fast.

    ``user_code``: the fault is the user Op's (its own exception class), not
    ``synkhronos.testing``'s.
    """
    outcome = ACTIONS[action][1]
    if user_code and action == "raise":
        outcome = ("error", "InjectedFault")
    if isinstance(outcome, tuple):
        expected = WorkerError
    else:
        expected = WorkerTimeoutError if outcome == "timeout" else WorkerDiedError
    start = time.monotonic()
    with pytest.raises(expected) as info:
        trigger()
    elapsed = time.monotonic() - start
    record_property("detect_s", round(elapsed, 3))
    error = info.value
    assert error.rank == rank, f"named rank {error.rank}, not the faulty rank {rank}: {error}"
    if isinstance(outcome, tuple):
        assert elapsed < RAISE_S, f"reported after {elapsed:.2f} s"
        assert error.exc_type.endswith(outcome[1]), error
        assert "Traceback (most recent call last)" in error.remote_traceback
        assert outcome[1] in error.remote_traceback, error.remote_traceback
        assert session_state() == "ready"
        return error
    assert error.pid == pids[rank]
    assert f"rank {rank} (pid {pids[rank]})" in str(error)
    assert session_state() == "broken"
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
    assert not session_open()
    assert child_pids() == []
    workers = [pid for pid in pids if pid != os.getpid()]
    assert [pid for pid in workers if os.path.exists(f"/proc/{pid}")] == []
    assert segments_of() == []


def _fork(action: str) -> list[int]:
    """Fork the session; every process's pid, by rank."""
    _fired.clear()  # the master's own faults of earlier tests: not inherited by workers
    synk.fork(N, timeout=TIMEOUT_S if action == "sigstop" else None)
    return run_on_ranks(os.getpid)


# ---------------------------------------------------------------- distribute and call

CALL_POINTS = ["unpickle", "gather", "function", "reply"]


def _call_cases():
    for point in CALL_POINTS:
        for action in ACTIONS:
            yield pytest.param(point, action, id=f"{point}-{action}")


@pytest.mark.parametrize("point, action", list(_call_cases()))
def test_fault_in_a_phase_of_distribute_or_call(point, action, record_property):
    pids = _fork(action)
    try:
        f = _function()
        if point == "unpickle":
            trigger = synk.distribute
        else:
            synk.distribute()
            trigger = lambda: f(X, batch=IDX)  # noqa: E731
        with fault_at(point, ACTIONS[action][0], ranks=[CRASH]):
            error = _expect_failure(trigger, action, pids, record_property)
        if isinstance(error, WorkerError):
            if ACTIONS[action][0] == "raise":
                assert "raised on purpose" in error.message
            _assert_correct_call(f)  # for "unpickle": distributes again, then calls
            _assert_correct_call(f)
        else:
            _assert_stays_broken(error, lambda: f(X, batch=IDX))
    finally:
        _close_clean(pids)


@pytest.mark.parametrize("action", list(ACTIONS))
def test_fault_in_a_user_ops_perform(action, record_property):
    """User code in a worker's share misbehaves: its own exception, exit, or death."""
    pids = _fork(action)
    try:
        f = _function(action, CRASH)
        synk.distribute()
        error = _expect_failure(lambda: f(X, batch=IDX), action, pids, record_property,
                                user_code=True)
        if isinstance(error, WorkerError):
            assert "in perform" in error.remote_traceback, error.remote_traceback
            if action == "raise":
                assert error.exc_type.endswith("InjectedFault")
                assert f"injected in rank {CRASH} while perform" in error.message
            else:
                assert error.message == "3"
            _assert_correct_call(f)
            _assert_correct_call(f)
        else:
            _assert_stays_broken(error, lambda: f(X, batch=IDX))
    finally:
        _close_clean(pids)


@pytest.mark.parametrize("action", ["raise", "sys_exit"])
def test_fault_in_the_masters_own_share(action, record_property):
    """The master's share fails like a worker's: WorkerError naming rank 0, the workers
    finish the command, and the next call works (``sys.exit`` included)."""
    pids = _fork(action)
    try:
        f = _function(action, 0)
        synk.distribute()
        error = _expect_failure(lambda: f(X, batch=IDX), action, pids, record_property,
                                rank=0, user_code=True)
        assert "in perform" in error.remote_traceback
        assert isinstance(error.__cause__, InjectedFault if action == "raise" else SystemExit)
        _assert_correct_call(f)
        for point in ("gather", "function"):
            with fault_at(point, ACTIONS[action][0], ranks=[0]):
                _expect_failure(lambda: f(X, batch=IDX), action, pids, record_property, rank=0)
            _assert_correct_call(f)
        assert run_on_ranks(os.getpid) == pids
    finally:
        _close_clean(pids)


def test_worker_killed_after_creating_the_segment_of_an_oversized_reply(record_property):
    """A reply too large for its slot goes into a segment the worker creates; the
    worker dies right after creating it (its file-size limit is lowered, so growing the
    segment kills it by SIGXFSZ). close() must remove that segment too."""
    pids = _fork("sigkill")
    try:
        x, w = pt.dvector("x"), pt.dvector("w")
        f = synk.function([x], (w * x.sum(), "sum"), bcast_inputs=[w], mode="FAST_COMPILE")
        synk.distribute()
        xs, ws = np.arange(6.0), np.linspace(0, 1, 20_000)  # 160 kB a rank: past its slot
        np.testing.assert_allclose(f(xs, ws), ws * xs.sum(), rtol=1e-12)
        before = segments_of()
        run_on_ranks(_limit_file_size, 4096, ranks=[CRASH])
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="killed by SIGXFSZ") as info:
            f(xs, ws)
        elapsed = time.monotonic() - start
        record_property("detect_s", round(elapsed, 3))
        assert elapsed < DETECT_S
        assert (info.value.rank, info.value.pid) == (CRASH, pids[CRASH])
        assert set(segments_of()) - set(before), "the worker's reply segment is not there"
    finally:
        _close_clean(pids)


def test_a_printed_worker_error_shows_the_remote_traceback():
    """An uncaught WorkerError must show where the worker failed, not only its message.

    STYLE.md (after loky) and the reliability conventions: the remote traceback is
    chained as ``__cause__``, so Python prints it above the master's own traceback.
    """
    pids = _fork("raise")
    try:
        f = _function("raise", CRASH)
        synk.distribute()
        with pytest.raises(WorkerError) as info:
            f(X, batch=IDX)
        assert "in perform" in info.value.remote_traceback  # the worker's own frames
        printed = "".join(traceback.format_exception(info.value))
        assert "in perform" in printed and "in fire" in printed, printed
    finally:
        _close_clean(pids)


# ---------------------------------------------------------------- collectives


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("point", ["collective", "exchange"])
def test_fault_in_a_collective(point, action, record_property):
    """``collective``: before the first barrier; ``exchange``: right after it."""
    pids = _fork(action)
    try:
        w = pytensor.shared(np.zeros(W_SIZE), name="w")
        g = synk.function([], (w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        values = np.arange(W_SIZE, dtype=np.float64)
        synk.broadcast(w, values)
        with fault_at(point, ACTIONS[action][0], ranks=[CRASH]):
            error = _expect_failure(
                lambda: synk.all_reduce(w, op="sum"), action, pids, record_property
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
        _close_clean(pids)


def test_a_timeout_names_the_rank_that_never_reached_the_barrier(record_property):
    """Rank 2 stops before the collective's first barrier; rank 1 reaches it and waits,
    and is stopped there too, so it cannot see the master give up (as a loaded machine
    may keep it from seeing in time): the timeout still names rank 2, the one that
    holds the others back, not rank 1, the first late one in rank order."""
    pids = _fork("sigstop")
    stop_peer = threading.Timer(TIMEOUT_S / 2, os.kill, (pids[1], signal.SIGSTOP))
    try:
        w = pytensor.shared(np.zeros(W_SIZE), name="w")
        synk.function([], (w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()

        def trigger():
            stop_peer.start()
            synk.all_reduce(w, op="sum")

        with fault_at("collective", "stop", ranks=[CRASH]):
            error = _expect_failure(trigger, "sigstop", pids, record_property)
        _assert_stays_broken(error, lambda: synk.all_reduce(w, op="sum"))
    finally:
        stop_peer.cancel()
        if stop_peer.ident is not None:  # (started: wait for its kill, if under way)
            stop_peer.join()
        _close_clean(pids)


VALUES = np.arange(6, dtype=np.float64)
COLLECTIVES = {
    "broadcast": lambda w: synk.broadcast(w, VALUES),
    "scatter": lambda w: synk.scatter(w, np.arange(9.0)),
    "gather": lambda w: synk.gather(w),
    "all_gather": lambda w: synk.all_gather(w),
    "reduce": lambda w: synk.reduce(w, op="max"),
    "all_reduce_small": lambda w: synk.all_reduce(w, op="min"),
    "set_value": lambda w: synk.set_value(CRASH, w, VALUES + 1),
    "get_value": lambda w: synk.get_value(CRASH, w),
}
# Collectives whose ranks never pass the "collective" fault point (see faults_notes.md)
def _each_collective_cases():
    for name in COLLECTIVES:
        for action in ("raise", "sigkill"):
            yield pytest.param(name, action, id=f"{name}-{action}")


@pytest.mark.parametrize("name, action", list(_each_collective_cases()))
def test_fault_in_each_collective(name, action, record_property):
    """Every collective: a worker raising keeps all in step, a killed one is reported."""
    call = COLLECTIVES[name]
    pids = _fork(action)
    try:
        w = pytensor.shared(np.zeros(6), name="w")
        g = synk.function([], (w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        synk.broadcast(w, VALUES)
        with fault_at("collective", ACTIONS[action][0], ranks=[CRASH]):
            error = _expect_failure(lambda: call(w), action, pids, record_property)
        if isinstance(error, WorkerError):
            synk.broadcast(w, VALUES)
            synk.all_reduce(w, op="sum")
            assert [synk.get_value(r, w).tolist() for r in range(N)] == [(N * VALUES).tolist()] * N
            assert g() == N * N * VALUES.sum()
            call(w)  # the same collective works now
        else:
            _assert_stays_broken(error, lambda: call(w))
    finally:
        _close_clean(pids)


# ---------------------------------------------------------------- allocation failure


def test_allocation_failure_in_a_worker_then_sliced_call_fits(record_property):
    """A worker's address space is capped: a call that needs more memory than that
    raises MemoryError there (a WorkerError naming the rank, peers not stuck); the same
    call with ``num_slices`` fits, and equals the serial result.
    """
    pids = _fork("raise")
    try:
        x, y = pt.dvector("x"), pt.dvector("y")
        # elementwise, no BLAS: OpenBLAS exits the process when it cannot allocate
        f = synk.function([x], ((x[:, None] * y[None, :]).sum(), "sum"), bcast_inputs=[y],
                          mode="FAST_COMPILE")
        synk.distribute()
        xs, ys = np.linspace(0, 1, 3 * 3000), np.linspace(1, 2, 3000)  # 72 MB per rank
        want = f.as_pytensor(xs, ys)
        np.testing.assert_allclose(f(xs, ys), want, rtol=1e-12)
        soft = run_on_ranks(_limit_memory, 32 << 20, ranks=[CRASH])[CRASH]
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            f(xs, ys)
        elapsed = time.monotonic() - start
        record_property("detect_s", round(elapsed, 3))
        assert elapsed < RAISE_S
        assert info.value.rank == CRASH
        assert "MemoryError" in info.value.exc_type
        np.testing.assert_allclose(f(xs, ys, num_slices=8), want, rtol=1e-12)
        run_on_ranks(_restore_memory, soft, ranks=[CRASH])
        np.testing.assert_allclose(f(xs, ys), want, rtol=1e-12)
    finally:
        _close_clean(pids)


# ---------------------------------------------------------------- gathering, the real path


def test_data_unlinked_under_the_workers_is_a_worker_error(record_property):
    """Another program removed a Data's segment before the workers mapped it."""
    pids = _fork("raise")
    try:
        f = _function()
        synk.distribute()
        xd = synk.data(X)
        segment = xd.ref().segment
        os.unlink(f"/dev/shm/{segment}")
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
        np.testing.assert_array_equal(f(synk.data(X), batch=IDX)[0], X[IDX])
        _assert_correct_call(f)
    finally:
        _close_clean(pids)


def test_data_truncated_under_a_worker_kills_it_with_sigbus(record_property):
    """Rows a worker gathers lie past the end of a segment shrunk under it: SIGBUS.

    One row is one page; the master's rows stay inside the shrunk segment (it must
    not touch the rest either: it would get SIGBUS itself).
    """
    _fired.clear()
    synk.fork(2)
    pids = run_on_ranks(os.getpid)
    try:
        f = _function()
        synk.distribute()
        page = os.sysconf("SC_PAGE_SIZE")
        rows = np.arange(4 * page // 8, dtype=np.float64).reshape(4, page // 8)
        xd = synk.data(rows)
        batch = [1, 0, 3, 2]  # the master gathers rows 1 and 0, the worker 3 and 2
        np.testing.assert_array_equal(f(xd, batch=batch)[0], rows[batch])  # worker maps it
        os.truncate(f"/dev/shm/{xd.ref().segment}", 2 * page)
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
        _close_clean(pids)


# ---------------------------------------------------------------- distribution that never works


@pytest.mark.parametrize("where", ["pickling_in_the_master", "unpickling_in_the_workers"])
def test_a_function_that_never_distributes_does_not_block_later_functions(where):
    """A function that cannot be pickled (master) or unpickled (workers) is reported.

    The session must stay usable: functions built afterwards must still distribute
    and run (SPEC 6: "all processes stay in step and the next call works").
    """
    _fired.clear()
    synk.fork(2)
    pids = run_on_ranks(os.getpid)
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
        assert run_on_ranks(os.getpid) == pids
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
            raise InjectedFault(f"never pickles in rank {this_rank()}")
        return (_never_unpickles, ())


def _never_unpickles() -> Never:
    if this_rank() != 0:  # a worker (the master is rank 0 here)
        raise InjectedFault(f"never unpickles in rank {this_rank()}")
    return Never("unpickling_in_the_workers")
