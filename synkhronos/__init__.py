"""synkhronos: data-parallel PyTensor functions on every CPU core of a machine.

The front door: imports and ``__all__`` only.
"""

from . import steps
from .collectives import (
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
from .data import Data, data
from .distribute import distribute
from .errors import SynkhronosError, WorkerDiedError, WorkerError, WorkerTimeoutError
from .function import Function, function
from .lifecycle import close, device, fork, get_n_gpu, master_rank, n_parallel
from .profile import Profile, profile

__all__ = [
    "fork",
    "close",
    "n_parallel",
    "device",
    "master_rank",
    "get_n_gpu",
    "function",
    "Function",
    "distribute",
    "profile",
    "Profile",
    "data",
    "Data",
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
    "steps",
    "SynkhronosError",
    "WorkerError",
    "WorkerDiedError",
    "WorkerTimeoutError",
]

# The one place the version is written: pyproject.toml reads it from this line.
__version__ = "0.1.0"
