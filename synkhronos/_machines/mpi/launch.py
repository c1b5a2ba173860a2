"""Whether this process was started by an MPI launcher, read from the environment only.

This module owns launch detection (SPEC section 8, ``fork(launcher=...)``). It never
imports mpi4py and never initialises MPI: the node leader must fork its local workers
*before* ``MPI_Init``, so the decision "are we one machine among several?" has to come
from the variables the launcher put into the environment:

==============================  ========================================================
launcher                        variables read (size, rank)
==============================  ========================================================
Open MPI ``mpiexec``/``mpirun``  ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_RANK``
MPICH / Hydra (Intel MPI too)    ``PMI_SIZE``, ``PMI_RANK``
Slurm ``srun`` (a job step)      ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``),
                                 ``SLURM_PROCID``; only when ``SLURM_STEP_ID`` is set,
                                 so an ``sbatch`` script itself is not taken for a rank
PMIx alone                       ``PMIX_RANK``; the size is unknown until MPI starts
==============================  ========================================================

Checked in that order: ``srun --mpi=pmix`` sets both Slurm's and PMIx's variables, and
Open MPI's ``mpiexec`` sets PMIx's too; the first match gives the most complete answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["Launch", "LAUNCHERS", "detect_launch"]

LAUNCHERS = ("auto", "mpi", "local")

_LOCAL_NAME = "local"


@dataclass(frozen=True)
class Launch:
    """How this process was started.

    Attributes
    ----------
    kind : str
        ``"openmpi"``, ``"mpich"``, ``"slurm"``, ``"pmix"`` for an MPI launch, or
        ``"local"`` when the process runs alone (or ``launcher="local"`` asked so).
    size : int or None
        Number of MPI ranks (machines) in the job; None when only PMIx's rank is known
        (then it is known once MPI is initialised). 1 for a local launch.
    rank : int
        This process's MPI rank: 0 is the master's machine.
    """

    kind: str
    size: int | None
    rank: int

    @property
    def is_mpi(self) -> bool:
        """True when an MPI launcher started this process (even ``mpiexec -n 1``)."""
        return self.kind != _LOCAL_NAME

    @property
    def is_master(self) -> bool:
        """True on the master's machine (MPI rank 0, or any local launch)."""
        return self.rank == 0


LOCAL = Launch(_LOCAL_NAME, 1, 0)


def _int(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        number = int(value)
    except ValueError:
        raise RuntimeError(
            f"the MPI launcher's variable {name} should be an integer; got {value!r}"
        ) from None
    if number < 0:
        raise RuntimeError(f"the MPI launcher's variable {name} is negative: {number}")
    return number


def _from_environment(environ: Mapping[str, str]) -> Launch | None:
    if "OMPI_COMM_WORLD_SIZE" in environ and "OMPI_COMM_WORLD_RANK" in environ:
        return Launch("openmpi", _int(environ, "OMPI_COMM_WORLD_SIZE"),
                      _int(environ, "OMPI_COMM_WORLD_RANK"))
    if "PMI_SIZE" in environ and "PMI_RANK" in environ:
        return Launch("mpich", _int(environ, "PMI_SIZE"), _int(environ, "PMI_RANK"))
    if "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ:
        for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
            if name in environ:
                return Launch("slurm", _int(environ, name), _int(environ, "SLURM_PROCID"))
    if "PMIX_RANK" in environ:
        return Launch("pmix", None, _int(environ, "PMIX_RANK"))
    return None


def detect_launch(launcher: Literal["auto", "mpi", "local"] = "auto",
                  environ: Mapping[str, str] | None = None) -> Launch:
    """Tell from the environment whether an MPI launcher started this process.

    Parameters
    ----------
    launcher : {"auto", "mpi", "local"}
        ``"auto"``: an MPI launch if the launcher's variables are present, else local.
        ``"mpi"``: insist on an MPI launch (``RuntimeError`` if none is found).
        ``"local"``: ignore the variables; this machine runs alone.
    environ : mapping, optional
        The environment to read (default ``os.environ``); tests pass their own.

    Returns
    -------
    Launch
        ``kind``, ``size`` and ``rank``; MPI is not initialised.

    Raises
    ------
    ValueError
        If ``launcher`` is not one of the three names.
    RuntimeError
        If ``launcher="mpi"`` and no launcher's variables are found, or they are not
        integers, or the rank is not below the size.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(map(repr, LAUNCHERS))}; "
                         f"got {launcher!r}")
    if launcher == "local":
        return LOCAL
    found = _from_environment(os.environ if environ is None else environ)
    if found is None:
        if launcher == "mpi":
            raise RuntimeError(
                "launcher='mpi' but this process was not started by an MPI launcher "
                "(none of OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_PROCID with SLURM_STEP_ID, "
                "PMIX_RANK is set); start the script with mpiexec or srun, or use "
                "launcher='auto'"
            )
        return LOCAL
    if found.size is not None and (found.size < 1 or found.rank >= found.size):
        raise RuntimeError(f"the {found.kind} launcher says rank {found.rank} of "
                           f"{found.size} processes, which is impossible")
    return found
