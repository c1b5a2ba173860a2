"""device="gpu": its refusals here, and a whole session on JAX's CPU platform.

The session runs in its own process (``scripts/gpu_session.py``): a master that ran
JAX cannot fork again, and this test process forks many sessions. The function,
collective and training suites run on the stand-in too, one process per session size
(``.ci/gpu_standin.sh``).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import synkhronos as synk

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "gpu_session.py"


@pytest.mark.skipif(synk.get_n_gpu() > 0, reason="this machine has a GPU")
def test_no_gpu_is_refused_before_anything_forks(monkeypatch):
    monkeypatch.delenv("SYNKHRONOS_GPU_PLATFORM", raising=False)
    with pytest.raises(RuntimeError, match="device='gpu' (needs|found no visible NVIDIA GPU)"):
        synk.fork(2, device="gpu")
    with pytest.raises(RuntimeError, match="must be called before"):
        synk.n_parallel()  # nothing was started


def test_unknown_platform_is_refused(monkeypatch):
    monkeypatch.setenv("SYNKHRONOS_GPU_PLATFORM", "opencl")
    with pytest.raises(ValueError, match="SYNKHRONOS_GPU_PLATFORM must be 'cpu'"):
        synk.fork(2, device="gpu")
    with pytest.raises(ValueError, match="SYNKHRONOS_GPU_PLATFORM"):
        synk.fork(2, use_gpu=True)  # the original's keyword means the same


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="jax is not installed (it is in the test extra)")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [1, 3])
def test_a_whole_session_on_the_cpu_stand_in(n):
    env = dict(os.environ)
    env.pop("PYTENSOR_FLAGS", None)
    result = subprocess.run([sys.executable, str(SCRIPT), str(n)], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")
