"""The environment report and the self-check behind ``python -m synkhronos`` (SPEC 10).

This module owns what the command line knows about a machine; ``__main__`` only parses
the arguments and prints.

- :func:`gather` reads, without forking and without initialising MPI or CUDA: the
  versions (synkhronos, Python, PyTensor and its default linker, numpy and the BLAS
  libraries loaded, PyMC and the other optional packages, mpi4py and its MPI library),
  the CPU (usable cores, the cgroup quota, SMT siblings), ``/dev/shm``, the NVIDIA GPUs
  the driver lists, the MPI launcher named by the environment, and what ``fork()``
  would choose here. A probe that fails is reported as ``{"error": ...}`` in its
  section; the report itself never raises.
- :func:`check` forks a session, runs a small function and an ``all_reduce``, compares
  both with numpy, closes, and returns the times and every problem found.
- :func:`format_report` and :func:`format_check` render both as text.

The MPI library's version comes from a child interpreter: importing ``mpi4py.MPI`` here
would load the library into a process that may fork next, which ``fork()`` refuses.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from . import lifecycle
from ._machines import mpi
from ._runtime import devices

__all__ = ["gather", "check", "format_report", "format_check", "OPTIONAL_PACKAGES"]

# Packages some part of synkhronos uses when present: versions are read from their
# metadata, never by importing them (PyMC and JAX take seconds, JAX may start a backend).
OPTIONAL_PACKAGES = ("pymc", "nutpie", "arviz", "jax", "jaxlib", "cupy", "mpi4py")
# CuPy is published under one name per CUDA major version
_CUPY_NAMES = ("cupy-cuda13x", "cupy-cuda12x", "cupy")

_MPI_PROBE = (
    "import mpi4py\n"
    "mpi4py.rc.initialize = False\n"
    "mpi4py.rc.finalize = False\n"
    "from mpi4py import MPI\n"
    "print(MPI.Get_library_version().strip(chr(0)).strip())\n"
)
_GPU_DRIVER = "/proc/driver/nvidia/gpus"
_SHM = "/dev/shm"


def _guarded(probe: Callable[[], Any]) -> Any:
    """``probe()``, or ``{"error": ...}`` if it raised: one broken probe spoils nothing."""
    try:
        return probe()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _synkhronos() -> dict[str, Any]:
    from . import __version__

    return {"version": __version__, "path": os.path.dirname(os.path.abspath(__file__))}


def _python() -> dict[str, Any]:
    return {"version": platform.python_version(), "executable": sys.executable,
            "platform": platform.platform()}


def _pytensor() -> dict[str, Any]:
    import pytensor
    from pytensor.compile.mode import get_default_mode

    mode = get_default_mode()
    return {
        "version": pytensor.__version__,
        "mode": str(pytensor.config.mode),
        "linker": str(pytensor.config.linker),
        # what "auto" resolves to: NumbaLinker on PyTensor 3, the C VM on 2.x
        "default_linker": type(mode.linker).__name__,
        "c_compiler": str(pytensor.config.cxx) or None,
    }


def _numpy() -> dict[str, Any]:
    from threadpoolctl import threadpool_info

    blas = [
        {key: info.get(key) for key in
         ("internal_api", "version", "threading_layer", "num_threads", "filepath")}
        for info in threadpool_info()
    ]
    return {"version": np.__version__, "threadpools": blas}


def _packages() -> dict[str, str | None]:
    found = {name: _version(name) for name in OPTIONAL_PACKAGES if name != "cupy"}
    found["cupy"] = next((f"{version} ({name})" for name in _CUPY_NAMES
                          if (version := _version(name)) is not None), None)
    return found


def _mpi() -> dict[str, Any]:
    version = _version("mpi4py")
    if version is None:
        return {"mpi4py": None, "library": None}
    probe = subprocess.run([sys.executable, "-c", _MPI_PROBE], capture_output=True,
                           text=True, timeout=60, check=False)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return {"mpi4py": version, "library": None,
                "error": f"mpi4py could not load its MPI library: {last}"}
    return {"mpi4py": version, "library": probe.stdout.strip().splitlines()[0]}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup_quota(root: str = "/sys/fs/cgroup",
                  membership: str = "/proc/self/cgroup") -> float | None:
    """CPUs this process's cgroup may use per period (None: no quota set).

    cgroup v2's ``cpu.max`` ("quota period" or "max period"), else v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none), at the process's own
    cgroup path first, then at the mount's root (what a container sees).
    """
    paths: dict[str, str] = {}
    for line in (_read(membership) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0":
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    for base in (paths.get("v2"), "/"):
        if base is None:
            continue
        text = _read(os.path.join(root, base.lstrip("/"), "cpu.max"))
        if text:
            quota, _, period = text.partition(" ")
            return None if quota == "max" else int(quota) / int(period or 100000)
    for base in (paths.get("v1"), "/"):
        if base is None:
            continue
        folder = os.path.join(root, "cpu", base.lstrip("/"))
        quota_us, period_us = (_read(os.path.join(folder, name))
                               for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        if quota_us is not None and period_us:
            return None if int(quota_us) < 0 else int(quota_us) / int(period_us)
    return None


def _cpu() -> dict[str, Any]:
    cores = devices.usable_cores()
    siblings: dict[str, list[int]] = {}
    for core in cores:
        text = _read(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list")
        if text is not None:
            siblings[str(core)] = _cpu_list(text)
    physical = {tuple(s) for s in siblings.values()}
    return {
        "usable_cores": cores,
        "n_usable": len(cores),
        "online": os.cpu_count(),
        "cgroup_quota": _cgroup_quota(),
        # cores that share a physical core with another usable core (hyper-threads)
        "physical_cores": len(physical) if siblings else None,
        "smt_siblings": {core: s for core, s in siblings.items() if len(s) > 1},
        "smt_active": _read("/sys/devices/system/cpu/smt/active") == "1",
    }


def _cpu_list(text: str) -> list[int]:
    """The kernel's CPU list format ("0-3,8,10-11") as numbers."""
    found: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        found += range(int(first), int(last or first) + 1)
    return found


def _shm() -> dict[str, Any]:
    stat = os.statvfs(_SHM)
    return {"path": _SHM, "size_bytes": stat.f_frsize * stat.f_blocks,
            "free_bytes": stat.f_frsize * stat.f_bavail}


def _gpus() -> dict[str, Any]:
    names = []
    if os.path.isdir(_GPU_DRIVER):
        for bus in sorted(os.listdir(_GPU_DRIVER)):
            info = _read(os.path.join(_GPU_DRIVER, bus, "information")) or ""
            model = next((line.partition(":")[2].strip() for line in info.splitlines()
                          if line.startswith("Model:")), "unknown model")
            names.append(f"{model} ({bus})")
    return {
        "visible": devices.visible_gpus(),
        "driver_lists": names,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "platform": devices.gpu_platform(),  # "cpu": SYNKHRONOS_GPU_PLATFORM's stand-in
        "gpu_path": devices.gpu_problem() or (
            "ready: JAX's CPU platform stands in for GPUs" if devices.gpu_platform() == "cpu"
            else "ready: jax, cupy and a GPU are present"),
        "n_parallel_gpu": n_parallel_from_gpu(),
    }


def n_parallel_from_gpu() -> int:
    """What ``fork(device="gpu")`` would start: ``SYNK_N_PARALLEL``, else one process
    per visible GPU (on the stand-in, per usable core)."""
    return lifecycle.n_parallel_from_environment(devices.device_count())


def _launcher() -> dict[str, Any]:
    launch = mpi.detect_launch("auto")
    return {"kind": launch.kind, "size": launch.size, "rank": launch.rank,
            "several_machines": launch.is_mpi and launch.size != 1}


def _fork_choice() -> dict[str, Any]:
    cores = devices.usable_cores()
    n = lifecycle.n_parallel_from_environment(len(cores))
    source = "SYNK_N_PARALLEL" if os.environ.get("SYNK_N_PARALLEL", "").strip() else (
        "usable cores")
    return {
        "n_parallel": n,
        "n_parallel_from": source,
        "device": "cpu",
        # fork()'s rule: spin only when every process has a core of its own
        "spin_seconds": lifecycle._DEFAULT_SPIN if n <= len(cores) else 0.0,
        "timeout": os.environ.get("SYNK_TIMEOUT") or None,
        "reduction": os.environ.get("SYNK_REDUCTION") or "fast",
    }


_SECTIONS: dict[str, Callable[[], Any]] = {
    "synkhronos": _synkhronos,
    "python": _python,
    "pytensor": _pytensor,
    "numpy": _numpy,
    "packages": _packages,
    "mpi": _mpi,
    "cpu": _cpu,
    "shm": _shm,
    "gpus": _gpus,
    "launcher": _launcher,
    "fork": _fork_choice,
}


def gather() -> dict[str, Any]:
    """The environment report: one dict of sections, each a dict (JSON-serialisable).

    Returns
    -------
    dict
        Keys ``synkhronos``, ``python``, ``pytensor``, ``numpy``, ``packages``,
        ``mpi``, ``cpu``, ``shm``, ``gpus``, ``launcher``, ``fork``; a section whose
        probe failed holds ``{"error": "..."}`` instead.
    """
    return {name: _guarded(probe) for name, probe in _SECTIONS.items()}


def check(n_parallel: int | None = None, rows: int = 1001, columns: int = 7) -> dict[str, Any]:
    """Fork a session, run a function and an all-reduce, compare with numpy, close.

    Collective: forks ``n_parallel`` processes (default: what ``fork()`` chooses,
    ``SYNK_N_PARALLEL`` included) and closes them before returning.

    Parameters
    ----------
    n_parallel : int, optional
        Processes to fork.
    rows, columns : int
        Size of the scattered input (1001 rows split unevenly over most counts).

    Returns
    -------
    dict
        ``ok`` (bool), ``n_parallel``, ``seconds`` (fork, build, distribute, call,
        all_reduce, close), and ``problems``: one sentence per wrong result, or the
        exception (with its traceback) that stopped the check.
    """
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    seconds: dict[str, float] = {}
    problems: list[str] = []
    result: dict[str, Any] = {"ok": False, "n_parallel": None, "seconds": seconds,
                              "problems": problems}
    clock = time.perf_counter
    rng = np.random.default_rng(0)
    x_value = rng.standard_normal((rows, columns))
    w_value = rng.standard_normal((columns, 3))

    def compare(what: str, got: Any, expected: np.ndarray) -> None:
        if not np.allclose(got, expected, rtol=1e-10, atol=1e-12):
            difference = np.max(np.abs(np.asarray(got) - expected))
            problems.append(f"{what} differs from numpy by up to {difference:.3g}")

    start = clock()
    try:
        n = synk.fork(n_parallel)
    except Exception:
        problems.append("synk.fork() failed:\n" + traceback.format_exc())
        return result
    result["n_parallel"] = n
    seconds["fork"] = clock() - start
    try:
        start = clock()
        x = pt.matrix("x", dtype="float64")
        w = pytensor.shared(w_value, name="w")
        z = x.dot(w)
        f = synk.function(inputs=[x], outputs=[z.mean(axis=0), (z.sum(axis=0), "sum"),
                                                (z.max(), "max")])
        seconds["build"] = clock() - start
        start = clock()
        synk.distribute()
        seconds["distribute"] = clock() - start
        start = clock()
        mean, total, largest = f(x_value)
        seconds["call"] = clock() - start
        full = x_value.dot(w_value)
        compare("the function's 'avg' output", mean, full.mean(axis=0))
        compare("the function's 'sum' output", total, full.sum(axis=0))
        compare("the function's 'max' output", largest, full.max())
        for rank in range(n):
            synk.set_value(rank, w, w_value + rank)
        start = clock()
        synk.all_reduce(w, op="sum")
        seconds["all_reduce"] = clock() - start
        expected = n * w_value + n * (n - 1) / 2
        for rank in range(n):
            compare(f"all_reduce(op='sum') on rank {rank}", synk.get_value(rank, w), expected)
    except Exception:
        problems.append("the check stopped:\n" + traceback.format_exc())
    finally:
        start = clock()
        try:
            synk.close()
        except Exception:
            problems.append("synk.close() failed:\n" + traceback.format_exc())
        seconds["close"] = clock() - start
    result["ok"] = not problems
    return result


def _size(n_bytes: int) -> str:
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _line(label: str, value: Any) -> str:
    return f"  {label + ':':<22}{value}"


def format_report(report: dict[str, Any]) -> str:
    """The report as lines of text, one section after another."""
    lines = []
    for name, section in report.items():
        lines.append(f"{name}:")
        if isinstance(section, dict) and set(section) == {"error"}:
            lines.append(_line("error", section["error"]))
        elif name == "numpy":
            lines.append(_line("version", section["version"]))
            for pool in section["threadpools"]:
                lines.append(_line(pool["internal_api"], (
                    f"{pool['version']} ({pool['threading_layer']}, "
                    f"{pool['num_threads']} threads) {pool['filepath']}")))
        elif name == "shm":
            lines.append(_line(section["path"], f"{_size(section['size_bytes'])}, "
                                                f"{_size(section['free_bytes'])} free"))
        else:
            for key, value in section.items():
                if isinstance(value, (dict, list)):
                    value = json.dumps(value)
                lines.append(_line(key, "-" if value is None else value))
    return "\n".join(lines)


def format_check(result: dict[str, Any]) -> str:
    """The check's outcome as lines of text."""
    verdict = "passed" if result["ok"] else "FAILED"
    lines = [f"check: {verdict} (n_parallel={result['n_parallel']})"]
    lines += [_line(step, f"{1e3 * value:.1f} ms") for step, value in result["seconds"].items()]
    lines += [f"  problem: {problem}" for problem in result["problems"]]
    return "\n".join(lines)
