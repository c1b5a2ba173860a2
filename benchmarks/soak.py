"""Soak: many small calls and many fork/close cycles leave nothing behind.

Measures, after a warm-up cycle (baseline) and again at the end: child processes of
the master, its open file descriptors, synkhronos entries in /dev/shm, and the
master's resident set size. Prints JSON. The full run (100 000 calls, 50 cycles)
takes minutes; the test suite runs a short version through ``soak()``.

    python benchmarks/soak.py [--calls 100000] [--cycles 50] [--n 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos._runtime import shmem


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


def snapshot() -> dict:
    gc.collect()
    mine = f"{shmem.PREFIX}{os.getpid()}_"
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {
        "children": children(),
        "open_fds": len(os.listdir("/proc/self/fd")),
        "shm_entries": sum(e.startswith(mine) or e.startswith("sem." + mine)
                           for e in os.listdir(shmem.SHM_DIR)),
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


def soak(calls: int, cycles: int, n: int) -> dict:
    """Resources before and after; RSS growth also measured for plain PyTensor.

    Every cycle builds a new PyTensor function, and PyTensor/Numba keep some memory
    per compiled function for the life of the process (measured here: about 5% of
    RSS over 25 builds of the same graph, with no synkhronos involved). The peer is
    therefore measured in the same run, and ``rss_growth_beyond_pytensor`` is what
    synkhronos adds.
    """
    one_cycle(n, 200)  # warm-up: compile caches, imports
    build_plain()
    baseline = snapshot()
    call_seconds = one_cycle(n, calls)
    after_calls = snapshot()
    for _ in range(cycles):
        one_cycle(n, 10)
    final = snapshot()
    for _ in range(cycles + 1):
        build_plain()
    plain = snapshot()
    synk_growth = final["rss_bytes"] - baseline["rss_bytes"]
    plain_growth = plain["rss_bytes"] - final["rss_bytes"]
    return {
        "n_parallel": n,
        "calls": calls,
        "cycles": cycles,
        "call_median_us_estimate": round(call_seconds / max(calls, 1) * 1e6, 2),
        "baseline": baseline,
        "final": final,
        "rss_growth_ratio": round(final["rss_bytes"] / baseline["rss_bytes"], 4),
        "rss_growth_after_calls_ratio": round(after_calls["rss_bytes"] / baseline["rss_bytes"], 4),
        "plain_pytensor_growth_same_builds_ratio": round(
            plain["rss_bytes"] / final["rss_bytes"], 4),
        "rss_growth_beyond_pytensor_ratio": round(
            1 + (synk_growth - plain_growth) / baseline["rss_bytes"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--n", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(soak(args.calls, args.cycles, args.n), indent=2))


if __name__ == "__main__":
    main()
