"""The soak: many small calls and many fork/close cycles leave nothing behind.

:func:`soak` takes a baseline after a warm-up cycle, then runs ``calls`` calls of a
small function in one session and ``cycles`` fork/build/call/close cycles, and
measures again: child processes of the master, its open file descriptors, synkhronos
entries in /dev/shm, and its resident set size. Every cycle builds a new PyTensor
function, and PyTensor keeps some memory per compiled function for the life of the
process with no synkhronos involved, so the growth over the cycles is set beside
plain PyTensor building the same graph as often in a fresh process (the peer:
``python tests/support/soak.py --plain-builds N`` prints its growth).

The test suite runs a short soak (``tests/faults/test_soak.py``);
``benchmarks/soak.py`` runs the long one (100 000 calls, 50 cycles) and prints it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.testing import leftover_segments, session_open

__all__ = ["soak", "snapshot", "children", "open_files"]


def children() -> int:
    """How many live (not zombie) child processes this process has."""
    me = str(os.getpid())
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += fields[1] == me and fields[0] != "Z"
    return count


def open_files() -> dict[str, str]:
    """This process's open file descriptors: number -> what it refers to."""
    files = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            files[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return files


def snapshot() -> dict:
    """This process's resources now: children, open descriptors, its synkhronos entries
    in /dev/shm, resident bytes (after a garbage collection)."""
    gc.collect()
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    files = open_files()
    return {
        "children": children(),
        "open_fds": len(files),
        "fds": files,
        "shm_entries": len(leftover_segments()),
        "rss_bytes": rss_pages * os.sysconf("SC_PAGE_SIZE"),
    }


def _one_cycle(n: int, calls: int) -> float:
    """Fork, build and distribute a small function, call it ``calls`` times, close;
    the seconds the calls took."""
    synk.fork(n)
    x = pt.dmatrix("x")
    f = synk.function([x], [(x.sum(axis=0), "sum"), x.mean()])
    synk.distribute()
    values = synk.data(np.ones((7, 3)))
    start = time.perf_counter()
    for _ in range(calls):
        total, _ = f(values)
    elapsed = time.perf_counter() - start
    if total[0] != 7.0:
        raise AssertionError(f"the soak's function summed 7 ones to {total[0]}")
    synk.close()
    return elapsed


def _build_plain() -> None:
    """What a cycle costs PyTensor alone: build and call the same graph, no session."""
    x = pt.dmatrix("x")
    f = pytensor.function([x], [x.sum(axis=0), x.mean()])
    f(np.ones((7, 3)))


def _plain_growth(cycles: int) -> int:
    """RSS growth over ``cycles`` builds of plain PyTensor, in a fresh process.

    A process's later builds grow its RSS less than its first ones (PyTensor's and
    Numba's caches and the allocator's arenas fill up), so the peer runs in its own
    process with the same warm-up as the synkhronos run: measured after the synkhronos
    cycles in the same process, it grew a third less per build and made synkhronos
    look 2% worse than it is.
    """
    out = subprocess.run(
        [sys.executable, __file__, "--plain-builds", str(cycles)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)["growth_bytes"]


def _plain_builds(cycles: int) -> dict:
    _build_plain()  # the warm-up cycle's build
    _build_plain()
    base = snapshot()["rss_bytes"]
    for _ in range(cycles):
        _build_plain()
    return {"growth_bytes": snapshot()["rss_bytes"] - base}


def soak(calls: int, cycles: int, n: int) -> dict:
    """Resources before and after ``calls`` calls and ``cycles`` fork/close cycles.

    Parameters
    ----------
    calls : int
        Calls of a small function (a sum and a mean of 7 x 3 rows) in one session.
    cycles : int
        Then this many cycles of fork, build, distribute, 10 calls, close.
    n : int
        ``n_parallel`` of every session.

    Returns
    -------
    dict
        ``baseline`` and ``final`` (each a :func:`snapshot`), the mean microseconds per
        call, and RSS ratios: ``rss_growth_after_calls_ratio`` (after the calls over the
        baseline), ``rss_growth_ratio`` (at the end), and
        ``rss_growth_beyond_pytensor_ratio``: 1 plus what the cycles grew beyond plain
        PyTensor building the same graph as often in a fresh process, over the
        baseline.

    Raises
    ------
    RuntimeError
        If a session is open already.
    """
    if session_open():
        raise RuntimeError("soak() forks its own sessions; call synk.close() first")
    _one_cycle(n, 200)  # warm-up: compile caches, imports
    _build_plain()
    baseline = snapshot()
    call_seconds = _one_cycle(n, calls)
    after_calls = snapshot()
    for _ in range(cycles):
        _one_cycle(n, 10)
    final = snapshot()
    synk_growth = final["rss_bytes"] - after_calls["rss_bytes"]
    peer = _plain_growth(cycles)
    return {
        "n_parallel": n,
        "calls": calls,
        "cycles": cycles,
        "call_mean_us": round(call_seconds / max(calls, 1) * 1e6, 2),
        "baseline": baseline,
        "final": final,
        "rss_growth_ratio": round(final["rss_bytes"] / baseline["rss_bytes"], 4),
        "rss_growth_after_calls_ratio": round(after_calls["rss_bytes"] / baseline["rss_bytes"], 4),
        "cycle_growth_kib": round(synk_growth / max(cycles, 1) / 1024, 1),
        "plain_pytensor_build_growth_kib": round(peer / max(cycles, 1) / 1024, 1),
        "rss_growth_beyond_pytensor_ratio": round(
            1 + (synk_growth - peer) / baseline["rss_bytes"], 4),
    }


def _main() -> None:  # the peer's process (python tests/support/soak.py)
    parser = argparse.ArgumentParser(description="plain PyTensor's RSS growth per build")
    parser.add_argument("--plain-builds", type=int, required=True)
    args = parser.parse_args()
    sys.stdout.write(json.dumps(_plain_builds(args.plain_builds)) + "\n")


if __name__ == "__main__":
    _main()
