"""The NCCL layer (``synkhronos._runtime.nccl``) on device arrays: one-rank communicators.

A one-rank communicator is real NCCL: its collectives become device copies, so the
fusing of a list by dtype, the DLPack hand-over between JAX and CuPy and the results'
shapes are all exercised on one GPU. Several ranks need a GPU each (NCCL refuses two
ranks on one device): ``benchmarks/device_check.py`` probes that where it can.
Nothing here forks.
"""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos._runtime import devices, nccl

if nccl.available() is not None or devices.visible_gpus() == 0:
    pytest.skip("needs CUDA GPUs (CuPy with NCCL, and a visible NVIDIA GPU)",
                allow_module_level=True)

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture(scope="module")
def comm():
    communicator = nccl.Communicator(1, 0, nccl.unique_id())
    yield communicator
    communicator.close()


def _values():
    return [jnp.arange(7, dtype=jnp.float32), jnp.ones((2, 3), dtype=jnp.float64) * 2,
            jnp.arange(4, dtype=jnp.int32).reshape(2, 2)]


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
def test_one_rank_all_reduce_is_the_identity(comm, op):
    values = _values()
    if op == "avg":  # a mean of integers is not an integer (the public API refuses it)
        values = [v for v in values if jnp.issubdtype(v.dtype, jnp.floating)]
    results = comm.all_reduce(values, op)
    for value, result in zip(values, results, strict=True):
        assert result.shape == value.shape and result.dtype == value.dtype
        np.testing.assert_array_equal(np.asarray(result), np.asarray(value))


def test_one_rank_broadcast_keeps_the_values(comm):
    values = _values()
    for value, result in zip(values, comm.broadcast(values, 0), strict=True):
        np.testing.assert_array_equal(np.asarray(result), np.asarray(value))


def test_results_are_new_arrays(comm):
    """JAX arrays never change in place: the inputs stay as they were, the results do
    not share their buffers."""
    values = _values()
    before = [np.array(v) for v in values]
    results = comm.all_reduce(values, "sum")
    results[0] = results[0] + 1
    for value, copy in zip(values, before, strict=True):
        np.testing.assert_array_equal(np.asarray(value), copy)


def test_bad_op_is_refused(comm):
    with pytest.raises(ValueError, match="op must be one of"):
        comm.all_reduce(_values(), "mean")


def test_avg_of_integers_is_refused_before_nccl_runs(comm):
    with pytest.raises(TypeError, match="'avg' needs floating-point values; got int32"):
        comm.all_reduce(_values(), "avg")
