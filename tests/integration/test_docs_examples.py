"""Every script in docs/examples runs as shown and prints the output the docs show.

Each script asserts its own results (against plain PyTensor where it can) and is run
here in a fresh interpreter, as a reader would run it, from a directory other than its
own (the examples run from anywhere). What it prints is compared with ``NAME.out``
beside it, the file the pages include as the script's output, so an output block
cannot drift from the code. In ``NAME.out``, ``...`` stands for any text (times, pids:
what differs between runs), as in doctest's ELLIPSIS; a script that prints nothing
has no ``NAME.out``. A script that needs an optional package it cannot find prints
``skipped: <reason>`` and exits 0; that is reported as a skip.

The scripts that fork one process per core are run on 2 cores (their affinity, and
``SYNK_N_PARALLEL=2``), the machine their checked-in output was written on.
"""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
TIMEOUT_S = 300
N_CORES = 2


def test_examples_exist():
    assert len(SCRIPTS) >= 5, f"expected the docs examples in {EXAMPLES}"


def test_every_output_has_its_script():
    scripts = {path.stem for path in SCRIPTS}
    orphans = [out.name for out in EXAMPLES.glob("*.out") if out.stem not in scripts]
    assert orphans == [], f"outputs without a script in docs/examples: {orphans}"


def _two_cores() -> None:
    """In the child before exec: run on the first two usable cores, if there are more."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > N_CORES:
        os.sched_setaffinity(0, cores[:N_CORES])


def output_matches(expected: str, got: str) -> bool:
    """``got`` equals ``expected``, where ``...`` in ``expected`` matches any text."""
    checker = doctest.OutputChecker()
    return checker.check_output(expected, got, doctest.ELLIPSIS)


def test_output_matching_is_strict():
    assert output_matches("a ...\nb\n", "a 12 ms\nb\n")
    assert not output_matches("a ...\nb\n", "a 12 ms\nc\n")
    assert not output_matches("mean 0.105435\n", "mean 0.105436\n")


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_docs_example_runs(script: Path, tmp_path: Path):
    env = dict(os.environ, SYNK_N_PARALLEL=str(N_CORES))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,  # not the script's folder: the examples run from any directory
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_two_cores,
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
    shown = script.with_suffix(".out")
    if not shown.exists():
        assert out == "", (
            f"{script.name} prints output but has no {shown.name} beside it for the docs "
            f"to show:\n{out}"
        )
        return
    expected = shown.read_text()
    assert output_matches(expected, out), (
        f"{script.name} printed what {shown.name} (shown in the docs) does not say\n"
        f"--- {shown.name}\n{expected}--- printed\n{out}"
    )
