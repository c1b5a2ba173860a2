"""Choosing and binding devices (``_runtime/devices.py``, ``_runtime/placement.py``).

Nothing here forks or starts JAX: the environment is patched, and the device library's
one call (``jax.device_put``) is replaced by a stand-in where a test needs it.
"""

from __future__ import annotations

import os

import numpy as np
import pytensor
import pytest

from synkhronos._runtime import devices, placement


@pytest.fixture
def env(monkeypatch):
    """The variables ``prepare_gpu`` and ``bind`` write, restored after the test."""
    for name in ("SYNKHRONOS_GPU_PLATFORM", "JAX_PLATFORMS", "XLA_FLAGS",
                 "XLA_PYTHON_CLIENT_PREALLOCATE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("value, platform", [(None, "cuda"), ("cpu", "cpu"), (" CPU ", "cpu"),
                                             ("cuda", "cuda"), ("", "cuda")])
def test_gpu_platform_reads_the_variable(env, value, platform):
    if value is not None:
        env.setenv("SYNKHRONOS_GPU_PLATFORM", value)
    assert devices.gpu_platform() == platform


def test_unknown_gpu_platform_is_refused_naming_the_variable(env):
    env.setenv("SYNKHRONOS_GPU_PLATFORM", "tpu")
    with pytest.raises(ValueError, match="SYNKHRONOS_GPU_PLATFORM must be 'cpu'.*got 'tpu'"):
        devices.gpu_problem()


def test_no_gpu_names_the_stand_in(env):
    env.setattr(devices, "visible_gpus", lambda: 0)
    env.setattr(devices.importlib.util, "find_spec", lambda name: object())
    problem = devices.gpu_problem()
    assert problem is not None
    assert "no visible NVIDIA GPU" in problem and "SYNKHRONOS_GPU_PLATFORM=cpu" in problem


def test_missing_packages_are_named(env):
    env.setattr(devices.importlib.util, "find_spec", lambda name: None)
    assert "needs jax and cupy (install synkhronos[gpu])" in devices.gpu_problem()
    env.setenv("SYNKHRONOS_GPU_PLATFORM", "cpu")  # the stand-in needs JAX alone
    assert "needs jax (install synkhronos[gpu], or jax alone" in devices.gpu_problem()


def test_stand_in_runs_one_process_per_core_with_one_xla_thread(env):
    env.setenv("SYNKHRONOS_GPU_PLATFORM", "cpu")
    env.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    assert devices.device_count() == len(os.sched_getaffinity(0))
    assert devices.prepare_gpu(3) == []
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    assert os.environ["XLA_FLAGS"].startswith("--xla_dump_to=/tmp/x ")
    assert "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" in (
        os.environ["XLA_FLAGS"])


def test_ranks_go_round_the_visible_gpus(env):
    env.setattr(devices, "visible_gpus", lambda: 4)
    env.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert devices.prepare_gpu(2) == ["3", "5"]
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ  # a GPU each
    assert os.environ["JAX_PLATFORMS"] == "cuda"
    assert devices.prepare_gpu(3) == ["3", "5", "3"]
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"  # two share GPU 3


def test_bind_sets_each_process_its_gpu(env):
    jax_placement = placement.JaxPlacement(["3", "5", "3"])
    jax_placement.bind(2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert jax_placement.shares_gpus
    assert not placement.JaxPlacement(["3", "5"]).shares_gpus
    assert placement.JaxPlacement([]).shares_gpus  # the stand-in: staged collectives
    placement.JaxPlacement([]).bind(0)  # nothing to bind on the stand-in
    placement.HostPlacement().bind(0)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_host_placement_leaves_values_where_they_are():
    host = placement.placement_for("cpu")
    value = np.arange(3.0)
    assert host.to_host(value) is value and host.to_device(value) is value
    fn = object()
    assert host.runner(fn) is fn
    assert host.compile_kwargs({"mode": "NUMBA"}) == {"mode": "NUMBA"}
    var = pytensor.shared(np.zeros(3))
    host.store(var, [1, 2, 3])
    np.testing.assert_array_equal(var.get_value(), [1.0, 2.0, 3.0])


class JAXLinker:  # what PyTensor's JAX mode's linker is called
    pass


class _Mode:
    linker = JAXLinker()


def test_device_functions_compile_in_jax_mode_only():
    device = placement.placement_for("gpu")
    assert device.compile_kwargs({"name": "f"}) == {"name": "f", "mode": "JAX"}
    assert device.compile_kwargs({"mode": "JAX"}) == {"mode": "JAX"}
    assert device.compile_kwargs({"mode": _Mode()})["mode"].__class__ is _Mode
    with pytest.raises(ValueError, match="device='gpu' compiles every function with "
                                         "PyTensor's JAX backend; got mode='NUMBA'"):
        device.compile_kwargs({"mode": "NUMBA"})


class _DeviceArray:
    """Stands for a JAX array: what ``device_put`` returned, holding its host copy."""

    def __init__(self, array):
        self.array = array

    def __array__(self, dtype=None, copy=None):
        return self.array


def _device(monkeypatch):
    device = placement.JaxPlacement()
    monkeypatch.setattr(device, "_put", _DeviceArray)
    return device


def test_to_device_copies_so_a_slot_can_change_under_it(monkeypatch):
    device = _device(monkeypatch)
    slot = np.arange(4.0)
    moved = device.to_device(slot)
    slot[:] = -1  # the next collective rewrites the exchange slot
    np.testing.assert_array_equal(np.asarray(moved), [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(device.to_host(moved), [0.0, 1.0, 2.0, 3.0])


def test_place_moves_arrays_and_leaves_other_values(monkeypatch):
    device = _device(monkeypatch)
    weights = pytensor.shared(np.ones(2))
    rng = pytensor.shared(np.random.default_rng(0))
    device.place([weights, rng])
    assert isinstance(weights.container.storage[0], _DeviceArray)
    assert isinstance(rng.container.storage[0], np.random.Generator)
    device.store(weights, [3, 4])
    np.testing.assert_array_equal(np.asarray(weights.container.storage[0]), [3.0, 4.0])


def test_runner_returns_host_arrays_in_the_function_s_form(monkeypatch):
    device = _device(monkeypatch)
    several = device.runner(lambda x: [_DeviceArray(x), _DeviceArray(2 * x)])
    single = device.runner(lambda x: _DeviceArray(x + 1))
    out = several(np.ones(2))
    assert isinstance(out, list) and all(type(o) is np.ndarray for o in out)
    np.testing.assert_array_equal(single(np.ones(2)), [2.0, 2.0])
