"""All-reduce bandwidth and latency: synkhronos beside torch.distributed (gloo) and MPI.

Usage::

    python benchmarks/collectives.py [--n 2] [--op sum] [--out benchmarks/results]
        [--sizes 4,67108864] [--peers torch,mpi4py]

Every implementation reduces float32 arrays of 1 element, 1 KiB, 64 KiB, 1 MiB,
16 MiB and 64 MiB (``--sizes``: the listed byte counts instead) across ``--n``
processes in the same run, so the peers see the
same machine load. A trial is one all-reduce; its time is the slowest rank's (for
synkhronos the master's call, which returns when every process has finished); the
figure reported is the median over trials, with the 10th and 90th percentiles.

Implementations:

- ``synkhronos (resident)``: ``synk.all_reduce(var)`` called again and again; after
  the first call each process's value already lives in its exchange slot.
- ``synkhronos (copy-in)``: before every trial each process gives the variable a new
  private storage array (as a PyTensor update does), so the call copies it in; the
  time to set the new storage is not counted.
- ``torch gloo``: ``torch.distributed.all_reduce`` on CPU tensors (only if torch
  imports; the JSON says so otherwise).
- ``mpi4py``: ``Comm.Allreduce(IN_PLACE, ...)`` under ``mpirun`` (only if mpi4py and
  mpirun are found; the JSON says so otherwise).

``--peers`` names the peers to run beside synkhronos (default both: ``torch,mpi4py``;
an empty string: none).

Waiting processes spin, then sleep: ``--spin`` sets ``synk.fork(spin=...)`` (MPI
spins by default; gloo blocks). Left out, the library decides: 1 ms, or 0 (sleep at
once) when there are more processes than usable cores; the JSON records what was used.

The machine may be shared: before and after every series the JSON records how idle
the CPUs were over half a second (``idle_before``/``idle_after``, percent; ours are
idle then). ``--repeat`` runs every series several times; a repetition is *quiet*
when all its series saw at least ``QUIET`` percent idle before and after, and the
figures reported are, per size, the median over the quiet repetitions (over all of
them when none was quiet; ``repetitions_used`` says which).

Writes ``collectives.json`` (also printed) and ``collectives.png`` (bandwidth against
size; only if matplotlib imports, else the JSON says so) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402
from _harness import cpu_model, idle_percent  # noqa: E402

SIZES = [4, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]  # bytes, float32
QUIET = 90.0  # percent idle before and after a series, for its repetition to count


def trials_for(nbytes: int, scale: float) -> int:
    base = 2000 if nbytes <= 1 << 10 else 500 if nbytes <= 64 << 10 else \
        200 if nbytes <= 1 << 20 else 40 if nbytes <= 16 << 20 else 20
    return max(5, int(base * scale))


def summarize(nbytes: int, times: list[float]) -> dict:
    return _harness.summarize_times(times, nbytes)


# -- synkhronos ---------------------------------------------------------------------------
def _set_private(var, rank: int, size: int) -> None:
    """In every process: give ``var`` a new private zero array as storage."""
    cache = _set_private.__dict__.setdefault("arrays", {})
    arrays = cache.setdefault(id(var), [np.full(size, 0.0, "float32") for _ in range(2)])
    arrays.reverse()
    var.set_value(arrays[0], borrow=True)


def bench_synkhronos(n: int, op: str, scale: float, pin: bool, spin: float | None,
                     sizes: list[int]) -> dict:
    import pytensor

    import synkhronos as synk
    from synkhronos import testing

    synk.fork(n, pin=pin, spin=spin)
    try:
        variables = [pytensor.shared(np.full(s // 4, 0.0, "float32"), name=f"v{s}")
                     for s in sizes]
        synk.function([], [v.sum() for v in variables])
        synk.distribute()
        results: dict[str, list] = {"resident": [], "copy-in": []}
        pings = []
        for i in range(trials_for(4, scale) + 200):
            start = time.perf_counter()
            testing.ping()
            if i >= 200:
                pings.append(time.perf_counter() - start)
        results["ping"] = summarize(0, pings)
        results["spin"] = testing.spin_seconds()
        for nbytes, var in zip(sizes, variables, strict=True):
            count = trials_for(nbytes, scale)
            for _ in range(min(count, 20)):
                synk.all_reduce(var, op)
            times = []
            for _ in range(count):
                start = time.perf_counter()
                synk.all_reduce(var, op)
                times.append(time.perf_counter() - start)
            results["resident"].append(summarize(nbytes, times))
            times = []
            for _ in range(count):
                testing.on_variable(var, _set_private, nbytes // 4)
                start = time.perf_counter()
                synk.all_reduce(var, op)
                times.append(time.perf_counter() - start)
            results["copy-in"].append(summarize(nbytes, times))
        return results
    finally:
        synk.close()


# -- torch.distributed, gloo ---------------------------------------------------------------
def _torch_rank(rank: int, n: int, port: int, op: str, scale: float, sizes: list[int],
                queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=n)
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                 "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT,
                 "avg": dist.ReduceOp.SUM}[op]
    rows = []
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32)
        count = trials_for(nbytes, scale)
        for _ in range(min(count, 20)):
            dist.all_reduce(tensor, reduce_op)
        times = []
        for _ in range(count):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor, reduce_op)
            if op == "avg":
                tensor /= n
            times.append(time.perf_counter() - start)
        everyone = [None] * n
        dist.all_gather_object(everyone, times)
        rows.append(np.max(np.array(everyone), axis=0).tolist())
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def bench_torch(n: int, op: str, scale: float, sizes: list[int]) -> dict:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return {"absent": f"torch does not import: {exc}"}
    import multiprocessing as mp
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_torch_rank, args=(r, n, port, op, scale, sizes, queue))
             for r in range(n)]
    for proc in procs:
        proc.start()
    rows = queue.get(timeout=1800)
    for proc in procs:
        proc.join()
    return {"gloo": [summarize(nbytes, times) for nbytes, times in zip(sizes, rows, strict=True)]}


# -- MPI ----------------------------------------------------------------------------------------
def mpi_main(op: str, scale: float, sizes: list[int]) -> None:
    """Run under mpirun: rank 0 prints one JSON line of per-trial times per size."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD,
              "avg": MPI.SUM}[op]
    rows = []
    for nbytes in sizes:
        array = np.full(nbytes // 4, 0.0, "float32")
        count = trials_for(nbytes, scale)
        for _ in range(min(count, 20)):
            comm.Allreduce(MPI.IN_PLACE, array, mpi_op)
        times = []
        for _ in range(count):
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, array, mpi_op)
            if op == "avg":
                array /= comm.size
            times.append(time.perf_counter() - start)
        everyone = comm.gather(times, root=0)
        if comm.rank == 0:
            rows.append(np.max(np.array(everyone), axis=0).tolist())
    if comm.rank == 0:
        sys.stdout.write(json.dumps(rows) + "\n")


def bench_mpi(n: int, op: str, scale: float, sizes: list[int]) -> dict:
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        return {"absent": f"mpi4py does not import: {exc}"}
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return {"absent": "mpirun not found on PATH"}
    command = [mpirun, "-n", str(n), "--allow-run-as-root", "--oversubscribe",
               sys.executable, os.path.abspath(__file__), "--mpi-worker",
               "--op", op, "--scale", str(scale), "--sizes", ",".join(map(str, sizes))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"absent": f"mpirun failed ({done.returncode}): {done.stderr[-2000:]}"}
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    pairs = zip(sizes, rows, strict=True)
    return {"Allreduce": [summarize(nbytes, times) for nbytes, times in pairs]}


# -- report ------------------------------------------------------------------------------------
def plot(report: dict, path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"not drawn: matplotlib does not import ({exc})"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows in report["series"].items():
        ax.plot([r["bytes"] for r in rows], [r["GB_per_s"] for r in rows], marker="o",
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = [r["bytes"] for r in next(iter(report["series"].values()))]
    ax.set_xticks(sizes, [size_label(b) for b in sizes], rotation=35)
    ax.set_xlabel("array size (bytes, float32)")
    ax.set_ylabel("GB/s (array bytes / median time)")
    ax.set_title(f"all_reduce({report['op']}), {report['n']} processes, "
                 f"{report['machine']['cores']} cores")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def size_label(nbytes: int) -> str:
    """``4 B``, ``1 KiB``, ``64 MiB``: a byte count as the plot's ticks name it."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def combine(repeats: list[list[dict]]) -> list[dict]:
    """Per size, the repetition with the median of the median times (all if one)."""
    rows = []
    for per_size in zip(*repeats, strict=True):
        ordered = sorted(per_size, key=lambda row: row["median_us"])
        row = dict(ordered[len(ordered) // 2])
        row["median_us_of_used_repetitions"] = [round(r["median_us"], 2) for r in per_size]
        rows.append(row)
    return rows


def ratios(series: dict) -> dict:
    """synkhronos against each peer, per size: bandwidth ratio (higher is better)."""
    out = {}
    for ours in ("synkhronos (resident)", "synkhronos (copy-in)"):
        for peer in ("torch gloo", "mpi4py"):
            if ours in series and peer in series:
                out[f"{ours} / {peer}"] = {
                    str(a["bytes"]): round(a["GB_per_s"] / b["GB_per_s"], 2)
                    for a, b in zip(series[ours], series[peer], strict=True)
                }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--op", default="sum", choices=["sum", "avg", "max", "min", "prod"])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the trial counts")
    parser.add_argument("--pin", action="store_true", help="pin synkhronos ranks to cores")
    parser.add_argument("--repeat", type=int, default=1, help="run every series this often")
    parser.add_argument("--spin", type=float, default=None,
                        help="synk.fork(spin=...); default: the library's choice, which is "
                             "0 (block at once) when processes outnumber the usable cores")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--sizes", default=None,
                        help="comma-separated byte counts (multiples of 4); default: "
                             + ",".join(map(str, SIZES)))
    parser.add_argument("--peers", default="torch,mpi4py",
                        help="comma-separated peers beside synkhronos: torch, mpi4py")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = SIZES if args.sizes is None else [int(v) for v in args.sizes.split(",")]
    if not sizes or any(v < 4 or v % 4 for v in sizes):
        parser.error(f"--sizes must be positive multiples of 4 bytes; got {args.sizes!r}")
    peers = set(filter(None, args.peers.split(",")))
    if peers - {"torch", "mpi4py"}:
        parser.error(f"--peers knows torch and mpi4py; got {args.peers!r}")
    if args.mpi_worker:
        mpi_main(args.op, args.scale, sizes)
        return
    load_before = os.getloadavg()
    runs: dict[str, list[list]] = {}
    absent: dict[str, str] = {}
    idle: dict[str, list] = {}
    pings: list[float] = []
    spins: list[float] = []
    runners = [
        ("synkhronos", lambda: bench_synkhronos(args.n, args.op, args.scale, args.pin,
                                                args.spin, sizes)),
        ("torch gloo", lambda: bench_torch(args.n, args.op, args.scale, sizes)),
        ("mpi4py", lambda: bench_mpi(args.n, args.op, args.scale, sizes)),
    ]
    runners = [r for r in runners if r[0] == "synkhronos" or r[0].split()[0] in peers]
    for _ in range(args.repeat):
        for name, runner in runners:
            before = idle_percent()
            result = runner()
            idle.setdefault(name, []).append({"idle_before": before,
                                              "idle_after": idle_percent()})
            if "absent" in result:
                absent[name] = result["absent"]
                continue
            if name == "synkhronos":
                pings.append(result.pop("ping")["median_us"])
                spins.append(result.pop("spin"))
                result = {f"synkhronos ({mode})": rows for mode, rows in result.items()}
            else:
                result = {name: next(iter(result.values()))}
            for label, rows in result.items():
                runs.setdefault(label, []).append(rows)
    quiet = [r for r in range(args.repeat)
             if all(min(marks[r].values()) >= QUIET for marks in idle.values())]
    used = quiet or list(range(args.repeat))
    series = {label: combine([repeats[r] for r in used]) for label, repeats in runs.items()}
    report = {
        "benchmark": "all_reduce",
        "n": args.n,
        "op": args.op,
        "dtype": "float32",
        "synkhronos_pinned": args.pin,
        "synkhronos_spin_s": spins,  # per repetition: fork(spin=...) as used
        "machine": {
            "cores": len(os.sched_getaffinity(0)),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "sizes": sizes,
        "peers": sorted(peers),
        "repeat": args.repeat,
        "quiet_repetitions": quiet,
        "repetitions_used": used,
        "median_us_every_repetition": {
            label: [[round(row["median_us"], 2) for row in rows] for rows in repeats]
            for label, repeats in runs.items()
        },
        "synkhronos_empty_command_us": pings,  # the runtime's round trip, for reference
        "idle_percent": idle,
        "series": series,
        "absent": absent,
        "ratios": ratios(series),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report["png"] = plot(report, out / "collectives.png")
    text = json.dumps(report, indent=1)
    (out / "collectives.json").write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
