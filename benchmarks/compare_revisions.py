"""Two checkouts of synkhronos side by side: the same benchmarks, taking turns.

Usage::

    git worktree add /tmp/before <commit>
    python benchmarks/compare_revisions.py --before /tmp/before --after . \\
        [--rounds 5] [--only call_overhead,command_roundtrip,collectives,scaling]

Each round runs every selected benchmark once in each checkout (its own copy of the
script, its own package: ``PYTHONPATH`` is the checkout; ``--scripts DIR``: every
checkout runs the scripts of checkout ``DIR`` instead, for a figure that an older
script does not report), the order of the two
flipped from round to round, so that a change in the machine's load falls on both
alike. From each run a few figures are read out of the JSON the script prints; the
report gives, per figure, the median over rounds in each checkout and the median of
the per-round ratios after / before (below 1: the after checkout is faster; for the
scaling figures, which are fractions of the ceiling, and the PyMC ratio, above 1 is
better).

The figures:

- ``call_overhead``: a tiny call's overhead over the plain PyTensor call (numpy
  input, ``Data`` input; the mixed pattern, the repeated one, and numpy rows of two
  sizes in turn, where the script reports them), microseconds; both calls' own
  medians.
- ``command_roundtrip``: the median empty command at n=2, spinning and not, and at n=1;
  the semaphore ping-pong beside it (the machine's wake-up floor).
- ``collectives``: the resident all-reduce of 4 bytes and of 64 MiB.
- ``scaling``: one SGD step of the MLP at n=2 (shuffled, all-reduce on) as a fraction
  of two independent plain programs; for a checkout with the sharded update also the
  unsharded step, which is what the older checkout runs.
- ``pymc_sampling``: one evaluation of the hierarchical model's log-density and gradient at
  10^4 rows, PyMC's own function at one BLAS thread over ``synkhronos.pymc``'s at n=2
  (above 1: synkhronos is faster). Needs PyMC: run the script with a Python that has
  it (``--only pymc_sampling``).
- ``pymc_parts``: six likelihoods of six lengths over 10^5 rows (its ``--movie``): one
  evaluation at n=2 and PyMC's, the commands an evaluation sends, and one chain of
  300 + 300 draws by ``synkhronos.pymc.sample(divide=True)`` and by ``pm.sample``
  (wall and sampling-loop seconds, leapfrog steps). Needs PyMC, and ``--scripts`` of
  a checkout whose ``pymc_parts.py`` has ``--movie``.

The JSON report also records the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _collectives_4b(d: dict) -> float:
    return _series_at(d, "synkhronos (resident)", 4)


def _collectives_64m(d: dict) -> float:
    return _series_at(d, "synkhronos (resident)", 64 << 20)


def _series_at(d: dict, series: str, nbytes: int) -> float:
    for point in d["series"][series]:
        if point["bytes"] == nbytes:
            return point["median_us"]
    raise KeyError(f"{series} has no {nbytes}-byte point")


def _pymc_speedup(d: dict) -> float:
    one = d["models"]["hierarchical"]["evaluations"]["10000"]
    return one["pymc_1_thread_s"] / one["synkhronos_s"]["2"]


def _movie(key: str, scale: float = 1.0):
    def read(d: dict) -> float:
        return round(d["movie"]["median"][key] * scale, 3)
    return read


def _headline(key: str):
    def read(d: dict) -> float | None:
        entry = d["headline"].get(key)
        return None if entry is None else entry["median"]
    return read


CEILING = "pytensor-1thread x2 independent"
BENCHMARKS: dict[str, tuple[list[str], dict]] = {
    "call_overhead": (["--calls", "3000"], {
        "overhead_numpy_input_us": lambda d: d["overhead_numpy_input_us"],
        "overhead_data_input_us": lambda d: d["overhead_data_input_us"],
        "plain_pytensor_median_us": lambda d: d["plain_pytensor_median_us"],
        "synk_numpy_input_median_us": lambda d: d["synk_numpy_input_median_us"],
        "repeated_overhead_numpy_input_us": lambda d: d["repeated_overhead_numpy_input_us"],
        "repeated_overhead_data_input_us": lambda d: d["repeated_overhead_data_input_us"],
        "two_sizes_overhead_numpy_input_us":
            lambda d: d.get("two_sizes_overhead_numpy_input_us"),
    }),
    "command_roundtrip": (["--rounds", "3000", "--blocks", "3"], {
        "n2_empty_command_us": lambda d: d["n2_ping_median_us"],
        "n2_nospin_empty_command_us": lambda d: d["n2_nospin_ping_median_us"],
        "n1_empty_command_us": lambda d: d["n1_ping_median_us"],
        "semaphore_pingpong_us": lambda d: d["semaphore_pingpong_median_us"],
    }),
    "collectives": (["--scale", "0.5", "--out", "{tmp}"], {
        "all_reduce_4B_us": _collectives_4b,
        "all_reduce_64MiB_us": _collectives_64m,
    }),
    "scaling": (["--no-torch", "--max-n", "2", "--rounds", "3", "--seconds", "1"], {
        "mlp_n2_fraction_of_ceiling": _headline(
            f"synk-2 scaled shuffled allreduce-on / {CEILING}"),
        "mlp_n2_unsharded_fraction_of_ceiling": _headline(
            f"synk-2 unsharded scaled shuffled allreduce-on / {CEILING}"),
    }),
    "pymc_sampling": (["--models", "hierarchical", "--rows", "10000", "--no-sampling",
                       "--sizes", "2", "--rounds", "3"], {
        "pymc_hierarchical_1e4_n2_over_pymc": _pymc_speedup,
    }),
    "pymc_parts": (["--movie", "--rounds", "1", "--calls", "300"], {
        "movie_n2_evaluation_us": _movie("ours_s", 1e6),
        "movie_pymc_evaluation_us": _movie("pymc_s", 1e6),
        "movie_n2_commands_per_evaluation": _movie("commands_per_evaluation"),
        "movie_n2_sample_wall_s": _movie("ours_sample_wall_s"),
        "movie_pm_sample_wall_s": _movie("pm_sample_wall_s"),
        "movie_n2_sample_sampling_s": _movie("ours_sample_sampling_s"),
        "movie_pm_sample_sampling_s": _movie("pm_sample_sampling_s"),
        "movie_n2_sample_leapfrog_steps": _movie("ours_sample_leapfrog_steps"),
        "movie_pm_sample_leapfrog_steps": _movie("pm_sample_leapfrog_steps"),
        "movie_n2_over_pm_sample_per_leapfrog_step":
            lambda d: d["movie"]["ours_over_pm_sample_per_leapfrog_step"],
    }),
}


def run_one(tree: Path, name: str, args: list[str], scripts: Path | None = None) -> dict:
    """Run ``benchmarks/<name>.py`` of ``scripts`` (default: ``tree``) with ``tree``'s
    package; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a.replace("{tmp}", tmp) for a in args]
        env = dict(os.environ, PYTHONPATH=str(tree))
        proc = subprocess.run(
            [sys.executable, str((scripts or tree) / "benchmarks" / f"{name}.py"), *argv],
            cwd=tree, env=env, capture_output=True, text=True, check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} in {tree} failed:\n{proc.stderr[-3000:]}")
    text = proc.stdout
    return json.loads(text[text.index("{"):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=",".join(
        name for name in BENCHMARKS if not name.startswith("pymc")))
    parser.add_argument("--scripts", type=Path, default=None,
                        help="run this checkout's benchmark scripts in both")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmarks {sorted(unknown)}; known: {sorted(BENCHMARKS)}")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    values: dict[str, dict[str, list]] = {}
    load_before = os.getloadavg()
    started = time.time()
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for name in names:
            script_args, metrics = BENCHMARKS[name]
            for side in order:
                record = run_one(trees[side], name, script_args,
                                 args.scripts.resolve() if args.scripts else None)
                for metric, read in metrics.items():
                    try:
                        value = read(record)
                    except KeyError:
                        value = None
                    values.setdefault(metric, {"before": [None] * args.rounds,
                                               "after": [None] * args.rounds})
                    values[metric][side][r] = value
            print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr)
    report: dict = {
        "benchmark": "compare_revisions",
        "trees": {side: str(path) for side, path in trees.items()},
        "scripts": str(args.scripts.resolve()) if args.scripts else "each checkout's own",
        "commits": {side: _commit(path) for side, path in trees.items()},
        "rounds": args.rounds,
        "seconds": round(time.time() - started, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "figures": {},
    }
    for metric, sides in values.items():
        pairs = [(b, a) for b, a in zip(sides["before"], sides["after"], strict=True)
                 if a is not None and b is not None]
        entry: dict = {side: _median(vals) for side, vals in sides.items()}
        entry["after_over_before"] = (
            round(statistics.median(a / b for b, a in pairs), 3) if pairs else None)
        entry["every_round"] = sides
        report["figures"][metric] = entry
    print(json.dumps(report, indent=1))


def _median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def _commit(tree: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


if __name__ == "__main__":
    main()
