"""All-reduce across "machines": synkhronos on 2 machines x 2 vs MPI at 4 ranks vs one machine.

Usage::

    python benchmarks/mpi_collectives.py [--transport shm|tcp|netns] [--rounds 2]
                                         [--max-bytes 67108864] [--out docs/figures]

Four processes in every scheme, float32 sums of 4 B to 64 MiB (powers of 16), each a
shared variable of that size in every process:

- ``hierarchical (fast)``: ``mpiexec -n 2``; each rank is a machine whose script calls
  ``synk.fork(2)`` and then ``synk.all_reduce(var, "sum")``: within each machine through
  shared memory, between the 2 machines' leaders through MPI (``fork(reduction="fast")``,
  the default).
- ``hierarchical (exact)``: the same with ``fork(reduction="exact")`` (bit-identical to
  one machine; every machine receives every process's values).
- ``MPI Allreduce (4 ranks)``: ``mpiexec -n 4``, ``Comm.Allreduce(IN_PLACE, ...)`` on
  private arrays: the MPI library's own all-reduce at the same process count.
- ``one machine (4 processes)``: no MPI; ``synk.fork(4)`` and ``synk.all_reduce``.

A trial of synkhronos is the master's call of ``synk.all_reduce`` (it returns when every
process of every machine has finished); of MPI, the slowest rank's call after a barrier.
The variables hold zeros while timed (sums stay finite however many trials run; adding
zeros costs what adding any other values costs), and every scheme's result is checked
once per size with values 1..4 (the sum must be 10 everywhere).

``--transport``: ``shm`` (plain ``mpiexec``), ``tcp`` (the MPI library kept on TCP over
loopback, every rank as if on its own machine), ``netns`` (two network namespaces
joined by a veth pair, the realistic layout: the 4-rank MPI run puts 2 ranks in each
namespace, so it uses shared memory inside a "machine" and TCP between them, as on two
real machines). Open MPI gets ``mpi_yield_when_idle 1`` and oversubscription, and the
synkhronos processes do not spin (``fork(spin=0)``): 4 busy-polling processes on a
2-core machine otherwise starve each other.

The figure is the median over trials (10th and 90th percentiles beside), pooled over
``--rounds`` rounds that run the schemes one after another, so they share the
machine's load. Output: JSON on stdout and in ``--out``
(``mpi_collectives_<library>_<transport>.json``), and a PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's tests/support
SIZES = [4 * 16**k for k in range(7)]  # 4 B .. 64 MiB
DTYPE = np.float32


def trials_for(nbytes: int) -> int:
    return int(min(200, max(5, 2e8 // max(nbytes, 1) // 20)))


# ---- roles (run in the sub-processes) ----------------------------------------------


def _library_role(sizes: list[int], scheme: str, processes: int, reduction: str) -> None:
    import pytensor

    import synkhronos as synk
    from synkhronos import testing

    n = synk.fork(processes, spin=0.0, reduction=reduction)
    variables = [pytensor.shared(np.zeros(nbytes // 4, DTYPE), name=f"v{nbytes}")
                 for nbytes in sizes]
    synk.function([], [(sum(v.sum() for v in variables), "sum")])
    synk.distribute()
    for var, nbytes in zip(variables, sizes, strict=True):
        size = nbytes // 4
        testing.set_rank_values(var, [np.full(size, r + 1, DTYPE) for r in range(n)])
        synk.all_reduce(var, "sum")
        correct = all(bool((v == DTYPE(n * (n + 1) // 2)).all())
                      for v in testing.rank_values(var))
        testing.set_rank_values(var, [np.zeros(size, DTYPE)] * n)
        measured = []
        for trial in range(trials_for(nbytes) + 2):
            start = time.perf_counter()
            synk.all_reduce(var, "sum")
            if trial >= 2:
                measured.append(time.perf_counter() - start)
        emit(scheme, nbytes, measured, correct)
    synk.close()


def role_hierarchical(sizes: list[int], mode: str) -> None:
    _library_role(sizes, f"hierarchical ({mode})", 2, mode)


def role_mpi(sizes: list[int]) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    for nbytes in sizes:
        n = nbytes // 4
        private = np.empty(n, DTYPE)
        measured = []
        for trial in range(trials_for(nbytes) + 2):
            private[:] = comm.rank + 1
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, private, MPI.SUM)
            took = comm.allreduce(time.perf_counter() - start, MPI.MAX)
            if trial >= 2:
                measured.append(took)
        if comm.rank == 0:
            ok = bool((private == DTYPE(sum(range(1, comm.size + 1)))).all())
            emit(f"MPI Allreduce ({comm.size} ranks)", nbytes, measured, ok)


def role_local(sizes: list[int], processes: int) -> None:
    _library_role(sizes, f"one machine ({processes} processes)", processes, "fast")


def emit(scheme: str, nbytes: int, times: list[float], correct: bool) -> None:
    print("RESULT " + json.dumps({"scheme": scheme, "bytes": nbytes, "times": times,
                                  "correct": correct}), flush=True)


# ---- the driver ----------------------------------------------------------------------


def idle_percent(seconds: float = 0.5) -> float:
    def read():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)

    idle0, total0 = read()
    time.sleep(seconds)
    idle1, total1 = read()
    return round(100.0 * (idle1 - idle0) / max(total1 - total0, 1), 1)


def launch(argv: list[str], n: int, transport: str, library: str, netns, per_host: int,
           timeout: float) -> list[dict]:
    from tests.support import mpiexec

    if n:
        line, env = mpiexec.command(library, n, argv, transport, netns=netns,
                                    per_host=per_host)
    else:
        line, env = argv, {}
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full.get("PYTHONPATH")) if p)
    full["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="synk_bench_") as folder:
        full["TMPDIR"] = folder
        before = set(os.listdir("/dev/shm"))
        run = subprocess.run(line, capture_output=True, text=True, env=full, timeout=timeout,
                             start_new_session=True)
        for entry in set(os.listdir("/dev/shm")) - before:
            if entry.startswith(mpiexec.MPI_SHM_PREFIXES):
                os.unlink(os.path.join("/dev/shm", entry))
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(line[-6:])} failed ({run.returncode}):\n"
                           f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return [json.loads(line[7:]) for line in run.stdout.splitlines()
            if line.startswith("RESULT ")]


def summarize(rows: list[dict]) -> dict:
    pooled: dict[tuple[str, int], dict] = {}
    for row in rows:
        key = (row["scheme"], row["bytes"])
        entry = pooled.setdefault(key, {"times": [], "correct": True})
        entry["times"] += row["times"]
        entry["correct"] &= row["correct"]
    table: dict[str, dict[str, dict]] = {}
    for (scheme, nbytes), entry in sorted(pooled.items(), key=lambda kv: kv[0][1]):
        times = np.array(entry["times"]) * 1e3
        table.setdefault(scheme, {})[str(nbytes)] = {
            "median_ms": round(float(np.median(times)), 4),
            "p10_ms": round(float(np.percentile(times, 10)), 4),
            "p90_ms": round(float(np.percentile(times, 90)), 4),
            "trials": int(times.size),
            "GB_per_s": round(nbytes / (float(np.median(times)) * 1e-3) / 1e9, 3),
            "correct": entry["correct"],
        }
    return table


def draw(table: dict, path: Path, title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG (pip install matplotlib)"
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for scheme, by_size in table.items():
        sizes = [int(s) for s in by_size]
        left.loglog(sizes, [by_size[s]["median_ms"] for s in by_size], "o-", label=scheme)
        right.semilogx(sizes, [by_size[s]["GB_per_s"] for s in by_size], "o-", label=scheme)
    left.set(xlabel="bytes per process", ylabel="median time (ms)", title="time")
    right.set(xlabel="bytes per process", ylabel="GB/s (bytes / time)", title="bandwidth")
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    right.grid(True, which="both", alpha=0.3)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["hierarchical", "mpi", "local"])
    parser.add_argument("--mode", default="fast", choices=["fast", "exact"])
    parser.add_argument("--transport", default="shm", choices=["shm", "tcp", "netns"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--draw", type=Path, metavar="JSON",
                        help="only draw the PNG of an earlier report (beside it)")
    args = parser.parse_args()
    if args.draw is not None:
        report = json.loads(args.draw.read_text())
        idle = report["machine"]["idle_percent"]
        title = (f"all-reduce of float32, 4 processes, {report['mpi']['library']} over "
                 f"{report['transport']} ({report['machine']['cpus']} cores, idle "
                 f"{idle['before']}%/{idle['after']}%)")
        note = draw(report["results"], args.draw.with_suffix(".png"), title)
        if note is None:
            report["png"] = str(args.draw.with_suffix(".png"))
            args.draw.write_text(json.dumps(report, indent=1))
        sys.exit(note)
    sizes = [s for s in SIZES if s <= args.max_bytes]
    if args.role == "hierarchical":
        return role_hierarchical(sizes, args.mode)
    if args.role == "mpi":
        return role_mpi(sizes)
    if args.role == "local":
        return role_local(sizes, 4)

    from tests.support import mpiexec

    library = mpiexec.mpi_library()
    if library is None:
        sys.exit(f"no MPI library: {mpiexec.unavailable_reason()}")
    netns = mpiexec.Netns() if args.transport == "netns" else None
    me = [sys.executable, str(Path(__file__).resolve()), "--max-bytes", str(args.max_bytes)]
    rows: list[dict] = []
    idle = {"before": idle_percent()}
    load_before = os.getloadavg()
    started = time.time()
    try:
        for _ in range(args.rounds):
            for mode in ("fast", "exact"):
                rows += launch(me + ["--role", "hierarchical", "--mode", mode], 2,
                               args.transport, library, netns, 1, args.timeout)
            rows += launch(me + ["--role", "mpi"], 4, args.transport, library, netns, 2,
                           args.timeout)
            rows += launch(me + ["--role", "local"], 0, args.transport, library, netns, 0,
                           args.timeout)
    finally:
        if netns is not None:
            netns.close()
    idle["after"] = idle_percent()
    table = summarize(rows)
    import mpi4py

    version = subprocess.run([str(mpiexec.BIN / "mpiexec"), "--version"],
                             capture_output=True, text=True).stdout.splitlines()[0]
    hierarchical, peer = "hierarchical (fast)", "MPI Allreduce (4 ranks)"
    ratios = {
        size: {
            "hierarchical_over_mpi": round(table[hierarchical][size]["median_ms"]
                                           / table[peer][size]["median_ms"], 3),
            "hierarchical_over_one_machine": round(
                table[hierarchical][size]["median_ms"]
                / table["one machine (4 processes)"][size]["median_ms"], 3),
            "exact_over_fast": round(table["hierarchical (exact)"][size]["median_ms"]
                                     / table[hierarchical][size]["median_ms"], 3),
        }
        for size in table[hierarchical]
    }
    largest = str(sizes[-1])
    report = {
        "benchmark": "mpi_collectives",
        "transport": args.transport,
        "processes": 4,
        "layout": "hierarchical: 2 MPI ranks x 2 local processes; MPI: 4 ranks"
                  + ("; 2 per namespace" if args.transport == "netns" else ""),
        "dtype": "float32",
        "op": "sum",
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "numpy": np.__version__,
                    "loadavg_before_after": [load_before, os.getloadavg()],
                    "idle_percent": idle},
        "mpi": {"library": library, "mpiexec": version, "mpi4py": mpi4py.__version__},
        "wall_s": round(time.time() - started, 1),
        "results": table,
        "ratios": ratios,
        "target": {
            "bytes": int(largest),
            "hierarchical_ms": table[hierarchical][largest]["median_ms"],
            "mpi_ms": table[peer][largest]["median_ms"],
            "met": table[hierarchical][largest]["median_ms"]
            <= table[peer][largest]["median_ms"],
            "rule": "hierarchical all-reduce at least as fast as the MPI library's own "
                    "at the same process count, measured in one run",
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"mpi_collectives_{library}_{args.transport}"
    title = (f"all-reduce of float32, 4 processes, {library} over {args.transport} "
             f"({os.cpu_count()} cores, idle {idle['before']}%/{idle['after']}%)")
    note = draw(table, stem.with_suffix(".png"), title)
    if note:
        report["png"] = note
    else:
        report["png"] = str(stem.with_suffix(".png"))
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
