"""``python -m synkhronos``: the report and ``--check``, run as a user runs them.

Each test starts a fresh interpreter (the command line forks its own session). CI runs
this module a second time against the installed wheel, so the command must work from
the package files alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import synkhronos

TIMEOUT = 240


def run_cli(*args: str, **environment: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **environment}
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_ID", "PMIX_RANK"):
        env.pop(name, None)  # a local run, whatever launched the tests
    return subprocess.run([sys.executable, "-m", "synkhronos", *args], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def test_check_passes_and_reports_json():
    done = run_cli("--check", "--json", SYNK_N_PARALLEL="2")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    check = report["check"]
    assert check["ok"] is True and check["problems"] == []
    assert check["n_parallel"] == 2
    assert set(check["seconds"]) == {"fork", "build", "distribute", "call", "all_reduce",
                                     "close"}
    assert report["fork"]["n_parallel"] == 2
    assert report["fork"]["n_parallel_from"] == "SYNK_N_PARALLEL"
    # the command ran the synkhronos this test imports (the checkout, or the wheel in CI)
    assert report["synkhronos"]["path"] == os.path.dirname(synkhronos.__file__)
    assert report["synkhronos"]["version"] == synkhronos.__version__


def test_check_fails_with_exit_code_1_when_fork_cannot_run():
    done = run_cli("--check", "--json", SYNK_N_PARALLEL="0")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["check"]["ok"] is False
    assert report["check"]["n_parallel"] is None
    (problem,) = report["check"]["problems"]
    assert "synk.fork() failed" in problem and "SYNK_N_PARALLEL must be an integer" in problem
    assert "SYNK_N_PARALLEL" in report["fork"]["error"]


def test_report_as_text():
    done = run_cli()
    assert done.returncode == 0, done.stderr
    for section in ("synkhronos:", "pytensor:", "cpu:", "shm:", "gpus:", "launcher:",
                    "fork:"):
        assert section in done.stdout.splitlines()
    assert "check:" not in done.stdout  # no session without --check


def test_bad_argument_is_a_usage_error():
    done = run_cli("--n-parallel", "two")
    assert done.returncode == 2
    assert "invalid int value" in done.stderr
