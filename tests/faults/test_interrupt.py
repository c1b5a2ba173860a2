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
"""

from __future__ import annotations

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
