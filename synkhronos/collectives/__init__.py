"""Collectives on shared variables: broadcast, scatter, gather, reduce and friends.

``api`` holds the public functions and ``_checks`` their checks in the master;
``fused`` the device-independent messages, steps and each rank's part; ``backend`` the
primitives every device implements; ``cpu`` the shared-memory backend and ``staged``
the same exchange for device values (imported here, which registers them for
``device="cpu"`` and ``device="gpu"``).
"""

from . import cpu, staged  # noqa: F401  (the backends register themselves)
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
