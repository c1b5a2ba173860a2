"""Round trip of the empty command (PING) against a bare semaphore ping-pong.

The floor for one command is a wake-up of each worker and a wake-up of the master. A
ping-pong between two processes over two posix_ipc semaphores, measured in the same
run, is that floor without any synkhronos bookkeeping; ``ratio`` is the median PING at
n=2 over the median ping-pong round trip. Each timing is one round trip; every series
is warmed up first. With a core per process ``fork()`` spins 1 ms before it blocks,
so PING at n=2 is also timed with ``spin=0`` (``ratio_nospin``: the same block-and-wake
path as the ping-pong). Prints JSON; ``--png PATH`` also draws the distributions.

Spinning workers have a lower floor: a flag in shared memory that one process sets and
the other spins on, and back. It is timed twice, as the least any command can cost:
written in Python (``python_spin``: the language's own floor, what a command path in
Python cannot beat) and compiled by Numba when it imports (``compiled_spin``: the
machine's floor, called from Python once per round trip as a compiled command path
would be). ``ratio_python_spin`` and ``ratio_compiled_spin`` are the median PING at
n=2 over each.

    python benchmarks/command_roundtrip.py [--rounds 5000] [--blocks 5] [--warmup 300]
                                           [--png out.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import posix_ipc

import synkhronos as synk
from synkhronos import testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _compiled import run_pair, spin_pair  # noqa: E402
from _harness import rounds_summary  # noqa: E402


def _default_spin(n: int) -> float:
    """What fork() picks when spin=None, read from a session of ``n``."""
    synk.fork(n)
    try:
        return testing.spin_seconds()
    finally:
        synk.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(prefix: str, seconds: list[float]) -> dict[str, float]:
    us = [s * 1e6 for s in seconds]
    return {
        f"{prefix}_median_us": round(statistics.median(us), 2),
        f"{prefix}_p90_us": round(percentile(us, 90), 2),
        f"{prefix}_p99_us": round(percentile(us, 99), 2),
        f"{prefix}_max_us": round(max(us), 2),
    }


def ping_times(n: int, rounds: int, warmup: int, spin: float | None = None) -> list[float]:
    """Time ``rounds`` empty commands, one by one, in a fresh session of ``n``."""
    synk.fork(n, spin=spin)
    try:
        ping = testing.ping
        for _ in range(warmup):
            ping()
        clock = time.perf_counter
        times = []
        for _ in range(rounds):
            start = clock()
            ping()
            times.append(clock() - start)
        return times
    finally:
        synk.close()


def semaphore_pingpong_times(rounds: int, warmup: int) -> list[float]:
    """Time ``rounds`` round trips master -> child -> master over two semaphores."""
    prefix = f"synk_bench_{os.getpid()}_"
    ping = posix_ipc.Semaphore(f"/{prefix}ping", posix_ipc.O_CREX, mode=0o600)
    pong = posix_ipc.Semaphore(f"/{prefix}pong", posix_ipc.O_CREX, mode=0o600)
    ping.unlink()
    pong.unlink()

    def post(flags, k: int) -> None:
        ping.release()
        pong.acquire()

    def serve(flags, total: int) -> None:  # the child answers every ping, then leaves
        for _ in range(total):
            ping.acquire()
            pong.release()

    try:
        return run_pair(post, serve, rounds, warmup)[0]
    finally:
        ping.close()
        pong.close()


def _post_python(flags, k: int) -> None:
    words = flags.data.cast("B").cast("q")  # item access on a memoryview: the cheapest
    words[0] = k
    while words[8] != k:
        pass


def _serve_python(flags, total: int) -> None:
    words = flags.data.cast("B").cast("q")
    for k in range(1, total + 1):
        while words[0] != k:
            pass
        words[8] = k


def python_spin_times(rounds: int, warmup: int) -> list[float]:
    """The spinning floor in Python (see the module docstring)."""
    return run_pair(_post_python, _serve_python, rounds, warmup)[0]


def compiled_spin_times(rounds: int, warmup: int) -> list[float] | None:
    """The spinning floor compiled by Numba (None where Numba does not import)."""
    compiled = spin_pair()
    return None if compiled is None else run_pair(*compiled, rounds, warmup)[0]


def draw(path: str, series: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, seconds in series.items():
        us = sorted(s * 1e6 for s in seconds)
        ax.plot(us, [i / len(us) for i in range(len(us))], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("round trip (µs)")
    ax.set_ylabel("fraction of round trips")
    ax.set_title("Empty command (PING) vs semaphore ping-pong")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=300, help="per block and series")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--png", default=None, help="also draw the distributions here")
    args = parser.parse_args()

    # Interleaved blocks: the machine's load (and its CPUs' idle states) changes both
    # kinds of round trip a lot, so every series gets a block in turn.
    names = ["PING n=2", "PING n=3", "PING n=1", "PING n=2 spin=0", "semaphore ping-pong",
             "python spin ping-pong", "compiled spin ping-pong"]
    per_block = max(1, args.rounds // args.blocks)
    compiled = spin_pair() is not None
    if not compiled:
        names.remove("compiled spin ping-pong")
    series: dict[str, list[float]] = {name: [] for name in names}
    blocks: dict[str, list[list[float]]] = {name: [] for name in names}
    for _ in range(args.blocks):
        blocks["semaphore ping-pong"].append(semaphore_pingpong_times(per_block, args.warmup))
        blocks["python spin ping-pong"].append(python_spin_times(per_block, args.warmup))
        if compiled:
            times = compiled_spin_times(per_block, args.warmup)
            assert times is not None
            blocks["compiled spin ping-pong"].append(times)
        for n in (2, 3, 1):
            blocks[f"PING n={n}"].append(ping_times(n, per_block, args.warmup))
        blocks["PING n=2 spin=0"].append(ping_times(2, per_block, args.warmup, spin=0.0))
    for name in names:
        series[name] = [t for block in blocks[name] for t in block]
    floor = series["semaphore ping-pong"]

    result: dict[str, object] = {}
    for n in (2, 3, 1):
        result.update(summary(f"n{n}_ping", series[f"PING n={n}"]))
    result.update(summary("n2_nospin_ping", series["PING n=2 spin=0"]))
    result.update(summary("semaphore_pingpong", floor))
    result.update(summary("python_spin", series["python spin ping-pong"]))
    result["ratio_python_spin"] = round(
        result["n2_ping_median_us"] / result["python_spin_median_us"], 2)
    if compiled:
        result.update(summary("compiled_spin", series["compiled spin ping-pong"]))
        result["ratio_compiled_spin"] = round(
            result["n2_ping_median_us"] / result["compiled_spin_median_us"], 2)
    else:
        result["compiled_spin"] = "not measured: numba does not import"
    result["ratio"] = round(result["n2_ping_median_us"] / result["semaphore_pingpong_median_us"], 2)
    # the same wake-up path on both sides: every waiter blocks on its semaphore
    result["ratio_nospin"] = round(
        result["n2_nospin_ping_median_us"] / result["semaphore_pingpong_median_us"], 2
    )
    result["every_block"] = {name: rounds_summary(blocks[name])["round_medians_us"]
                             for name in names}
    result["default_spin_s"] = {"n2": _default_spin(2), "n3": _default_spin(3)}
    result["rounds"] = per_block * args.blocks
    result["blocks"] = args.blocks
    result["warmup"] = args.warmup
    result["load_average_1min"] = round(os.getloadavg()[0], 2)
    result["usable_cores"] = len(os.sched_getaffinity(0))
    result["python"] = platform.python_version()
    if args.png:
        draw(args.png, series)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
