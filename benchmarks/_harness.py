"""What the benchmark scripts share: the machine's description, idle time, timing
summaries and writing a report.

Each script used to carry its own copy of these (issue 25 asks for one harness); the
scripts that import this module are ``collectives.py``, ``scaling.py``,
``pymc_sampling.py``, ``call_overhead.py``, ``command_roundtrip.py`` and
``device_check.py``. It imports nothing heavy (no PyTensor,
no JAX), so a driver that must stay free of JAX can use it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

__all__ = ["cpu_model", "machine", "idle_percent", "load", "rounds_summary",
           "rounded", "peers_per_epoch",
           "summarize_times", "versions", "write_report"]


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load() -> list[float]:
    """The load averages over 1, 5 and 15 minutes, rounded."""
    return [round(v, 2) for v in os.getloadavg()]


def machine(**extra) -> dict:
    """This machine: CPU model, usable cores, memory, OS, Python, numpy, load; plus
    ``extra``."""
    memory = None
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            line = next(line for line in f if line.startswith("MemTotal"))
        memory = round(int(line.split()[1]) / 2**20, 1)
    return {"cpu": cpu_model(), "usable_cores": len(os.sched_getaffinity(0)),
            "cpu_count": os.cpu_count(), "memory_gib": memory,
            "platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "load": load(), **extra}


def versions(*names: str) -> dict[str, str | None]:
    """The installed version of each distribution (None when absent), without importing."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def idle_percent(seconds: float = 0.5) -> float:
    """How idle all CPUs were over ``seconds`` (from /proc/stat), in percent."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]

    total, idle = sample()
    time.sleep(seconds)
    total2, idle2 = sample()
    return round(100.0 * (idle2 - idle) / max(1, total2 - total), 1)


def summarize_times(times: list[float], nbytes: int | None = None) -> dict:
    """Median, 10th and 90th percentiles of ``times`` (seconds) in microseconds; with
    ``nbytes``, also the bytes, float32 elements and GB/s at the median."""
    median = float(np.median(times))
    out: dict = {}
    if nbytes is not None:
        out.update(bytes=nbytes, elements=nbytes // 4)
    out.update(trials=len(times), median_us=median * 1e6,
               p10_us=float(np.percentile(times, 10)) * 1e6,
               p90_us=float(np.percentile(times, 90)) * 1e6,
               p99_us=float(np.percentile(times, 99)) * 1e6)
    if nbytes is not None:
        out["GB_per_s"] = nbytes / median / 1e9
    return out


def rounds_summary(rounds: list[list[float]]) -> dict:
    """Timings taken in interleaved rounds (seconds, one list per round): the median
    and p99 over every timing, and each round's median, in microseconds."""
    every = [t for one in rounds for t in one]
    return {"median_us": round(float(np.median(every)) * 1e6, 2),
            "p99_us": round(float(np.percentile(every, 99)) * 1e6, 2),
            "round_medians_us": [round(float(np.median(one)) * 1e6, 2) for one in rounds]}


def write_report(report: dict, out: Path | str, name: str) -> Path:
    """Write ``report`` as ``out/name`` (indented JSON); return the path."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return path


def rounded(entry: dict) -> dict:
    """A profile's entry with its floats to 5 decimals, for a report."""
    return {key: round(value, 5) if isinstance(value, float) else value
            for key, value in entry.items()}


def peers_per_epoch(times: dict[str, list[float]], minibatches: int,
                    against: str = "serial") -> tuple[dict, dict]:
    """Training peers timed in interleaved rounds (``times``: seconds per epoch, per
    round, by peer): each peer's median epoch and minibatch, and each other peer's
    per-round speed-up over ``against`` with its median."""
    peers = {}
    for name, seconds in times.items():
        per_epoch = float(np.median(seconds))
        peers[name] = {"s_per_epoch_median": round(per_epoch, 4),
                       "s_per_minibatch_median": round(per_epoch / minibatches, 5),
                       "s_per_epoch_rounds": [round(t, 4) for t in seconds]}
    ratios = {}
    for name in times:
        if name != against:
            per_round = [s / p for s, p in zip(times[against], times[name], strict=True)]
            ratios[name] = {"median": round(float(np.median(per_round)), 3),
                            "rounds": [round(v, 3) for v in per_round]}
    return peers, ratios
