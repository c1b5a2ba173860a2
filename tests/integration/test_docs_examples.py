"""Every script in docs/examples runs to completion: the documentation cannot rot.

Each script asserts its own results (against plain PyTensor where it can) and is run
here in a fresh interpreter, as a reader would run it. A script that needs an
optional package it cannot find prints ``skipped: <reason>`` and exits 0; that is
reported as a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
TIMEOUT_S = 300


def test_examples_exist():
    assert len(SCRIPTS) >= 5, f"expected the docs examples in {EXAMPLES}"


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_docs_example_runs(script: Path):
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=EXAMPLES,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{script.name} did not finish within {TIMEOUT_S} s\n{out}\n{err}")
    assert proc.returncode == 0, (
        f"{script.name} exited with {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
    )
    left = [e for e in os.listdir("/dev/shm") if f"synk_{proc.pid}_" in e]
    assert left == [], f"{script.name} left shared-memory segments behind: {left}"
    if out.startswith("skipped:"):
        pytest.skip(f"{script.name}: {out.strip()}")
