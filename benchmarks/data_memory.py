"""How much memory one large synk.data costs across all processes (proportional set size).

For each process count ``n``: fork, create a float32 ``synk.data`` of ``--gib`` GiB, fill
it in the master, and have every process read all of it (a CALLABLE command that maps it
through ``DataRef.view()`` and sums it). Then add up the proportional set size
(PSS, ``/proc/<pid>/smaps_rollup``) of the master and every worker: a page mapped by k
processes counts 1/k in each, so shared data counts once in the total. With no copies
the total is the data plus the interpreters' own memory; the goal is below 1.1 x data.

Prints one JSON document: a list with one record per ``n``.

    python benchmarks/data_memory.py [--gib 2] [--n 2 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import synkhronos as synk
from synkhronos import testing
from synkhronos.data import DataRef

GIB = 1 << 30


def pss_bytes(pid: int) -> int:
    """Proportional set size of process ``pid``, from ``/proc/<pid>/smaps_rollup``."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


def sum_all(ref: DataRef) -> float:
    """Runs in every process: map the data (no copy) and read every item."""
    return float(ref.view().sum(dtype=np.float64))


def measure(n: int, data_bytes: int) -> dict:
    synk.fork(n)
    try:
        pids = testing.process_pids()
        baseline = [pss_bytes(pid) for pid in pids]
        items = data_bytes // 4
        x = synk.data(dtype="float32", shape=(items,))
        start = time.perf_counter()
        x.data.fill(1.0)
        filled = time.perf_counter()
        sums = testing.run_on_ranks(sum_all, x.ref())
        summed = time.perf_counter()
        per_process = [pss_bytes(pid) for pid in pids]
        total = sum(per_process)
        x.free_memory()
        return {
            "n": n,
            "data_bytes": items * 4,
            "total_pss_bytes": total,
            "ratio": round(total / (items * 4), 4),
            "baseline_pss_bytes": sum(baseline),
            "added_pss_bytes": total - sum(baseline),
            "pss_bytes_per_process": per_process,
            "every_process_read_all": all(s == float(items) for s in sums),
            "fill_s": round(filled - start, 3),
            "read_all_s": round(summed - filled, 3),
        }
    finally:
        synk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the data in GiB")
    parser.add_argument("--n", type=int, nargs="+", default=[2, 3], help="process counts")
    args = parser.parse_args()
    data_bytes = int(args.gib * GIB)
    records = [measure(n, data_bytes) for n in args.n]
    print(json.dumps(records, indent=2))  # noqa: T201 - a benchmark reports on stdout


if __name__ == "__main__":
    main()
