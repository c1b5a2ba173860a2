"""synkhronos: data-parallel PyTensor functions on every CPU core (or GPU) of a machine."""

from .data import Data, data
from .distribute import distribute
from .errors import SynkhronosError, WorkerDiedError, WorkerError, WorkerTimeoutError
from .function import Function, function
from .session import close, device, fork, master_rank, n_parallel

__all__ = [
    "fork",
    "close",
    "n_parallel",
    "device",
    "master_rank",
    "function",
    "Function",
    "distribute",
    "data",
    "Data",
    "SynkhronosError",
    "WorkerError",
    "WorkerDiedError",
    "WorkerTimeoutError",
]

__version__ = "0.1.0"
