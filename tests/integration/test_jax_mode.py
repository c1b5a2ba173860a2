"""PyTensor's JAX backend on CPU through synkhronos (the mode the GPU backend will use)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="jax is not installed (it is in the test extra)")

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "jax_late_distribute.py"


@pytest.mark.timeout(300)
def test_jax_functions_built_after_an_update_distribute():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
