"""Ctrl-C keeps the session (SPEC section 6), as a terminal and as Jupyter send it.

``scripts/interrupt_keeps_session.py`` runs in its own session (process group); the
test interrupts it seven times -- during a worker's long command, during four loops
of calls (at different moments), during another long command and during the next
call's wait for it -- with SIGINT to the whole group (a terminal's Ctrl-C) or to the
master alone (as a Jupyter kernel's interrupt may). Each must raise
``KeyboardInterrupt`` in the master within a second, and after each the function
gives the plain PyTensor function's values and a collective is right. The script
makes Ctrl-C deliverable itself, so this passes when the suite runs with SIGINT
ignored (``nohup``, ``pytest &``).

``scripts/master_busy_in_share.py`` keeps the master inside its own share's compiled
kernel nearly all the time, on each of PyTensor's backends (the C virtual machine,
Numba, JAX) and at 1, 2 and 3 processes; SIGINT to it lands there, where the handler's
``KeyboardInterrupt`` may come out of the compiled code as another exception (Numba's
``SystemError``), or not at all. Each of three interrupts must still be
``KeyboardInterrupt`` within a second, the session kept, the next call right.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..processes import leader_alive, poll, shm_entries, sweep

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).parent / "scripts" / "interrupt_keeps_session.py"
BUSY_SCRIPT = Path(__file__).parent / "scripts" / "master_busy_in_share.py"
BUSY_S = 2.0  # the script's
LOOP_DELAYS = (0.3, 0.05, 0.17, 0.41)  # one per loop of calls the script runs (LOOPS)


@pytest.mark.parametrize("target", ["group", "master"])
def test_ctrl_c_keeps_the_session(tmp_path, target):
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(marks)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    info = None

    def interrupt() -> float:
        sent = time.monotonic()
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        return sent

    def when(name: str, delay: float = 0.0) -> float:
        assert poll(lambda: (marks / name).exists() or proc.poll() is not None, 60), name
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(delay)
        return interrupt()

    try:
        info = json.loads(proc.stdout.readline() or "null")
        assert info is not None, proc.communicate()[1]
        sent = {"busy-1": when("busy-1", 0.05)}
        for k, delay in enumerate(LOOP_DELAYS):
            sent[f"loop-{k}"] = when(f"loop-{k}", delay)
        sent["busy-2"] = when("busy-2", 0.05)
        sent["settling"] = when("settling", 0.2)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        result = json.loads(out.splitlines()[-1])
        late = {name: result["raised"][name] - t if isinstance(result["raised"][name], float)
                else result["raised"][name] for name, t in sent.items()}
        assert all(isinstance(v, float) and 0 <= v < 1.0 for v in late.values()), late
        assert result["checks"] == [], result["checks"]
        assert result["state"] == "ready"
        # the first call after a long command waited for the busy worker to finish it
        assert result["waited"]["busy-1"] > BUSY_S - 1.0, result
        assert result["children"] == [] and result["left"] == [], result
        assert poll(lambda: not any(leader_alive(pid) for pid in info["workers"]), 10)
        assert shm_entries(info["prefix"]) == []
    finally:
        _end(proc, info)


def _end(proc: subprocess.Popen, info: dict | None) -> None:
    """Whatever the test's outcome: the script's process, its workers (``info``, once
    the script printed it) and its segments gone."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    if info is not None:
        for pid in info["workers"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sweep(info["prefix"])


def _backend(name: str):
    """A backend's parameter, skipped (with why) where it cannot run here."""
    marks = []
    if name == "c":
        import pytensor

        marks.append(pytest.mark.skipif(not pytensor.config.cxx,
                                        reason="PyTensor's C backend needs a C++ compiler"))
    if name == "jax":  # looked up, not imported: the script imports it in its process
        marks.append(pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                        reason="jax is not installed (it is in the test extra)"))
    return pytest.param(name, marks=marks, id=name)


INTERRUPT_DELAYS = (0.3, 0.43, 0.57)  # after each round's start: different moments of a call


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("backend", [_backend("c"), _backend("numba"), _backend("jax")])
def test_ctrl_c_inside_a_compiled_kernel_of_the_masters_share(tmp_path, backend, n):
    """SIGINT to a master busy in its share's compiled kernel: ``KeyboardInterrupt``
    within a second, three times, never a ``WorkerError``, its traceback one exception
    long (not chained to what the kernel raised); after each the session is
    ready and the next call equals numpy's; the program then ends by the interrupt
    and leaves no process and no segment."""
    errors = tmp_path / "stderr"
    with open(errors, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(BUSY_SCRIPT), backend, str(n), str(len(INTERRUPT_DELAYS))],
            stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
    info = None
    try:
        info = json.loads(proc.stdout.readline() or "null")
        assert info is not None, errors.read_text()
        causes = []
        for k, delay in enumerate(INTERRUPT_DELAYS):
            assert json.loads(proc.stdout.readline() or "null") == {"ready": k}, \
                errors.read_text()
            time.sleep(delay)
            sent = time.monotonic()
            os.kill(proc.pid, signal.SIGINT)
            result = json.loads(proc.stdout.readline() or "null")
            assert result is not None, errors.read_text()
            assert 0 <= result["raised"] - sent < 1.0, result
            assert result["state"] == "ready"
            assert abs(result["again"] - result["expected"]) <= 1e-9 * abs(result["expected"])
            # one short traceback: the interruption alone, raised afresh where the
            # program called, not chained to what the kernel raised around it
            assert result["links"] == 1, result
            causes.append(result["cause"])
        if backend == "numba":
            # Numba's dispatcher runs the handler inside the kernel's call and fails
            # with a SystemError: the interrupt landed in compiled code and was
            # recognised there (every time of 8 here; the master is in its kernel
            # about 90% of the time). C and JAX run the handler once their kernel
            # has returned, in Python code: their KeyboardInterrupt comes as it is.
            assert "SystemError" in causes, causes
        proc.wait(timeout=30)
        err = errors.read_text()
        assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT), err
        assert "KeyboardInterrupt" in err and "WorkerError" not in err, err
        assert poll(lambda: not any(leader_alive(pid) for pid in info["workers"]), 10)
        assert shm_entries(info["prefix"]) == []
    finally:
        _end(proc, info)
