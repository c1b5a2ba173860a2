"""Fault injection: workers that raise, exit, get killed, segfault or stop; masters that die.

In-process cases crash one rank of a live session (through
``synkhronos.testing.run_on_ranks`` and ``crash``) and check what the master reports,
how fast, whether the session stays usable or broken, and that ``close()`` leaves no
child process and no ``/dev/shm`` entry. ``sys.exit()`` inside a command is a failure
like any exception, on every rank, the master's own share included. Master-death and
Ctrl-C cases run ``scripts/`` as a subprocess in its own session (process group) and
signal it from here; each script makes Ctrl-C deliverable itself, so the suite passes
when started with SIGINT ignored (``nohup``, ``pytest &``).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import synkhronos as synk
from synkhronos.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from synkhronos.testing import (
    barrier,
    crash,
    ping,
    run_on_ranks,
    session_open,
    session_state,
    this_rank,
)

from ..conftest import child_pids, segments_of
from ..processes import poll, shm_entries, sweep

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).parent / "scripts"
SHM = "/dev/shm"
DETECT_S = 5.0  # a dead worker must be reported within this
GONE_S = 10.0  # workers of a dead master must be gone within this
BALLAST = 2 << 20  # a message larger than the control block's 1 MiB mailbox


# ---------------------------------------------------------------- helpers


def _alive(pid: int) -> bool:
    """True while any thread of ``pid`` exists and is not a zombie.

    A process's leader thread shows ``Z`` as soon as it exits, while its other threads
    may still be running down (and holding the process's files); so look at every task.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if stat[stat.rindex(")") + 2] not in "ZX":
            return True
    return False


def _holders(entry: str) -> list[str]:
    """Processes with an open descriptor on ``/dev/shm/entry``: pid, state and command."""
    target = os.path.join(SHM, entry)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if any(link.startswith(target) for link in links):
            found.append(f"{pid} {stat[stat.rindex(')') + 2]} {stat[: stat.rindex(')') + 1]}")
    return found


def _kill(*pids: int) -> None:
    """SIGKILL whichever of ``pids`` still exist (clean-up after a test, pass or fail)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _one_off(entries: list[str], *keep: str) -> list[str]:
    """``entries`` other than the program's lifetime lock and ``keep``."""
    return [e for e in entries if not e.endswith("_lock") and e not in keep]


def _pids() -> list[int]:
    """Every process's pid, by rank."""
    return run_on_ranks(os.getpid)


def _assert_closed_clean(pids: list[int]) -> None:
    synk.close()
    assert not session_open()
    assert child_pids() == []
    # reaped, not left as zombies
    assert [pid for pid in pids if pid != os.getpid() and _exists(pid)] == []
    assert segments_of() == []


# ---------------------------------------------------------------- remote crash functions


def _raise(message: str):
    raise ValueError(message)


def _kill_self(signum: int):
    os.kill(os.getpid(), signum)
    time.sleep(30)  # SIGSTOP: stays here once continued; never reached otherwise


def _segfault():
    ctypes.string_at(0)


def _crash_then_barrier(crash_rank: int, how: str):
    """Every rank enters a barrier except ``crash_rank``, which dies first."""
    if this_rank() == crash_rank:
        CRASHES[how][0](*CRASHES[how][1])
    barrier()
    return this_rank()


def _threads_of(pid: int) -> list[str]:
    """Each thread of ``pid``: its id, state, kernel wait channel, and the signals it
    blocks and has pending (what tells why a signal did not wake the main thread)."""
    found = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                masks = [line.split()[1] for line in f
                         if line.startswith(("SigBlk", "SigPnd", "ShdPnd"))]
        except OSError:
            continue
        found.append(f"{tid} {stat[stat.rindex(')') + 2]} {wchan} blk/pnd/shd={'/'.join(masks)}")
    return found


def _main_thread_sleeps(pid: int) -> bool:
    """Whether the main thread of ``pid`` is blocked in a sleep's system call (its kernel
    wait channel names it; where the kernel shows no wait channel, its state is S)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
        if wchan in ("", "0"):  # hidden by this kernel: asleep is the best one can see
            return _master_thread_state(pid) == "S"
    except OSError:  # it has ended
        return False
    return "sleep" in wchan


def _master_thread_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2]


def _signal_master_when_blocked(signum: int, seconds: float):
    """In a worker: wait until the master's main thread sleeps (its wait for this
    command: the session runs with ``spin=0``), signal the master, then sleep."""
    master = os.getppid()
    deadline = time.monotonic() + 10
    asleep_since = None
    while True:
        now = time.monotonic()
        if _master_thread_state(master) == "S":
            asleep_since = now if asleep_since is None else asleep_since
            if now - asleep_since > 0.02:
                break
        else:
            asleep_since = None
        if now > deadline:
            raise RuntimeError("the master never blocked")
        time.sleep(0.0005)
    os.kill(master, signum)
    time.sleep(seconds)


# name -> (fn, args, outcome): outcome is ("error", the WorkerError's message) for a
# failure the session survives, else the WorkerDiedError's reason
CRASHES = {
    "raise": (_raise, ("handler failed",), ("error", "ValueError", "handler failed")),
    "sys_exit_3": (sys.exit, (3,), ("error", "SystemExit", "3")),
    "os__exit_3": (os._exit, (3,), "exited with code 3"),
    "sigkill": (_kill_self, (signal.SIGKILL,), "killed by SIGKILL"),
    "sigsegv": (_segfault, (), "killed by SIGSEGV"),
    "sigsegv_kill": (_kill_self, (signal.SIGSEGV,), "killed by SIGSEGV"),
    "sigabrt": (os.abort, (), "killed by SIGABRT"),
}

# (n, master_rank, crashing rank)
LAYOUTS = [(2, 0, 1), (3, 0, 2), (3, 0, 1), (3, 2, 0)]


def _layout_id(layout) -> str:
    n, master, crash_rank = layout
    return f"n{n}-m{master}-crash{crash_rank}"


# ---------------------------------------------------------------- worker crashes


@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
@pytest.mark.parametrize("case", list(CRASHES))
def test_worker_crash(case, layout):
    n, master_rank, bad = layout
    fn, args, outcome = CRASHES[case]
    synk.fork(n, master_rank=master_rank)
    pids = _pids()
    try:
        start = time.monotonic()
        if isinstance(outcome, tuple):
            _, exc_type, message = outcome
            with pytest.raises(WorkerError, match=rf"^{exc_type} in rank {bad}: {message}$"):
                run_on_ranks(fn, *args, ranks=[bad])
            assert time.monotonic() - start < DETECT_S
            assert session_state() == "ready"
            assert _pids() == pids  # the failing process lives on, in step
            ping()
            return
        with pytest.raises(WorkerDiedError) as info:
            run_on_ranks(fn, *args, ranks=[bad])
        elapsed = time.monotonic() - start
        error = info.value
        assert elapsed < DETECT_S, f"{case}: reported after {elapsed:.2f} s"
        assert (error.rank, error.pid, error.reason) == (bad, pids[bad], outcome)
        assert f"rank {bad} (pid {pids[bad]}) died: {outcome}" in str(error)
        assert session_state() == "broken"
        # the session stays broken: every later command raises the same
        for again in (ping, _pids):
            with pytest.raises(WorkerDiedError, match=rf"rank {bad} \(pid {pids[bad]}\)"):
                again()
    finally:
        _assert_closed_clean(pids)


# how -> what the master reports when synkhronos.testing.crash() breaks a worker that way
CRASH_HELPER = {
    "raise": ("error", "RuntimeError", "synkhronos.testing: raised on purpose"),
    "sys_exit": ("error", "SystemExit", "3"),
    "exit": "exited with code 3",
    "kill": "killed by SIGKILL",
    "segv": "killed by SIGSEGV",
    "abort": "killed by SIGABRT",
}


@pytest.mark.parametrize("how", list(CRASH_HELPER))
def test_crash_helper_breaks_a_worker_as_asked(how):
    """``synkhronos.testing.crash`` on a worker (rank 1 of 3, master rank 2)."""
    synk.fork(3, master_rank=2)
    pids = _pids()
    outcome = CRASH_HELPER[how]
    try:
        if isinstance(outcome, tuple):
            _, exc_type, message = outcome
            with pytest.raises(WorkerError, match=rf"^{exc_type} in rank 1: {re.escape(message)}$"):
                crash(1, how)
            assert session_state() == "ready"
            assert _pids() == pids
            return
        with pytest.raises(WorkerDiedError) as info:
            crash(1, how)
        assert (info.value.rank, info.value.pid, info.value.reason) == (1, pids[1], outcome)
        assert session_state() == "broken"
    finally:
        _assert_closed_clean(pids)


@pytest.mark.parametrize("how", ["raise", "sys_exit"])
@pytest.mark.parametrize("n, master_rank", [(1, 0), (2, 0), (3, 1)])
def test_sys_exit_or_raise_in_the_masters_share_keeps_the_session(n, master_rank, how):
    """The master's own share: an exception or ``sys.exit()`` is a WorkerError naming
    the master's rank; the session stays usable and the next command works."""
    synk.fork(n, master_rank=master_rank)
    pids = _pids()
    try:
        exc_type = "RuntimeError" if how == "raise" else "SystemExit"
        with pytest.raises(WorkerError, match=rf"^{exc_type} in rank {master_rank}: ") as info:
            crash(master_rank, how)
        assert info.value.rank == master_rank
        assert isinstance(info.value.__cause__, RuntimeError if how == "raise" else SystemExit)
        with pytest.raises(WorkerError, match=rf"^SystemExit in rank {master_rank}: 9$"):
            run_on_ranks(sys.exit, 9, ranks=[master_rank])
        assert session_state() == "ready"
        assert _pids() == pids
        assert run_on_ranks(this_rank) == list(range(n))
    finally:
        _assert_closed_clean(pids)


def _exit_with_ballast(code: int, ballast: bytes):
    os._exit(code)


@pytest.mark.parametrize("n", [2, 3])
def test_worker_dies_with_an_oversized_payload_in_flight(n):
    """The one-off payload segment of the abandoned command goes with close()."""
    synk.fork(n)
    pids = _pids()
    ballast = b"b" * BALLAST
    try:
        with pytest.raises(WorkerDiedError, match=r"exited with code 4"):
            run_on_ranks(_exit_with_ballast, 4, ballast, ranks=[n - 1])
        assert _one_off(segments_of()), "the payload segment is not there"
    finally:
        _assert_closed_clean(pids)


@pytest.mark.parametrize("n", [2, 3])
def test_worker_killed_while_idle(n):
    synk.fork(n)
    pids = _pids()
    victim = n - 1
    try:
        os.kill(pids[victim], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"killed by SIGKILL") as info:
            ping()
        assert time.monotonic() - start < DETECT_S
        assert (info.value.rank, info.value.pid) == (victim, pids[victim])
    finally:
        _assert_closed_clean(pids)
    # a new session works
    synk.fork(n)
    try:
        assert len(set(_pids())) == n
    finally:
        synk.close()


@pytest.mark.parametrize("how", ["os__exit_3", "sigkill"])
@pytest.mark.parametrize("n", [2, 3])
def test_worker_dies_while_peers_wait_in_a_barrier(n, how):
    """The collective case: the others are blocked in a barrier when one rank dies."""
    synk.fork(n)
    pids = _pids()
    bad = n - 1
    try:
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=rf"rank {bad} .*{CRASHES[how][2]}"):
            run_on_ranks(_crash_then_barrier, bad, how)
        assert time.monotonic() - start < DETECT_S
        with pytest.raises(WorkerDiedError):
            ping()
    finally:
        _assert_closed_clean(pids)


@pytest.mark.parametrize("layout", [(2, 0, 1), (3, 0, 2), (3, 0, 1)], ids=_layout_id)
def test_stopped_worker_times_out(layout):
    n, master_rank, bad = layout
    synk.fork(n, master_rank=master_rank, timeout=1)
    pids = _pids()
    try:
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            crash(bad, "stop")
        elapsed = time.monotonic() - start
        error = info.value
        assert isinstance(error, TimeoutError)
        assert 1.0 <= elapsed < 3.0, f"reported after {elapsed:.2f} s"
        assert (error.rank, error.pid, error.timeout) == (bad, pids[bad], 1)
        assert f"rank {bad} (pid {pids[bad]})" in str(error)
        assert session_state() == "broken"
        with pytest.raises(WorkerTimeoutError, match=rf"rank {bad}"):
            ping()
    finally:
        start = time.monotonic()
        _assert_closed_clean(pids)  # close must kill the stopped worker
        assert time.monotonic() - start < 5.0


def test_sigterm_in_master_during_a_command_exits():
    """SIGTERM reaches the master blocked in a wait: SystemExit, and nothing is left.

    The worker sends it once the master sleeps on its semaphore, then sleeps 5 s: a
    master that lost the signal returns normally after those 5 s instead of raising.
    """
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.fail("precondition: the test process must have the default SIGTERM handler")
    synk.fork(2, spin=0)
    pids = _pids()
    start = time.monotonic()
    try:
        with pytest.raises(SystemExit) as info:
            run_on_ranks(_signal_master_when_blocked, signal.SIGTERM, 5, ranks=[1])
        assert info.value.code == 128 + signal.SIGTERM
        assert time.monotonic() - start < 2.0
        assert not session_open()
    finally:
        _assert_closed_clean(pids)


# ---------------------------------------------------------------- Ctrl-C (subprocess)


def run_ctrl_c_script(mode: str, tmp_path: Path) -> dict:
    """``scripts/ctrl_c_in_command.py MODE``: its two JSON lines, merged; checks that
    nothing of it is left once it has exited."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "ctrl_c_in_command.py"), mode, str(tmp_path / "mark")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    info = None
    try:
        out, err = proc.communicate(timeout=GONE_S * 4)
        lines = out.splitlines()
        assert proc.returncode == 0 and len(lines) == 2, err
        info = json.loads(lines[0])
        result = json.loads(lines[1])
        assert poll(lambda: not any(_alive(pid) for pid in info["workers"]), GONE_S)
        assert shm_entries(info["prefix"]) == []
        return result
    finally:
        _kill(proc.pid)
        proc.communicate()
        if info is not None:
            _kill(*info["workers"])
            sweep(info["prefix"])


def check_interrupted_command(result: dict) -> None:
    """What ``ctrl_c_in_command.py`` saw: Ctrl-C within a second, the session kept, the
    next command waiting for the busy rank and then right on every rank."""
    assert result["raised"] == "KeyboardInterrupt", result
    assert result["after_signal"] < 1.0, result
    assert result["state"] == "ready", result
    assert result["again"] == [0, 1, 2], result
    assert result["waited"] >= 1.9, result  # rank 1 was still busy with the old command
    assert result["children"] == [] and result["left"] == [], result


def test_ctrl_c_in_master_during_a_command_keeps_the_session(tmp_path):
    """SIGINT reaches the master blocked in a wait: KeyboardInterrupt within a second,
    the session usable; the next command first waits for the worker still busy."""
    check_interrupted_command(run_ctrl_c_script("main", tmp_path))


# ---------------------------------------------------------------- master death (subprocess)


class Master:
    """``scripts/master_long_command.py`` running in its own session (process group)."""

    def __init__(self, markers: Path, *extra: str):
        markers.mkdir()
        self.markers = markers
        self.idle = "--idle" in extra
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "master_long_command.py"), str(markers), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.workers: list[int] = []
        self.prefix: str | None = None
        self.data = ""

    def markers_present(self) -> bool:
        """True once the script is idle (``--idle``) or its first worker runs the command."""
        return (self.markers / ("idle" if self.idle else "started-1")).exists()

    def read_info(self) -> None:
        """Read the script's JSON line: its worker pids, segment prefix and Data segment."""
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise AssertionError(f"script failed: {self.proc.stderr.read()}")
        info = json.loads(line)
        assert info["master"] == self.pid
        self.workers = info["workers"]
        self.prefix = info["prefix"]
        self.data = info["data"]

    def wait_started(self) -> None:
        """Read the script's JSON line, then wait until it is in its long command or idle."""
        self.read_info()
        names = ["idle"] if self.idle else [f"started-{r}" for r in range(1, len(self.workers) + 1)]
        assert poll(lambda: all((self.markers / m).exists() for m in names), 20)
        assert all(_alive(pid) for pid in self.workers)
        entries = shm_entries(self.prefix)
        assert self.data in entries
        if not self.idle:  # the oversized payload of the running command
            assert _one_off(entries, self.data), entries

    def cleanup(self) -> None:
        """Whatever the test found: kill what is left and remove the program's segments."""
        _kill(self.pid, *self.workers)
        if self.proc.poll() is None:
            self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
        if self.prefix is not None:
            sweep(self.prefix)


@pytest.fixture
def master(tmp_path):
    """Start masters (each with its own marker folder); kill and sweep them afterwards."""
    started: list[Master] = []

    def start(*extra: str) -> Master:
        m = Master(tmp_path / f"m{len(started)}", *extra)
        started.append(m)
        return m

    yield start
    for m in started:
        m.cleanup()


KILLS = {
    # name -> (signal, to the whole process group?, accepted return codes)
    "sigkill": (signal.SIGKILL, False, {-signal.SIGKILL}),
    "sigterm": (signal.SIGTERM, False, {128 + signal.SIGTERM, -signal.SIGTERM}),
    "sigint_group": (signal.SIGINT, True, {-signal.SIGINT, 128 + signal.SIGINT}),
    "sigint_master": (signal.SIGINT, False, {-signal.SIGINT, 128 + signal.SIGINT}),
}

# (kill, master idle between commands?, helper threads in the master)
#
# No helper threads here: a helper thread can take a process-directed signal in the
# main thread's place and hide how the main thread reacts while it blocks.
MASTER_DEATHS = [
    ("sigkill", False, 0),
    ("sigkill", True, 0),
    ("sigterm", False, 0),
    ("sigterm", True, 0),
    ("sigint_group", False, 0),
    ("sigint_group", True, 0),
    ("sigint_master", False, 0),
]


def _death_id(case) -> str:
    kill, idle, threads = case
    return f"{kill}-{'idle' if idle else 'in_command'}-t{threads}"


@pytest.mark.parametrize("case", MASTER_DEATHS, ids=_death_id)
def test_master_death(master, case):
    """Kill the master; its workers must go and take the program's segments with them."""
    kill, idle, threads = case
    signum, group, codes = KILLS[kill]
    m = master("--threads", str(threads), *(["--idle"] if idle else []))
    m.wait_started()

    start = time.monotonic()
    if group:
        os.killpg(m.pid, signum)
    else:
        os.kill(m.pid, signum)
    try:
        code = m.proc.wait(GONE_S)
    except subprocess.TimeoutExpired:
        code = None
    assert code is not None, f"master still running {GONE_S} s after {kill}"
    assert code != 0
    assert code in codes, m.proc.stderr.read()
    remaining = GONE_S - (time.monotonic() - start)
    assert poll(lambda: not any(_alive(pid) for pid in m.workers), remaining)
    assert poll(lambda: shm_entries(m.prefix) == [], 1.0), f"left behind: {shm_entries(m.prefix)}"


def test_master_sigkilled_workers_sweep_with_threaded_master(master):
    """SIGKILL of a master that runs helper threads: its workers still sweep its segments.

    PR_SET_PDEATHSIG fires when the forking *thread* exits. With other threads in the
    master, the kernel may first hand the orphans to a sibling thread that has not
    died yet, so a worker's SIGTERM can come while ``getppid()`` still names the master.
    The master here has 16 low-priority (``SCHED_IDLE``) helper threads and its workers
    spin, so the siblings tend to die last; which thread dies first is still up to the
    scheduler, so four such masters are killed and every one of them must be clean.
    """
    extra = ("--threads", "16", "--low-priority-threads", "--busy")
    masters = [master(*extra) for _ in range(4)]
    for m in masters:
        m.wait_started()
    for m in masters:
        os.kill(m.pid, signal.SIGKILL)
    for m in masters:
        assert m.proc.wait(GONE_S) == -signal.SIGKILL
    workers = [pid for m in masters for pid in m.workers]
    assert poll(lambda: not any(_alive(pid) for pid in workers), GONE_S)
    poll(lambda: all(shm_entries(m.prefix) == [] for m in masters), 1.0)
    left = [shm_entries(m.prefix) for m in masters]
    assert left == [[]] * len(masters), f"left behind: {left}"


def test_next_fork_sweeps_what_a_dead_program_left(master):
    """Nobody got to clean up (all SIGKILLed, workers stopped first, and no watcher, as
    in versions before it or if it is killed too): the next fork() sweeps it."""
    m = master("--no-watcher")
    m.wait_started()
    for pid in m.workers:
        os.kill(pid, signal.SIGSTOP)
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(GONE_S)
    for pid in m.workers:
        os.kill(pid, signal.SIGKILL)
    assert poll(lambda: not any(_alive(pid) for pid in m.workers), GONE_S)
    left = shm_entries(m.prefix)
    assert m.data in left and _one_off(left, m.data), left
    # The program is gone once no process holds its lock entry open; say who does if
    # that never happens.
    lock = m.prefix + "lock"
    assert lock in left
    assert poll(lambda: _holders(lock) == [], GONE_S, step=0.05), _holders(lock)

    synk.fork(1)
    try:
        assert shm_entries(m.prefix) == []
    finally:
        synk.close()


# ---------------------------------------------------------------- exit without close()


@pytest.mark.parametrize(
    "mode, code, message",
    [
        ("no_close", 0, None),
        (
            "uncaught_died",
            1,
            r"WorkerDiedError: worker rank 2 \(pid \d+\) died: exited with code 3",
        ),
        ("uncaught_error", 1, r"WorkerError: ValueError in rank 1: not caught"),
        ("uncaught_sys_exit", 1, r"WorkerError: SystemExit in rank 1: 5"),
    ],
    ids=["no_close", "uncaught_died", "uncaught_error", "uncaught_sys_exit"],
)
def test_program_ends_without_close(mode, code, message):
    """atexit closes the session; an uncaught failure gives a non-zero exit status."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "lifecycle_exit.py"), mode],
        capture_output=True,
        text=True,
        timeout=GONE_S * 3,
        start_new_session=True,
    )
    info = json.loads(proc.stdout.splitlines()[0])
    try:
        assert proc.returncode == code, proc.stderr
        if message is not None:
            assert re.search(message, proc.stderr), proc.stderr
        assert "leaked" not in proc.stderr
        assert poll(lambda: not any(_alive(pid) for pid in info["workers"]), GONE_S)
        assert shm_entries(info["prefix"]) == []
    finally:
        _kill(*info["workers"])
        sweep(info["prefix"])


def test_signal_reaches_an_idle_master_blocked_in_a_long_call(master):
    """Ctrl-C / SIGTERM to a master blocked in one long call (here ``time.sleep(60)``).

    Python runs signal handlers in the main thread only, and a blocking call of the
    main thread returns early only if the kernel delivered the signal to that thread.
    A process-directed signal goes to any thread that does not block it, so the
    master's other threads (BLAS pools) must block SIGINT and SIGTERM for the main
    thread to be interrupted. Which thread the kernel picks varies, so six masters
    are tried: three get Ctrl-C (to the process group), three SIGTERM, each as soon
    as it is idle after fork. They keep fork()'s pre-import of the Numba backend, as
    a real program does. A master that got the signal exits in well under a second.
    """
    kills = ["sigint_group", "sigterm"] * 3
    masters = [master("--idle", "--long-sleep", "--preimport") for _ in kills]
    # signal each master as soon as it is idle (the first moments after fork count),
    # and inside its sleep: a signal that lands between the script's marker and the
    # sleep's system call is one CPython itself leaves until the sleep ends (the C
    # handler has run, the main thread is not interrupted, time.sleep looks at signals
    # only after an EINTR), so it would hang whichever thread the kernel chose
    pending = dict(zip(masters, kills, strict=True))
    give_up = time.monotonic() + 30
    while pending and time.monotonic() < give_up:
        for m, kill in list(pending.items()):
            if (m.markers_present() and _main_thread_sleeps(m.pid)) or m.proc.poll() is not None:
                signum, group, _ = KILLS[kill]
                (os.killpg if group else os.kill)(m.pid, signum)
                del pending[m]
        time.sleep(0.001)
    assert not pending, "some masters never became idle"
    for m in masters:
        m.read_info()
    deadline = time.monotonic() + 5.0
    hung = []
    for m, kill in zip(masters, kills, strict=True):
        try:
            code = m.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append((kill, _threads_of(m.pid)))
            continue
        assert code in KILLS[kill][2], m.proc.stderr.read()
    assert hung == [], f"{len(hung)}/{len(masters)} masters still asleep 5 s after it: {hung}"
    workers = [pid for m in masters for pid in m.workers]
    assert poll(lambda: not any(_alive(pid) for pid in workers), GONE_S)
    assert all(shm_entries(m.prefix) == [] for m in masters)
