"""Collectives on shared variables: broadcast, scatter, gather, reduce and friends.

``api`` holds the public functions and ``_checks`` their checks in the master;
``fused`` the messages, steps and each rank's part, the same on every backend;
``backend`` the interface every backend implements and the factory that picks one per
process; the backends: ``cpu`` (shared memory), ``hierarchy`` (several machines: wraps
``cpu``), ``staged`` (device values through shared memory) and ``nccl`` (device values
through NCCL, when each process has its own GPU). Importing them here registers them.
"""

from . import cpu, nccl, staged  # noqa: F401  (the backends register themselves)
from .api import (
    all_gather,
    all_reduce,
    broadcast,
    gather,
    get_lengths,
    get_shapes,
    get_value,
    reduce,
    scatter,
    set_value,
)

__all__ = [
    "broadcast",
    "scatter",
    "gather",
    "all_gather",
    "reduce",
    "all_reduce",
    "set_value",
    "get_value",
    "get_lengths",
    "get_shapes",
]
