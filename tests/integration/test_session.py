"""Integration tests of the process runtime: fork, commands, errors, misuse, close.

Each test forks a real session (``n_parallel`` in 1, 2, 3) and runs commands through
the public helpers of ``synkhronos.testing`` (``run_on_ranks``, ``ping``); the autouse
``no_leaks`` fixture checks that no child process and no ``/dev/shm`` entry remain once
the session is closed.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import time

import numpy as np
import pytensor.tensor as pt
import pytest
from threadpoolctl import threadpool_info

import synkhronos as synk
from synkhronos.errors import WorkerError
from synkhronos.testing import (
    barrier,
    ping,
    program_prefix,
    run_on_ranks,
    session_open,
    session_state,
    this_rank,
)

from ..conftest import child_pids, segments_of
from ..processes import leader_alive

pytestmark = pytest.mark.timeout(60)

# Larger than any slot of the control block (its mailbox holds 1 MiB, a reply slot
# 64 KiB): such a message or reply travels in a one-off segment of its own.
BIG_MESSAGE = 4 << 20
BIG_REPLY = 256 << 10


# ---------------------------------------------------------------- remote functions


def _rank_and(value):
    return (this_rank(), value)


def _boom(message: str):
    raise ValueError(message)


def _boom_with(message: str, ballast: bytes):
    raise ValueError(message)


class OddError(Exception):
    """An exception whose class cannot be rebuilt by unpickling (two required args)."""

    def __init__(self, a, b):
        super().__init__(f"odd {a} {b}")


def _raise_odd():
    raise OddError(1, 2)


def _return_unpicklable():
    return lambda: None


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info()]


def _numba_threads() -> int:
    """The threads Numba's parallel kernels would use here (launches its pool: workers only)."""
    import numba

    return numba.get_num_threads()


def _numba_pool_size() -> int:
    """The size of the pool Numba will launch, or the threads in use if it has launched."""
    import numba
    from numba.np.ufunc import parallel

    return numba.get_num_threads() if parallel._is_initialized else parallel.NUM_THREADS


def _faulthandler_enabled() -> bool:
    return faulthandler.is_enabled()


def _sigint_ignored() -> bool:
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _length(data) -> int:
    return len(data)


def _bytes_of(size: int) -> bytes:
    return bytes([this_rank()]) * size


def _barriers(count: int) -> int:
    for _ in range(count):
        barrier()
    return this_rank()


def _raise_before_barrier(bad_rank: int):
    if this_rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} failed before the barrier")
    barrier()
    return this_rank()


def _fork_inside():
    return synk.fork(2)


def _worker_ranks() -> list[int]:
    master = synk.master_rank()
    return [r for r in range(synk.n_parallel()) if r != master]


def _pids() -> list[int]:
    """Every process's pid, by rank."""
    return run_on_ranks(os.getpid)


def _sig_ignored_in_proc(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError("no SigIgn line")


def one_off_segments() -> list[str]:
    """This program's entries other than its lifetime lock (held while it runs)."""
    return [e for e in segments_of() if not e.endswith("_lock")]


# ---------------------------------------------------------------- lifecycle


def test_fork_returns_n_and_introspection(forked):
    n = forked
    assert synk.n_parallel() == n
    assert synk.device() == "cpu"
    assert synk.master_rank() == 0
    assert session_open() and session_state() == "ready"
    assert run_on_ranks(this_rank) == list(range(n))
    pids = _pids()
    assert pids[0] == os.getpid()
    assert sorted(child_pids()) == sorted(pids[1:])
    assert program_prefix().startswith(f"synk_{os.getpid()}_")


@pytest.mark.parametrize("name", ["n_parallel", "device", "master_rank"])
def test_introspection_before_fork_raises(name):
    with pytest.raises(RuntimeError, match=rf"synk\.fork\(\) must be called before synk\.{name}"):
        getattr(synk, name)()


def test_session_helpers_without_a_session():
    assert not session_open()
    assert session_state() is None
    with pytest.raises(RuntimeError, match=r"synk\.fork\(\) must be called before"):
        ping()
    with pytest.raises(RuntimeError, match=r"synk\.fork\(\) must be called before"):
        run_on_ranks(os.getpid)


@pytest.mark.parametrize("setting", [None, "", "  "], ids=["unset", "empty", "blank"])
def test_fork_default_n_is_usable_cores(monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv("SYNK_N_PARALLEL", raising=False)
    else:
        monkeypatch.setenv("SYNK_N_PARALLEL", setting)
    n = synk.fork()
    try:
        assert n == len(os.sched_getaffinity(0)) == synk.n_parallel()
        ping()
    finally:
        synk.close()


def _affinity() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_pin_puts_each_process_on_its_core_and_close_unpins_the_master():
    usable = _affinity()
    if len(usable) < 2:
        pytest.skip("pinning two processes to two cores needs 2 usable cores; "
                    f"this process may use {usable}")
    synk.fork(2, pin=True)
    try:
        cores = run_on_ranks(_affinity)
        assert cores == [[usable[0]], [usable[1]]]
    finally:
        synk.close()
    assert _affinity() == usable  # the master may use every core again
    synk.fork(2)  # so a later session's workers are not all on the master's old core
    try:
        assert run_on_ranks(_affinity) == [usable, usable]
    finally:
        synk.close()


def test_fork_reads_synk_n_parallel(monkeypatch):
    monkeypatch.setenv("SYNK_N_PARALLEL", " 3 ")
    n = synk.fork()
    try:
        assert n == 3 == synk.n_parallel() == len(run_on_ranks(os.getpid))
    finally:
        synk.close()


def test_n_parallel_given_wins_over_synk_n_parallel(monkeypatch):
    monkeypatch.setenv("SYNK_N_PARALLEL", "3")
    assert synk.fork(1) == 1
    try:
        assert synk.n_parallel() == 1 and child_pids() == []
    finally:
        synk.close()


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "2x"])
def test_bad_synk_n_parallel_is_refused_before_forking(monkeypatch, value):
    monkeypatch.setenv("SYNK_N_PARALLEL", value)
    with pytest.raises(ValueError, match=rf"SYNK_N_PARALLEL must be an integer >= 1.*"
                                         rf"got '{value}'"):
        synk.fork()
    assert not session_open() and child_pids() == [] and segments_of() == []


def test_ping(forked):
    for _ in range(3):
        ping()


def test_callable_returns_each_ranks_pid(forked):
    n = forked
    pids = _pids()
    assert len(pids) == n
    assert len(set(pids)) == n
    assert pids[0] == os.getpid()
    assert sorted(pids[1:]) == sorted(child_pids())


def test_callable_on_selected_ranks(forked):
    n = forked
    last = n - 1
    assert run_on_ranks(this_rank, ranks=[last]) == [None] * last + [last]
    assert run_on_ranks(this_rank, ranks=[]) == [None] * n
    assert run_on_ranks(this_rank) == list(range(n))


@pytest.mark.parametrize("n, master_rank", [(2, 1), (3, 1), (3, 2)])
def test_master_rank(n, master_rank):
    synk.fork(n, master_rank=master_rank)
    try:
        assert synk.master_rank() == master_rank
        assert run_on_ranks(this_rank) == list(range(n))
        pids = _pids()
        assert pids[master_rank] == os.getpid()
        assert len(set(pids)) == n
        workers = [pids[r] for r in range(n) if r != master_rank]
        assert sorted(workers) == sorted(child_pids())
        ping()
    finally:
        synk.close()


def test_close_twice_and_without_session(forked):
    x = pt.dvector("x")
    f = synk.function([x], (x.sum(), "sum"), mode="FAST_COMPILE")
    assert f(np.ones(4)) == 4.0
    synk.close()
    assert not session_open()
    synk.close()
    assert child_pids() == []
    assert segments_of() == []
    # a function of the closed session says so
    with pytest.raises(RuntimeError, match="session is closed"):
        f(np.ones(4))
    with pytest.raises(RuntimeError, match=r"synk\.fork\(\) must be called before"):
        ping()


def test_close_without_fork_is_harmless():
    synk.close()
    synk.close()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fork_again_after_close(n):
    for _ in range(3):
        assert synk.fork(n) == n
        try:
            assert len(set(_pids())) == n
        finally:
            synk.close()
        assert child_pids() == []
        assert segments_of() == []


def test_fork_close_cycles_release_fds_and_threads():
    """Churn: fork/close cycles leave file descriptors and BLAS limits as they were."""
    synk.fork(2)  # first fork pays the one-off imports
    synk.close()
    gc.collect()  # what earlier tests dropped: its descriptors close now, not in the loop
    fds = len(os.listdir("/proc/self/fd"))
    blas = _blas_threads()
    numba_pool = _numba_pool_size()
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    for _ in range(10):
        synk.fork(3)
        ping()
        synk.close()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert _blas_threads() == blas
    assert _numba_pool_size() == numba_pool
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers


# ---------------------------------------------------------------- errors in handlers


def test_exception_in_last_rank_is_worker_error(forked):
    n = forked
    bad = n - 1
    with pytest.raises(WorkerError, match=rf"^ValueError in rank {bad}: boom at {bad}$") as info:
        run_on_ranks(_boom, f"boom at {bad}", ranks=[bad])
    error = info.value
    assert isinstance(error, RuntimeError)
    assert error.rank == bad
    assert error.exc_type == "ValueError"
    assert error.message == f"boom at {bad}"
    assert "Traceback (most recent call last)" in error.remote_traceback
    assert "_boom" in error.remote_traceback
    assert f"ValueError: boom at {bad}" in error.remote_traceback
    # the session is still in step
    ping()
    assert run_on_ranks(this_rank) == list(range(n))


@pytest.mark.parametrize("n", [2, 3])
def test_exception_in_master_is_worker_error(n):
    synk.fork(n)
    try:
        with pytest.raises(WorkerError, match=r"ValueError in rank 0: in the master") as info:
            run_on_ranks(_boom, "in the master", ranks=[0])
        assert isinstance(info.value.__cause__, ValueError)
        assert "_boom" in info.value.remote_traceback
        ping()
    finally:
        synk.close()


def test_exception_in_every_rank_reports_one(forked):
    with pytest.raises(WorkerError, match=r"ValueError in rank \d: everywhere") as info:
        run_on_ranks(_boom, "everywhere")
    assert 0 <= info.value.rank < forked
    ping()


def test_exception_that_cannot_be_unpickled(forked):
    bad = forked - 1
    with pytest.raises(WorkerError, match=rf"OddError in rank {bad}: odd 1 2") as info:
        run_on_ranks(_raise_odd, ranks=[bad])
    assert "_raise_odd" in info.value.remote_traceback
    ping()


@pytest.mark.parametrize("n", [2, 3])
def test_unpicklable_reply_is_worker_error(n):
    synk.fork(n)
    try:
        with pytest.raises(WorkerError, match=rf"in rank {n - 1}:") as info:
            run_on_ranks(_return_unpicklable, ranks=[n - 1])
        assert "pickle" in info.value.remote_traceback.lower()
        ping()
    finally:
        synk.close()


def test_sys_exit_in_a_command_is_a_worker_error_on_every_rank(forked):
    """``sys.exit()`` in user code is a failure like any exception, on every rank, the
    master's own share included: WorkerError, and the session goes on."""
    n = forked
    pids = _pids()
    for rank in range(n):
        with pytest.raises(WorkerError, match=rf"^SystemExit in rank {rank}: 7$") as info:
            run_on_ranks(sys.exit, 7, ranks=[rank])
        assert info.value.rank == rank
        assert info.value.exc_type == "SystemExit"
        assert isinstance(info.value.__cause__, SystemExit)
        assert session_state() == "ready"
        assert _pids() == pids  # nobody died or was replaced
    ping()


def test_many_back_to_back_commands(forked):
    n = forked
    for i in range(2000):
        ping()
        if i % 10 == 0:
            assert run_on_ranks(_rank_and, i) == [(r, i) for r in range(n)]


def test_oversized_payload_and_replies(forked):
    n = forked
    big = os.urandom(BIG_MESSAGE)
    assert run_on_ranks(_length, big) == [len(big)] * n
    replies = run_on_ranks(_bytes_of, BIG_REPLY)
    assert replies == [bytes([r]) * BIG_REPLY for r in range(n)]
    # every one-off segment is gone once the command returned
    assert one_off_segments() == []
    ping()


def test_oversized_payload_released_when_a_worker_raises(forked):
    big = b"z" * BIG_MESSAGE
    bad = forked - 1
    with pytest.raises(WorkerError, match=rf"ValueError in rank {bad}"):
        run_on_ranks(_boom_with, "with ballast", big, ranks=[bad])
    assert one_off_segments() == []
    ping()


def test_barriers_inside_a_command(forked):
    assert run_on_ranks(_barriers, 50) == list(range(forked))
    ping()


@pytest.mark.parametrize("n", [2, 3])
def test_worker_raising_before_a_barrier(n):
    """The failing worker is the root cause; its peers in the barrier are released."""
    synk.fork(n)
    try:
        bad = n - 1
        with pytest.raises(WorkerError, match=rf"ValueError in rank {bad}: rank {bad} failed"):
            run_on_ranks(_raise_before_barrier, bad)
        ping()
        assert run_on_ranks(_barriers, 3) == list(range(n))
    finally:
        synk.close()


@pytest.mark.parametrize("n", [2, 3])
def test_master_raising_before_a_barrier(n):
    """Same as above with the master failing: the workers in the barrier must be released.

    Without that the workers wait in the barrier for the master, and the master waits
    for the workers to finish: a deadlock. ``timeout=3`` turns it into a failure.
    """
    synk.fork(n, timeout=3)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"ValueError in rank 0: rank 0 failed"):
            run_on_ranks(_raise_before_barrier, 0)
        assert time.monotonic() - start < 2.0
        ping()
    finally:
        synk.close()


# ---------------------------------------------------------------- misuse


def test_fork_twice_raises(forked):
    with pytest.raises(RuntimeError, match=r"synk\.fork\(\) was already called; call synk\.close"):
        synk.fork(2)
    assert synk.n_parallel() == forked
    ping()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_fork_bad_n_parallel(bad):
    with pytest.raises(ValueError, match=r"n_parallel must be an integer >= 1"):
        synk.fork(bad)
    assert not session_open()


@pytest.mark.parametrize("n, bad", [(2, 2), (2, -1), (1, 1), (3, 5), (2, 0.0)])
def test_fork_bad_master_rank(n, bad):
    with pytest.raises(ValueError, match=rf"master_rank must be an integer in \[0, {n}\)"):
        synk.fork(n, master_rank=bad)
    assert not session_open()


@pytest.mark.parametrize("bad", [0, -1.0])
def test_fork_bad_timeout(bad):
    with pytest.raises(ValueError, match=r"timeout must be > 0 seconds"):
        synk.fork(2, timeout=bad)
    assert not session_open()


def test_fork_bad_device():
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'gpu'"):
        synk.fork(2, device="tpu")
    assert not session_open()


def test_fork_gpu_names_what_is_missing():
    # this machine has no usable GPU stack: the message names the missing piece
    with pytest.raises(RuntimeError, match=r"device='gpu' (needs \w+|found no visible NVIDIA GPU)"):
        synk.fork(2, device="gpu")
    assert not session_open()


def test_run_from_another_thread(forked):
    """Any thread of the master may issue commands (SPEC section 2)."""
    n = forked
    caught: list[BaseException] = []
    replies: list = []

    def other():
        try:
            ping()
            replies.append(run_on_ranks(this_rank))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            caught.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert caught == []
    assert replies == [list(range(n))]
    ping()


@pytest.mark.parametrize("n", [2, 3])
def test_run_from_inside_a_worker(n):
    synk.fork(n)
    try:
        with pytest.raises(
            WorkerError, match=r"in rank 1: .*only be called in the master process"
        ) as info:
            run_on_ranks(ping, ranks=[1])
        assert info.value.rank == 1
        assert info.value.exc_type == "RuntimeError"
        ping()
    finally:
        synk.close()


@pytest.mark.parametrize("n", [2, 3])
def test_fork_from_inside_a_worker(n):
    synk.fork(n)
    try:
        workers = sorted(child_pids())
        with pytest.raises(WorkerError, match=rf"in rank {n - 1}: synk\.fork\(\) cannot be "
                           "called inside a worker"):
            run_on_ranks(_fork_inside, ranks=[n - 1])
        assert sorted(child_pids()) == workers
        ping()
    finally:
        synk.close()


def test_nested_run_in_the_master(forked):
    with pytest.raises(WorkerError, match=r"in rank 0: .*cannot be nested"):
        run_on_ranks(ping, ranks=[0])
    ping()


# ---------------------------------------------------------------- worker set-up


def test_every_process_limits_blas_to_one_thread(forked):
    per_rank = run_on_ranks(_blas_threads)
    assert len(per_rank) == forked
    for rank, counts in enumerate(per_rank):
        assert counts, f"rank {rank} sees no BLAS pool"
        assert all(c == 1 for c in counts), (rank, counts)


def test_every_process_limits_numba_to_one_thread(forked):
    assert _numba_pool_size() == 1  # the master's, without launching a pool here
    workers = _worker_ranks()
    per_rank = run_on_ranks(_numba_threads, ranks=workers)
    assert all(per_rank[r] == 1 for r in workers), per_rank


def test_workers_enable_faulthandler(forked):
    workers = _worker_ranks()
    enabled = run_on_ranks(_faulthandler_enabled, ranks=workers)
    assert all(enabled[r] for r in workers)


@pytest.mark.parametrize("n", [2, 3])
def test_workers_ignore_sigint(n):
    synk.fork(n)
    try:
        workers = _worker_ranks()
        ignored = run_on_ranks(_sigint_ignored, ranks=workers)
        assert all(ignored[r] for r in workers)
        pids = _pids()
        for r in workers:
            assert _sig_ignored_in_proc(pids[r], signal.SIGINT)
            os.kill(pids[r], signal.SIGINT)
        ping()
        assert _pids() == pids
        assert all(leader_alive(pids[r]) for r in workers)
        assert session_state() == "ready"
    finally:
        synk.close()


def test_master_signal_handlers_installed_and_restored():
    """While forked the master handles SIGTERM (and Ctrl-C) itself; close() puts back the old."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.fail("precondition: the test process must have the default SIGTERM handler")
    sigint = signal.getsignal(signal.SIGINT)
    synk.fork(2)
    try:
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        if sigint is signal.default_int_handler:  # not when started with SIGINT ignored
            assert signal.getsignal(signal.SIGINT) is not sigint
        else:
            assert signal.getsignal(signal.SIGINT) is sigint
    finally:
        synk.close()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is sigint


def test_master_keeps_a_users_own_sigterm_handler():
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        synk.fork(2)
        try:
            assert signal.getsignal(signal.SIGTERM) is mine
        finally:
            synk.close()
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)
