"""Integration tests of the process runtime: fork, commands, errors, misuse, close.

Each test forks a real session (``n_parallel`` in 1, 2, 3) and runs commands through
``Session.run``; the autouse ``no_leaks`` fixture checks that no child process and no
``/dev/shm`` entry remain once the session is closed.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time

import pytest
from threadpoolctl import threadpool_info

import synkhronos as synk
from synkhronos import session as S
from synkhronos._runtime import control, shmem
from synkhronos.errors import WorkerError

from ..conftest import child_pids, segments_of

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- remote functions


def _rank() -> int:
    return S.current().rank


def _rank_and(value):
    return (S.current().rank, value)


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


def _nested_run():
    return S.current().run(S.Opcode.PING)


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
    return bytes([S.current().rank]) * size


def _barriers(count: int) -> int:
    session = S.current()
    for _ in range(count):
        session.barrier()
    return session.rank


def _raise_before_barrier(bad_rank: int):
    session = S.current()
    if session.rank == bad_rank:
        raise ValueError(f"rank {bad_rank} failed before the barrier")
    session.barrier()
    return session.rank


def _session() -> S.Session:
    session = S.current()
    assert session is not None
    return session


def _ping(session: S.Session) -> None:
    assert session.run(S.Opcode.PING) == [None] * session.n


def _sig_ignored_in_proc(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError("no SigIgn line")


# ---------------------------------------------------------------- lifecycle


def test_fork_returns_n_and_introspection(forked):
    n = forked
    session = _session()
    assert synk.n_parallel() == n
    assert synk.device() == "cpu"
    assert synk.master_rank() == 0
    assert (session.n, session.rank, session.master_rank) == (n, 0, 0)
    assert session.is_master
    assert [w.rank for w in session.workers] == list(range(1, n))
    assert sorted(child_pids()) == sorted(w.pid for w in session.workers)
    assert session.prefix.startswith(f"{shmem.PREFIX}{os.getpid()}_")


@pytest.mark.parametrize("name", ["n_parallel", "device", "master_rank"])
def test_introspection_before_fork_raises(name):
    with pytest.raises(RuntimeError, match=rf"synk\.fork\(\) must be called before synk\.{name}"):
        getattr(synk, name)()


def test_fork_default_n_is_usable_cores():
    n = synk.fork()
    try:
        assert n == len(os.sched_getaffinity(0)) == synk.n_parallel()
        _ping(_session())
    finally:
        synk.close()


def test_ping(forked):
    session = _session()
    for _ in range(3):
        _ping(session)


def test_callable_returns_each_ranks_pid(forked):
    n = forked
    session = _session()
    pids = session.run(S.Opcode.CALLABLE, (os.getpid, (), None))
    assert len(pids) == n
    assert len(set(pids)) == n
    assert pids[0] == os.getpid()
    for worker in session.workers:
        assert pids[worker.rank] == worker.pid


def test_callable_on_selected_ranks(forked):
    n = forked
    session = _session()
    last = n - 1
    replies = session.run(S.Opcode.CALLABLE, (_rank, (), [last]))
    assert replies == [None] * last + [last]
    assert session.run(S.Opcode.CALLABLE, (_rank, (), [])) == [None] * n
    assert session.run(S.Opcode.CALLABLE, (_rank, (), None)) == list(range(n))


@pytest.mark.parametrize("n, master_rank", [(2, 1), (3, 1), (3, 2)])
def test_master_rank(n, master_rank):
    synk.fork(n, master_rank=master_rank)
    try:
        session = _session()
        assert synk.master_rank() == master_rank == session.rank
        assert [w.rank for w in session.workers] == [r for r in range(n) if r != master_rank]
        assert session.run(S.Opcode.CALLABLE, (_rank, (), None)) == list(range(n))
        pids = session.run(S.Opcode.CALLABLE, (os.getpid, (), None))
        assert pids[master_rank] == os.getpid()
        assert len(set(pids)) == n
        _ping(session)
    finally:
        synk.close()


def test_close_twice_and_without_session(forked):
    session = _session()
    synk.close()
    assert S.current() is None
    synk.close()
    session.close()
    assert child_pids() == []
    assert segments_of() == []
    with pytest.raises(RuntimeError, match="session is closed"):
        session.run(S.Opcode.PING)


def test_close_without_fork_is_harmless():
    synk.close()
    synk.close()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fork_again_after_close(n):
    for _ in range(3):
        assert synk.fork(n) == n
        try:
            session = _session()
            assert len(set(session.run(S.Opcode.CALLABLE, (os.getpid, (), None)))) == n
        finally:
            synk.close()
        assert child_pids() == []
        assert segments_of() == []


def test_fork_close_cycles_release_fds_and_threads():
    """Churn: fork/close cycles leave file descriptors and BLAS limits as they were."""
    synk.fork(2)  # first fork pays the one-off imports
    synk.close()
    fds = len(os.listdir("/proc/self/fd"))
    blas = _blas_threads()
    numba_pool = _numba_pool_size()
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    for _ in range(10):
        synk.fork(3)
        _ping(_session())
        synk.close()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert _blas_threads() == blas
    assert _numba_pool_size() == numba_pool
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers


# ---------------------------------------------------------------- errors in handlers


def test_exception_in_last_rank_is_worker_error(forked):
    n = forked
    session = _session()
    bad = n - 1
    with pytest.raises(WorkerError, match=rf"^ValueError in rank {bad}: boom at {bad}$") as info:
        session.run(S.Opcode.CALLABLE, (_boom, (f"boom at {bad}",), [bad]))
    error = info.value
    assert isinstance(error, RuntimeError)
    assert error.rank == bad
    assert error.exc_type == "ValueError"
    assert error.message == f"boom at {bad}"
    assert "Traceback (most recent call last)" in error.remote_traceback
    assert "_boom" in error.remote_traceback
    assert f"ValueError: boom at {bad}" in error.remote_traceback
    # the session is still in step
    _ping(session)
    assert session.run(S.Opcode.CALLABLE, (_rank, (), None)) == list(range(n))


@pytest.mark.parametrize("n", [2, 3])
def test_exception_in_master_is_worker_error(n):
    synk.fork(n)
    try:
        session = _session()
        with pytest.raises(WorkerError, match=r"ValueError in rank 0: in the master") as info:
            session.run(S.Opcode.CALLABLE, (_boom, ("in the master",), [0]))
        assert isinstance(info.value.__cause__, ValueError)
        assert "_boom" in info.value.remote_traceback
        _ping(session)
    finally:
        synk.close()


def test_exception_in_every_rank_reports_one(forked):
    session = _session()
    with pytest.raises(WorkerError, match=r"ValueError in rank \d: everywhere") as info:
        session.run(S.Opcode.CALLABLE, (_boom, ("everywhere",), None))
    assert 0 <= info.value.rank < forked
    _ping(session)


def test_exception_that_cannot_be_unpickled(forked):
    session = _session()
    bad = forked - 1
    with pytest.raises(WorkerError, match=rf"OddError in rank {bad}: odd 1 2") as info:
        session.run(S.Opcode.CALLABLE, (_raise_odd, (), [bad]))
    assert "_raise_odd" in info.value.remote_traceback
    _ping(session)


@pytest.mark.parametrize("n", [2, 3])
def test_unpicklable_reply_is_worker_error(n):
    synk.fork(n)
    try:
        session = _session()
        with pytest.raises(WorkerError, match=rf"in rank {n - 1}:") as info:
            session.run(S.Opcode.CALLABLE, (_return_unpicklable, (), [n - 1]))
        assert "pickle" in info.value.remote_traceback.lower()
        _ping(session)
    finally:
        synk.close()


def test_many_back_to_back_commands(forked):
    n = forked
    session = _session()
    for i in range(2000):
        assert session.run(S.Opcode.PING) == [None] * n
        if i % 10 == 0:
            assert session.run(S.Opcode.CALLABLE, (_rank_and, (i,), None)) == [
                (r, i) for r in range(n)
            ]


def test_oversized_payload_and_replies(forked):
    n = forked
    session = _session()
    big = os.urandom(control.MAILBOX_BYTES + 100)
    assert session.run(S.Opcode.CALLABLE, (_length, (big,), None)) == [len(big)] * n
    size = control.REPLY_BYTES * 3
    replies = session.run(S.Opcode.CALLABLE, (_bytes_of, (size,), None))
    assert replies == [bytes([r]) * size for r in range(n)]
    # every one-off segment is gone once the command returned
    assert one_off_segments() == []
    _ping(session)


def one_off_segments() -> list[str]:
    """This program's entries other than its lifetime lock (held while it runs)."""
    return [e for e in segments_of() if not e.endswith("_" + shmem.LOCK)]


def test_oversized_payload_released_when_a_worker_raises(forked):
    session = _session()
    big = b"z" * (control.MAILBOX_BYTES + 1)
    bad = forked - 1
    with pytest.raises(WorkerError, match=rf"ValueError in rank {bad}"):
        session.run(S.Opcode.CALLABLE, (_boom_with, ("with ballast", big), [bad]))
    assert one_off_segments() == []
    _ping(session)


def test_barriers_inside_a_command(forked):
    session = _session()
    assert session.run(S.Opcode.CALLABLE, (_barriers, (50,), None)) == list(range(forked))
    _ping(session)


@pytest.mark.parametrize("n", [2, 3])
def test_worker_raising_before_a_barrier(n):
    """The failing worker is the root cause; its peers in the barrier are released."""
    synk.fork(n)
    try:
        session = _session()
        bad = n - 1
        with pytest.raises(WorkerError, match=rf"ValueError in rank {bad}: rank {bad} failed"):
            session.run(S.Opcode.CALLABLE, (_raise_before_barrier, (bad,), None))
        _ping(session)
        assert session.run(S.Opcode.CALLABLE, (_barriers, (3,), None)) == list(range(n))
    finally:
        synk.close()


@pytest.mark.parametrize("n", [2, 3])
def test_master_raising_before_a_barrier(n):
    """Same as above with the master failing: the workers in the barrier must be released.

    Without a timeout the workers wait in the barrier for the master, and the master
    waits for the workers to finish: a deadlock. ``timeout=3`` turns it into a failure.
    """
    synk.fork(n, timeout=3)
    try:
        session = _session()
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"ValueError in rank 0: rank 0 failed"):
            session.run(S.Opcode.CALLABLE, (_raise_before_barrier, (0,), None))
        assert time.monotonic() - start < 2.0
        _ping(session)
    finally:
        synk.close()


# ---------------------------------------------------------------- misuse


def test_fork_twice_raises(forked):
    with pytest.raises(RuntimeError, match=r"synk\.fork\(\) was already called; call synk\.close"):
        synk.fork(2)
    assert synk.n_parallel() == forked
    _ping(_session())


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_fork_bad_n_parallel(bad):
    with pytest.raises(ValueError, match=r"n_parallel must be an integer >= 1"):
        synk.fork(bad)
    assert S.current() is None


@pytest.mark.parametrize("n, bad", [(2, 2), (2, -1), (1, 1), (3, 5), (2, 0.0)])
def test_fork_bad_master_rank(n, bad):
    with pytest.raises(ValueError, match=rf"master_rank must be an integer in \[0, {n}\)"):
        synk.fork(n, master_rank=bad)
    assert S.current() is None


@pytest.mark.parametrize("bad", [0, -1.0])
def test_fork_bad_timeout(bad):
    with pytest.raises(ValueError, match=r"timeout must be > 0 seconds"):
        synk.fork(2, timeout=bad)
    assert S.current() is None


def test_fork_bad_device():
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'gpu'"):
        synk.fork(2, device="tpu")
    assert S.current() is None


def test_fork_gpu_names_what_is_missing():
    # this machine has no usable GPU stack: the message names the missing piece
    with pytest.raises(RuntimeError, match=r"device='gpu' (needs \w+|found no visible NVIDIA GPU)"):
        synk.fork(2, device="gpu")
    assert S.current() is None


def test_run_from_another_thread(forked):
    session = _session()
    caught: list[BaseException] = []

    def other():
        try:
            session.run(S.Opcode.PING)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            caught.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert len(caught) == 1
    with pytest.raises(RuntimeError, match=r"must come from the thread that called synk\.fork"):
        raise caught[0]
    _ping(session)


@pytest.mark.parametrize("n", [2, 3])
def test_run_from_inside_a_worker(n):
    synk.fork(n)
    try:
        session = _session()
        with pytest.raises(
            WorkerError, match=r"in rank 1: .*commands can only be issued by the master"
        ) as info:
            session.run(S.Opcode.CALLABLE, (_nested_run, (), [1]))
        assert info.value.rank == 1
        assert info.value.exc_type == "RuntimeError"
        _ping(session)
    finally:
        synk.close()


def _fork_inside():
    return synk.fork(2)


@pytest.mark.parametrize("n", [2, 3])
def test_fork_from_inside_a_worker(n):
    synk.fork(n)
    try:
        session = _session()
        with pytest.raises(WorkerError, match=rf"in rank {n - 1}: .*already called"):
            session.run(S.Opcode.CALLABLE, (_fork_inside, (), [n - 1]))
        assert sorted(child_pids()) == sorted(w.pid for w in session.workers)
        _ping(session)
    finally:
        synk.close()


def test_nested_run_in_the_master(forked):
    session = _session()
    with pytest.raises(WorkerError, match=r"in rank 0: .*cannot be nested"):
        session.run(S.Opcode.CALLABLE, (_nested_run, (), [0]))
    _ping(session)


# ---------------------------------------------------------------- worker set-up


def test_every_process_limits_blas_to_one_thread(forked):
    session = _session()
    per_rank = session.run(S.Opcode.CALLABLE, (_blas_threads, (), None))
    assert len(per_rank) == forked
    for rank, counts in enumerate(per_rank):
        assert counts, f"rank {rank} sees no BLAS pool"
        assert all(c == 1 for c in counts), (rank, counts)


def test_every_process_limits_numba_to_one_thread(forked):
    session = _session()
    assert _numba_pool_size() == 1  # the master's, without launching a pool here
    per_rank = session.run(S.Opcode.CALLABLE, (_numba_threads, (), session.worker_ranks))
    assert all(per_rank[r] == 1 for r in session.worker_ranks), per_rank


def test_workers_enable_faulthandler(forked):
    session = _session()
    enabled = session.run(S.Opcode.CALLABLE, (_faulthandler_enabled, (), session.worker_ranks))
    assert all(enabled[r] for r in session.worker_ranks)


@pytest.mark.parametrize("n", [2, 3])
def test_workers_ignore_sigint(n):
    synk.fork(n)
    try:
        session = _session()
        ranks = session.worker_ranks
        ignored = session.run(S.Opcode.CALLABLE, (_sigint_ignored, (), ranks))
        assert all(ignored[r] for r in ranks)
        for worker in session.workers:
            assert _sig_ignored_in_proc(worker.pid, signal.SIGINT)
            os.kill(worker.pid, signal.SIGINT)
        _ping(session)
        pids = session.run(S.Opcode.CALLABLE, (os.getpid, (), None))
        assert [pids[w.rank] for w in session.workers] == [w.pid for w in session.workers]
        assert all(w.poll() is None for w in session.workers)
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
