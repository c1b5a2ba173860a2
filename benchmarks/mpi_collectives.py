"""All-reduce across "machines": hierarchical (shared memory + MPI between leaders) vs MPI.

Usage::

    python benchmarks/mpi_collectives.py [--transport shm|tcp|netns] [--rounds 2]
                                         [--max-bytes 67108864] [--out benchmarks/out]

Four processes in every scheme, float32 sums of 4 B to 64 MiB (powers of 16):

- ``hierarchical (fast)``: ``mpiexec -n 2``, each rank a machine's leader that forked
  one local process before MPI started. Per call: every process copies the part of
  its private array that the other process reduces into shared memory; each reduces
  its half of the elements (its own part read from its private array), in rank
  order; the leader all-reduces the machine's sum with
  ``synkhronos._runtime.mpi.Leaders.all_reduce(mode="fast")`` (the MPI library's
  all-reduce below 1 MiB, the chunk-owner scheme above); every process copies the
  result out into its private array. The local part is plain anonymous shared
  memory and a spin-then-sleep barrier written here (the library's own collectives
  will replace it after integration).
- ``hierarchical (exact)``: the same, but every process copies its whole array in and
  the leader passes both local copies to
  ``all_reduce_pieces`` (bit-identical to one machine folding in rank order; each
  piece crosses between machines, so twice the traffic).
- ``MPI Allreduce (4 ranks)``: ``mpiexec -n 4``, ``Comm.Allreduce(IN_PLACE, ...)`` on
  private arrays: the MPI library's own all-reduce at the same process count.
- ``one machine (4 processes)``: no MPI; 4 forked processes, the same shared-memory
  scheme (copy in the others' shares, each reduces its quarter, copy out).

``--transport``: ``shm`` (plain ``mpiexec``), ``tcp`` (the MPI library kept on TCP over
loopback, every rank as if on its own machine), ``netns`` (two network namespaces
joined by a veth pair, the realistic layout: the 4-rank MPI run puts 2 ranks in each
namespace, so it uses shared memory inside a "machine" and TCP between them, as
on two real machines). Open MPI gets ``mpi_yield_when_idle 1`` and oversubscription
(4 busy-polling processes on a 2-core machine otherwise starve each other).

A trial's time is the slowest process's (each times its own call after a barrier);
the figure is the median over trials (10th and 90th percentiles beside), pooled over
``--rounds`` rounds that run the schemes one after another, so they share the
machine's load. Every scheme's result is checked once per size. Output: JSON on
stdout and in ``--out``, and a PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIZES = [4 * 16**k for k in range(7)]  # 4 B .. 64 MiB
DTYPE = np.float32


def trials_for(nbytes: int) -> int:
    return int(min(200, max(5, 2e8 // max(nbytes, 1) // 20)))


# ---- the local part: anonymous shared memory and a barrier -------------------------


class Local:
    """``size`` processes of one machine: slots, a result, per-process counters."""

    def __init__(self, size: int, max_items: int):
        self.size = size
        self.items = max_items
        header = 64 * size  # one 64-byte line per process's counter
        self.memory = mmap.mmap(-1, header + (size + 1) * max_items * 4)
        self.counters = np.frombuffer(self.memory, np.int64, count=8 * size)[::8]
        data = np.frombuffer(self.memory, DTYPE, offset=header,
                             count=(size + 1) * max_items).reshape(size + 1, max_items)
        self.slots, self.result = data[:size], data[size]
        self.arrived = 0

    def barrier(self, me: int) -> None:
        """Spin (yielding the core) for 1 ms, then sleep in short steps."""
        self.arrived += 1
        self.counters[me] = self.arrived
        start = time.perf_counter()
        while (self.counters < self.arrived).any():
            if time.perf_counter() - start < 1e-3:
                os.sched_yield()
            else:
                time.sleep(2e-5)

    def fork(self, children: int) -> int:
        """Fork ``children`` processes; return this process's local index."""
        for index in range(1, children + 1):
            if os.fork() == 0:
                return index
        return 0


def share(n: int, parts: int, me: int) -> tuple[int, int]:
    base, extra = divmod(n, parts)
    lo = me * base + min(me, extra)
    return lo, lo + base + (1 if me < extra else 0)


def copy_in(local: Local, me: int, private: np.ndarray, whole: bool = False) -> None:
    """Put this process's value where the others will read it.

    Only the other processes' shares are needed (this process reduces its own share
    straight from its private array), unless ``whole``.
    """
    n = private.size
    if whole:
        local.slots[me, :n] = private
        return
    lo, hi = share(n, local.size, me)
    local.slots[me, :lo] = private[:lo]
    local.slots[me, hi:n] = private[hi:]


def local_reduce(local: Local, me: int, private: np.ndarray) -> None:
    """This process's share of the elements, summed over every process in rank order."""
    lo, hi = share(private.size, local.size, me)
    out = local.result[lo:hi]
    for index in range(local.size):
        source = private[lo:hi] if index == me else local.slots[index, lo:hi]
        if index == 0:
            np.copyto(out, source)
        else:
            np.add(out, source, out=out)


# ---- roles (run in the sub-processes) ----------------------------------------------


def role_hierarchical(sizes: list[int], mode: str) -> None:
    from synkhronos._runtime import mpi

    launch = mpi.detect_launch("mpi")
    local = Local(2, max(sizes) // 4)
    # each local process's last trial time, in memory shared across the fork
    times = np.frombuffer(mmap.mmap(-1, 16), np.float64)
    me = local.fork(1)
    if me == 0:
        leaders = mpi.start(2, expected_rank=launch.rank)
        machine = leaders.rank
    else:
        leaders = None
        machine = launch.rank
    global_rank = 2 * machine + me
    for nbytes in sizes:
        n = nbytes // 4
        private = np.full(n, global_rank + 1, DTYPE)
        trials = trials_for(nbytes)
        measured = []
        for trial in range(trials + 2):
            private[:] = global_rank + 1
            local.barrier(me)
            if leaders is not None:
                leaders.barrier()
            local.barrier(me)
            start = time.perf_counter()
            copy_in(local, me, private, whole=mode == "exact")
            local.barrier(me)
            if mode == "fast":
                local_reduce(local, me, private)
                local.barrier(me)
                if leaders is not None:
                    leaders.all_reduce(local.result[:n], "sum", mode="fast")
            elif leaders is not None:
                leaders.all_reduce_pieces(local.slots[:, :n], "sum", out=local.result[:n])
            local.barrier(me)
            private[:] = local.result[:n]
            times[me] = time.perf_counter() - start
            local.barrier(me)
            if leaders is not None:
                slowest = leaders.all_reduce(np.array([times.max()]), "max")[0]
                if trial >= 2:
                    measured.append(slowest)
        if leaders is not None and leaders.is_master:
            expected = DTYPE(sum(range(1, 5)))
            emit(f"hierarchical ({mode})", nbytes, measured, bool((private == expected).all()))
    if leaders is None:
        os._exit(0)
    os.wait()
    leaders.close()


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
    local = Local(processes, max(sizes) // 4)
    times = np.frombuffer(mmap.mmap(-1, 8 * processes), np.float64)
    me = local.fork(processes - 1)
    for nbytes in sizes:
        n = nbytes // 4
        private = np.empty(n, DTYPE)
        measured = []
        for trial in range(trials_for(nbytes) + 2):
            private[:] = me + 1
            local.barrier(me)
            start = time.perf_counter()
            copy_in(local, me, private)
            local.barrier(me)
            local_reduce(local, me, private)
            local.barrier(me)
            private[:] = local.result[:n]
            times[me] = time.perf_counter() - start
            local.barrier(me)
            if trial >= 2:
                measured.append(times.max())
        if me == 0:
            ok = bool((private == DTYPE(sum(range(1, processes + 1)))).all())
            emit(f"one machine ({processes} processes)", nbytes, measured, ok)
    if me:
        os._exit(0)
    for _ in range(processes - 1):
        os.wait()


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
    sys.path.insert(0, str(REPO))
    from tests.mpi import harness

    if n:
        line, env = harness.command(library, n, argv, transport, netns=netns,
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
            if entry.startswith(harness.MPI_SHM_PREFIXES):
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
    args = parser.parse_args()
    sizes = [s for s in SIZES if s <= args.max_bytes]
    if args.role == "hierarchical":
        return role_hierarchical(sizes, args.mode)
    if args.role == "mpi":
        return role_mpi(sizes)
    if args.role == "local":
        return role_local(sizes, 4)

    sys.path.insert(0, str(REPO))
    from tests.mpi import harness

    library = harness.mpi_library()
    if library is None:
        sys.exit(f"no MPI library: {harness.unavailable_reason()}")
    netns = harness.Netns() if args.transport == "netns" else None
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

    version = subprocess.run([str(harness.BIN / "mpiexec"), "--version"],
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
