"""The PyMC demo runs and agrees with PyMC's own logp and dlogp (the demo asserts it).

PyMC pins pytensor<2.39, so this runs in CI's second environment (``.[pymc,test]``);
in the main environment, with PyTensor 3, PyMC cannot be installed and it skips.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip(
    "pymc", reason="PyMC is not installed here (it pins pytensor<2.39); .ci/run runs this "
    "test in a second environment with the pymc extra"
)

DEMO = pathlib.Path(__file__).parents[2] / "demos" / "pymc_likelihood.py"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n_parallel", [2, 3])
def test_pymc_likelihood_demo_matches_pymc(n_parallel):
    result = subprocess.run(
        [sys.executable, str(DEMO), "--rows", "5001", "--features", "3", "--repeats", "1",
         "--n-parallel", str(n_parallel)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "equals PyMC's" in result.stdout
