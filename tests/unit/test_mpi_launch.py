"""Launch detection and the parts of the leaders' layer that need no MPI run."""

from __future__ import annotations

import sys
import types

import pytest

from synkhronos._machines import mpi
from synkhronos._machines.mpi import exchange


@pytest.mark.parametrize(
    "environ, kind, size, rank",
    [
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3"},
         "openmpi", 4, 3),
        ({"PMI_SIZE": "2", "PMI_RANK": "1"}, "mpich", 2, 1),
        ({"SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3",
          "SLURM_NTASKS": "8"}, "slurm", 3, 1),
        ({"SLURM_PROCID": "2", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}, "slurm", 4, 2),
        ({"PMIX_RANK": "5"}, "pmix", None, 5),
        ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}, "openmpi", 1, 0),
    ],
    ids=["openmpi", "mpich", "srun-step", "srun-ntasks", "pmix", "mpiexec-n1"],
)
def test_detects_each_launcher(environ, kind, size, rank):
    launch = mpi.detect_launch("auto", environ)
    assert (launch.kind, launch.size, launch.rank) == (kind, size, rank)
    assert launch.is_mpi
    assert launch.is_master == (rank == 0)


def test_sbatch_script_is_not_a_rank():
    # an sbatch script has SLURM_PROCID and SLURM_NTASKS but is no job step
    launch = mpi.detect_launch("auto", {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert not launch.is_mpi and launch.size == 1


def test_plain_process_is_local():
    launch = mpi.detect_launch("auto", {"HOME": "/root"})
    assert launch == mpi.Launch("local", 1, 0)
    assert not launch.is_mpi and launch.is_master


def test_local_ignores_the_launcher():
    environ = {"PMI_SIZE": "2", "PMI_RANK": "1"}
    assert not mpi.detect_launch("local", environ).is_mpi


def test_mpi_insists():
    assert mpi.detect_launch("mpi", {"PMI_SIZE": "2", "PMI_RANK": "0"}).size == 2
    with pytest.raises(RuntimeError, match="not started by an MPI launcher"):
        mpi.detect_launch("mpi", {})


def test_bad_launcher_and_bad_variables():
    with pytest.raises(ValueError, match="launcher must be one of 'auto', 'mpi', 'local'"):
        mpi.detect_launch("ssh", {})
    with pytest.raises(RuntimeError, match="PMI_SIZE should be an integer; got 'two'"):
        mpi.detect_launch("auto", {"PMI_SIZE": "two", "PMI_RANK": "0"})
    with pytest.raises(RuntimeError, match="rank 2 of 2 processes"):
        mpi.detect_launch("auto", {"PMI_SIZE": "2", "PMI_RANK": "2"})


def test_chunk_bounds_follow_the_row_rule():
    assert mpi.chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert mpi.chunk_bounds(1, 3) == [(0, 1), (1, 1), (1, 1)]
    assert mpi.chunk_bounds(0, 2) == [(0, 0), (0, 0)]


def test_ops_are_named_in_errors():
    assert exchange._op_name("SUM") == "sum"
    assert exchange._op_name(types.SimpleNamespace(value="max")) == "max"
    with pytest.raises(ValueError, match="'avg' is 'sum' divided by the caller"):
        exchange._op_name("avg")


def test_missing_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(mpi.MPIUnavailableError, match=r"pip install 'synkhronos\[mpi\]'"):
        mpi.start(1)


def test_mpi_started_before_fork_is_refused(monkeypatch):
    started = types.SimpleNamespace(Is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", started)
    with pytest.raises(RuntimeError, match="MPI was initialised before synk.fork"):
        mpi.check_not_initialized()
    monkeypatch.setitem(sys.modules, "mpi4py.MPI",
                        types.SimpleNamespace(Is_initialized=lambda: False))
    mpi.check_not_initialized()


def test_array_headers_round_trip():
    import numpy as np

    for array in (np.zeros((2, 3), np.float32), np.arange(5, dtype=">i8"),
                  np.ones(0, np.complex128), np.float16(1.5).reshape(())):
        dtype, shape = exchange._dtype_shape(exchange._describe(array))
        assert (dtype, shape) == (array.dtype, array.shape)
    with pytest.raises(TypeError, match="plain numeric dtype"):
        exchange._describe(np.zeros(2, object))
