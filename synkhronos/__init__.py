"""synkhronos: data-parallel PyTensor functions on every CPU core (or GPU) of a machine."""

from .errors import SynkhronosError, WorkerDiedError, WorkerError, WorkerTimeoutError
from .session import close, device, fork, master_rank, n_parallel

__all__ = [
    "fork",
    "close",
    "n_parallel",
    "device",
    "master_rank",
    "SynkhronosError",
    "WorkerError",
    "WorkerDiedError",
    "WorkerTimeoutError",
]

__version__ = "0.1.0"
