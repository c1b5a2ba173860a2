"""Soak: many small calls and many fork/close cycles leave nothing behind.

Measures, after a warm-up cycle (baseline) and again at the end: child processes of
the master, its open file descriptors, synkhronos entries in /dev/shm, and the
master's resident set size, whose growth over the cycles is set beside plain
PyTensor building the same graph as often in a fresh process. Prints JSON. The full
run (100 000 calls, 50 cycles) takes a minute; the test suite runs a short version
through ``soak()``.

    python benchmarks/soak.py [--calls 100000] [--cycles 50] [--n 2]
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
from synkhronos import testing


def children() -> int:
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
    gc.collect()
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    files = open_files()
    return {
        "children": children(),
        "open_fds": len(files),
        "fds": files,
        "shm_entries": len(testing.leftover_segments()),
        "rss_bytes": rss_pages * os.sysconf("SC_PAGE_SIZE"),
    }


def one_cycle(n: int, calls: int) -> float:
    """Fork, build and distribute a small function, call it ``calls`` times, close."""
    synk.fork(n)
    x = pt.dmatrix("x")
    f = synk.function([x], [(x.sum(axis=0), "sum"), x.mean()])
    synk.distribute()
    values = synk.data(np.ones((7, 3)))
    start = time.perf_counter()
    for _ in range(calls):
        total, _ = f(values)
    elapsed = time.perf_counter() - start
    assert total[0] == 7.0
    synk.close()
    return elapsed


def build_plain() -> None:
    """What a cycle costs PyTensor alone: build and call the same graph, no session."""
    x = pt.dmatrix("x")
    f = pytensor.function([x], [x.sum(axis=0), x.mean()])
    f(np.ones((7, 3)))


def plain_growth(cycles: int) -> int:
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
    build_plain()  # the warm-up cycle's build
    build_plain()
    base = snapshot()["rss_bytes"]
    for _ in range(cycles):
        build_plain()
    return {"growth_bytes": snapshot()["rss_bytes"] - base}


def soak(calls: int, cycles: int, n: int) -> dict:
    """Resources before and after; RSS growth also measured for plain PyTensor.

    Every cycle builds a new PyTensor function, and PyTensor/Numba keep some memory
    per compiled function for the life of the process (about 350 KB per build of this
    graph, with no synkhronos involved). The peer builds the same graph as often in a
    fresh process (``plain_growth``), and ``rss_growth_beyond_pytensor_ratio`` is what
    synkhronos adds, relative to this process's baseline.
    """
    one_cycle(n, 200)  # warm-up: compile caches, imports
    build_plain()
    baseline = snapshot()
    call_seconds = one_cycle(n, calls)
    after_calls = snapshot()
    for _ in range(cycles):
        one_cycle(n, 10)
    final = snapshot()
    synk_growth = final["rss_bytes"] - after_calls["rss_bytes"]
    peer = plain_growth(cycles)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--plain-builds", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_builds is not None:
        print(json.dumps(_plain_builds(args.plain_builds)))
        return
    print(json.dumps(soak(args.calls, args.cycles, args.n), indent=2))


if __name__ == "__main__":
    main()
