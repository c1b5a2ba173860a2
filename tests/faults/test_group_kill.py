"""Nothing is left in /dev/shm when every process of a session is SIGKILLed at once.

A SIGKILL to the whole process group (Jupyter restarting a busy kernel, ``kill -9
-PGID``, a batch system's kill) leaves no process of the session to clean up; the
session's watcher, outside the group, removes its segments once they are all gone
(``synkhronos/_runtime/watcher.py``). ``scripts/group_kill.py`` runs in its own
process group; the test kills that group while the program is idle or inside a
command (a one-off payload segment in flight), and then nothing of the program may
remain: no entry under its prefix, no worker, no watcher. Also: the watcher is neither
a child nor in the group of the master, and it ends with a normal ``close()``.
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

import synkhronos as synk
from synkhronos.testing import child_pids, program_prefix

from ..processes import leader_alive, poll, shm_entries, sweep

pytestmark = pytest.mark.timeout(60)

SCRIPT = Path(__file__).parent / "scripts" / "group_kill.py"
GONE_S = 5.0  # everything of the killed program must be gone within this


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (a program's watcher names
    the program's prefix)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and leader_alive(int(entry)):
            found.append(int(entry))
    return found


@pytest.mark.parametrize("n, mode", [(2, "idle"), (3, "idle"), (2, "in_command"),
                                     (3, "in_command")])
def test_group_sigkill_leaves_nothing(tmp_path, n, mode):
    mark = tmp_path / "mark"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(n), mode, str(mark)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    info = None
    try:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1]
        info = json.loads(line)
        marks = [mark] if mode == "idle" else [Path(f"{mark}-{r}") for r in range(1, n)]
        assert poll(lambda: all(m.exists() for m in marks), 30)
        entries = shm_entries(info["prefix"])
        assert info["data"] in entries and info["prefix"] + "lock" in entries, entries
        if mode == "in_command":
            assert len(entries) >= 3, entries  # the lock, the data, the payload in flight
        watchers = processes_naming(info["prefix"])
        assert len(watchers) == 1, watchers
        assert os.getpgid(watchers[0]) != proc.pid  # outside the group that is killed

        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(GONE_S) == -signal.SIGKILL
        everyone = [*info["workers"], *watchers]
        assert poll(lambda: shm_entries(info["prefix"]) == [], GONE_S), \
            shm_entries(info["prefix"])
        gone = time.monotonic() - start
        assert poll(lambda: not any(leader_alive(pid) for pid in everyone), GONE_S), \
            [pid for pid in everyone if leader_alive(pid)]
        assert gone < GONE_S
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        if info is not None:
            for pid in [*info["workers"], *processes_naming(info["prefix"])]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sweep(info["prefix"])


def test_the_watcher_is_no_child_and_ends_with_close():
    synk.fork(2)
    try:
        prefix = program_prefix()
        assert poll(lambda: len(processes_naming(prefix)) == 1, GONE_S)
        watcher = processes_naming(prefix)[0]
        assert watcher not in child_pids()
        assert os.getpgid(watcher) != os.getpgrp()
        assert os.getsid(watcher) != os.getsid(0)
    finally:
        synk.close()
    assert poll(lambda: not leader_alive(watcher), GONE_S), "the watcher outlived close()"
    assert shm_entries(prefix) == []
