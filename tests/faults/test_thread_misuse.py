"""Threads and processes of the master (SPEC section 2).

- Any thread of the master may call a function or a collective: calls are serialized
  by a lock, each gets its own right result, and none deadlocks. Ctrl-C while a thread
  other than the main one waits inside a command ends that call within a second and
  closes the session (``scripts/ctrl_c_in_command.py thread``).
- A process forked from the master afterwards (``multiprocessing`` with the fork start
  method, a ``Pool``, a bare ``os.fork`` as PyMC's chain processes are) that calls a
  function, a collective or any command gets a ``RuntimeError`` naming the rule, and
  the master's session is unharmed, also once that process has exited through the
  interpreter's normal exit (its ``atexit`` hooks run: ``scripts/forked_child.py``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import (
    leftover_segments,
    ping,
    rank_values,
    run_on_ranks,
    session_state,
)

from .test_crash_table import check_interrupted_command, run_ctrl_c_script

pytestmark = pytest.mark.timeout(120)

SCRIPTS = Path(__file__).parent / "scripts"
RULE = r"commands can only be issued by the master process"


# ---------------------------------------------------------------- threads of the master


@pytest.mark.parametrize("n", [2, 3])
def test_a_second_thread_calls_while_the_first_keeps_working(n):
    synk.fork(n)
    try:
        x = pt.dvector("x")
        f = synk.function([x], (x.sum(), "sum"))
        synk.distribute()
        errors: list[BaseException] = []
        results: list[float] = []
        started = threading.Event()

        def other_thread():
            started.set()
            for _ in range(200):
                try:
                    results.append(f(np.ones(4)))
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        started.wait()
        for _ in range(200):
            assert f(np.ones(6)) == 6.0
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert errors == []
        assert results == [4.0] * 200
        assert f(np.ones(3)) == 3.0
    finally:
        synk.close()


@pytest.mark.parametrize("n", [2, 3])
def test_concurrent_calls_and_collectives_get_their_own_results(n):
    """Three threads at once: two call one function with arrays of the same dtype and
    shape (the repeated-call shortcut stages them in place: one thread's values must
    never reach the other's call), one runs collectives on its own variable."""
    synk.fork(n)
    try:
        x = pt.dvector("x")
        w = pytensor.shared(np.zeros(5), name="w")
        f = synk.function([x], [(x, "gather"), (x.sum(), "sum")], mode="FAST_COMPILE")
        g = synk.function([], (w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        errors: list[str] = []
        go = threading.Event()

        def caller(k: int):
            go.wait()
            for i in range(150):
                values = np.arange(7.0) * (k + 1) + i
                rows, total = f(values)
                if not (np.array_equal(rows, values) and total == values.sum()):
                    errors.append(f"thread {k} call {i}: got {rows}, {total}")

        def collectives():
            go.wait()
            for i in range(60):
                values = np.arange(5.0) + i
                synk.broadcast(w, values)
                synk.all_reduce(w, op="max")
                if not np.array_equal(synk.get_value(n - 1, w), values):
                    errors.append(f"collectives {i}: rank {n - 1} has another value")
                if g() != n * values.sum():
                    errors.append(f"collectives {i}: g() is wrong")

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
        threads.append(threading.Thread(target=collectives))
        for thread in threads:
            thread.start()
        go.set()
        for thread in threads:
            thread.join(timeout=100)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert session_state() == "ready"
        ping()
    finally:
        synk.close()


def test_ctrl_c_while_another_thread_waits_inside_a_command(tmp_path):
    """Ctrl-C to the master while a thread other than the main one waits in a command:
    that call ends within a second (KeyboardInterrupt there too), the main thread gets
    it as well, and the session stays usable."""
    result = run_ctrl_c_script("thread", tmp_path)
    assert result["main"] == "KeyboardInterrupt", result
    check_interrupted_command(result)


# ---------------------------------------------------------------- processes forked from it


def _attempts(f, w) -> dict:
    return {
        "call": lambda: f(np.ones(4)),
        "all_reduce": lambda: synk.all_reduce(w),
        "get_value": lambda: synk.get_value(0, w),
        "data": lambda: synk.data(np.ones(3)),
        "distribute": synk.distribute,
        "steps": lambda: synk.steps.run([synk.steps.call(f, np.ones(4))]),
        "ping": ping,
    }


def _child(f, w, conn) -> None:
    """In a multiprocessing child: try everything, report each outcome."""
    seen = []
    for what, attempt in _attempts(f, w).items():
        try:
            attempt()
            seen.append((what, None, ""))
        except Exception as exc:  # noqa: BLE001 - reported to the master
            seen.append((what, type(exc).__name__, str(exc)))
    conn.send((os.getpid(), seen))
    conn.close()


def _model():
    x = pt.dvector("x")
    w = pytensor.shared(np.ones(3), name="w")
    f = synk.function([x], (x.sum() + w.sum(), "sum"), mode="FAST_COMPILE")
    synk.distribute()
    return f, w


def _assert_unharmed(f, w, n: int, pids: list[int], segments: list[str]) -> None:
    assert session_state() == "ready"
    assert run_on_ranks(os.getpid) == pids
    assert sorted(leftover_segments()) == segments
    assert f(np.ones(4)) == 4.0 + n * 3.0
    synk.all_reduce(w, op="sum")
    assert [v.tolist() for v in rank_values(w)] == [[float(n)] * 3] * n


@pytest.mark.parametrize("n", [1, 3])
def test_a_multiprocessing_child_gets_a_clear_error_and_the_session_is_unharmed(n):
    synk.fork(n)
    try:
        f, w = _model()
        assert f(np.ones(4)) == 4.0 + n * 3.0
        pids, segments = run_on_ranks(os.getpid), sorted(leftover_segments())
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_child, args=(f, w, send))
        child.start()
        send.close()
        child_pid, seen = receive.recv()
        child.join(30)
        assert child.exitcode == 0
        assert [what for what, _, _ in seen] == list(_attempts(f, w))
        for what, kind, message in seen:
            assert kind == "RuntimeError", (what, kind, message)
            assert RULE in message and f"(pid {os.getpid()})" in message, message
            assert f"this process (pid {child_pid}) was forked from it" in message, message
        _assert_unharmed(f, w, n, pids, segments)
    finally:
        synk.close()


_POOL_FUNCTION = None  # the function a pool's forked processes call


def _pool_call(value: float) -> float:
    return _POOL_FUNCTION(np.full(4, value))


def test_a_pool_of_forked_processes_gets_a_clear_error_and_the_session_is_unharmed():
    global _POOL_FUNCTION
    synk.fork(2)
    try:
        f, w = _model()
        assert f(np.ones(4)) == 4.0 + 2 * 3.0  # its staging segment made
        pids, segments = run_on_ranks(os.getpid), sorted(leftover_segments())
        _POOL_FUNCTION = f
        with multiprocessing.get_context("fork").Pool(2) as pool:
            with pytest.raises(RuntimeError, match=RULE):
                pool.map(_pool_call, [1.0, 2.0])
            assert f(np.ones(4)) == 4.0 + 2 * 3.0  # between the pool's calls
            with pytest.raises(RuntimeError, match=RULE):
                pool.apply(_pool_call, (3.0,))
            pool.close()
            pool.join()
        _assert_unharmed(f, w, 2, pids, segments)
    finally:
        _POOL_FUNCTION = None
        synk.close()


def test_an_os_fork_child_that_exits_normally_leaves_the_session_intact():
    proc = subprocess.run([sys.executable, str(SCRIPTS / "forked_child.py")],
                          capture_output=True, text=True, timeout=100, start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    for what, kind, message in result["child"]:
        assert kind == "RuntimeError", (what, kind, message)
        assert RULE in message, message
    assert [what for what, _, _ in result["child"]] == [
        "call", "all_reduce", "data", "distribute", "ping"]
    assert result["child_status"] == 0
    assert result["state"] == "ready"
    assert result["same_workers"] and result["same_segments"], result
    assert result["call_ok"] and result["collective_ok"], result
    assert leftover_segments(result["master"]) == []
    assert "leaked" not in proc.stderr

