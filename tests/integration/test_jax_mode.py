"""PyTensor's JAX backend on CPU through synkhronos (the mode the GPU backend will use)."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

# Looked up, not imported: importing jax here would start its thread pool in the test
# process for the rest of the run, and every later fork would fork a multi-threaded
# process (Python 3.12 warns at each). The test runs jax in its own process.
if importlib.util.find_spec("jax") is None:
    pytest.skip("jax is not installed (it is in the test extra)", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "jax_late_distribute.py"


@pytest.mark.timeout(300)
def test_jax_functions_built_after_an_update_distribute():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
