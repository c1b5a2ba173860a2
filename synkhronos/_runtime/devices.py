"""What hardware a session can use: usable CPU cores, and whether a GPU path exists.

``fork(device="gpu")`` must not initialise CUDA in the master (a forked child of a
CUDA or JAX process hangs), so GPU availability is judged from the driver's files and
from which packages are installed, without importing them.
"""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["usable_cores", "visible_gpus", "gpu_problem", "jax_initialised"]


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


def gpu_problem() -> str | None:
    """Why ``device="gpu"`` cannot run here, or None if the pieces are present."""
    missing = [m for m in ("jax", "cupy") if importlib.util.find_spec(m) is None]
    if missing:
        return (
            f"device='gpu' needs {' and '.join(missing)} (install synkhronos[gpu])"
        )
    if visible_gpus() == 0:
        return "device='gpu' found no visible NVIDIA GPU (no /proc/driver/nvidia/gpus)"
    return None


def jax_initialised() -> bool:
    """True if JAX has started a backend in this process (forking would then hang)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(bridge is not None and getattr(bridge, "_backends", None))
