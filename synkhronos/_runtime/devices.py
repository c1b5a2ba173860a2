"""What hardware a session can use: cores, GPUs, and what device sessions inherit.

``fork(device="gpu")`` must not initialise CUDA in the master (a forked child of a
CUDA or JAX process hangs), so GPU availability is judged from the driver's files and
from which packages are installed, without importing them. Each process is bound to
its GPU through the environment, which CUDA and JAX read when they start, after the
fork (``prepare_gpu`` chooses the GPUs; ``placement.JaxPlacement.bind`` binds).

Without a GPU, ``SYNKHRONOS_GPU_PLATFORM=cpu`` makes ``device="gpu"`` run the same
path on JAX's CPU platform (the stand-in for tests and CI): one "device" per process,
each process's XLA limited to one thread, as BLAS is for ``device="cpu"``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable

__all__ = [
    "usable_cores",
    "visible_gpus",
    "gpu_problem",
    "jax_initialised",
    "gpu_platform",
    "device_count",
    "prepare_gpu",
    "saved_environment",
    "GPU_PLATFORM_ENV",
]

GPU_PLATFORM_ENV = "SYNKHRONOS_GPU_PLATFORM"
_PLATFORMS = ("cuda", "cpu")
# what a device session sets in the master's environment (``prepare_gpu``, and
# ``placement.JaxPlacement.bind`` for the master's own GPU)
_SESSION_ENV = ("JAX_PLATFORMS", "XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE",
                "CUDA_VISIBLE_DEVICES")


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (respects affinity masks and cgroups)."""
    return sorted(os.sched_getaffinity(0))


def visible_gpus() -> int:
    """GPUs the driver lists, limited by ``CUDA_VISIBLE_DEVICES`` (CUDA not touched)."""
    driver = "/proc/driver/nvidia/gpus"
    count = len(os.listdir(driver)) if os.path.isdir(driver) else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        count = min(count, len(ids))
    return count


def gpu_platform() -> str:
    """``"cuda"``, or ``"cpu"`` when ``SYNKHRONOS_GPU_PLATFORM=cpu`` asks for the stand-in.

    Raises
    ------
    ValueError
        The variable holds anything else.
    """
    platform = os.environ.get(GPU_PLATFORM_ENV, "").strip().lower() or "cuda"
    if platform not in _PLATFORMS:
        raise ValueError(
            f"{GPU_PLATFORM_ENV} must be 'cpu' (JAX's CPU platform standing in for GPUs) "
            f"or 'cuda'; got {os.environ[GPU_PLATFORM_ENV]!r}"
        )
    return platform


def gpu_problem() -> str | None:
    """Why ``device="gpu"`` cannot run here, or None if the pieces are present."""
    platform = gpu_platform()
    needed = ("jax",) if platform == "cpu" else ("jax", "cupy")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        return (
            f"device='gpu' needs {' and '.join(missing)} (install synkhronos[gpu]"
            + (", or jax alone for the CPU stand-in)" if platform == "cpu" else ")")
        )
    if platform == "cuda" and visible_gpus() == 0:
        return (
            "device='gpu' found no visible NVIDIA GPU (no /proc/driver/nvidia/gpus, or "
            f"CUDA_VISIBLE_DEVICES hides them); without a GPU, {GPU_PLATFORM_ENV}=cpu runs "
            "the same path on JAX's CPU platform"
        )
    return None


def device_count() -> int:
    """Processes ``fork(device="gpu")`` starts by default: one per visible GPU (on the
    stand-in, one per usable core)."""
    return len(usable_cores()) if gpu_platform() == "cpu" else visible_gpus()


def _gpu_ids() -> list[str]:
    """The ids of the visible GPUs, as ``CUDA_VISIBLE_DEVICES`` names them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return [str(i) for i in range(visible_gpus())]


def prepare_gpu(n_processes: int) -> list[str]:
    """The master, before forking a device session: the environment every process
    inherits (JAX's platform; on the stand-in one XLA thread; no up-front allocation of
    most of a GPU's memory when processes share one). Returns the GPU id of each local
    rank (empty on the stand-in), for ``bind_gpu``."""
    platform = gpu_platform()
    os.environ["JAX_PLATFORMS"] = platform
    if platform == "cpu":
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = (
                flags + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
            ).strip()
        return []
    ids = _gpu_ids()
    if n_processes > len(ids):  # processes share a GPU: each takes memory as it needs it
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return [ids[rank % len(ids)] for rank in range(n_processes)]



def saved_environment() -> Callable[[], None]:
    """What puts back, when the session closes, the variables a device session sets in
    the master (set as they were, or removed): programs the user starts afterwards
    must see every GPU and the platform they would have seen."""
    before = {name: os.environ.get(name) for name in _SESSION_ENV}

    def restore() -> None:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore


def jax_initialised() -> bool:
    """True if JAX has started a backend in this process (forking would then hang)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(bridge is not None and getattr(bridge, "_backends", None))
