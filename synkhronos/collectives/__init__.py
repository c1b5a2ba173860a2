"""Collectives on shared variables: broadcast, scatter, gather, reduce and friends.

``api`` holds the public functions (validation in the master); ``backend`` the
protocol every device implements, its registry and the one ``COLLECTIVE`` command
handler; ``cpu`` the shared-memory backend. Importing this package registers them,
which must happen before ``synk.fork()`` (``import synkhronos`` does it).
"""

from . import cpu  # noqa: F401  (registers the "cpu" backend)
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
