"""The device check (``benchmarks/device_check.py``) in its ``--local`` mode, tiny.

The script is meant for a GPU machine that is rarely at hand; this test keeps it from
rotting in between: it runs every part on this machine (JAX's CPU platform standing in
for the GPU, n = 2 only, tiny sizes, one test of each of two device suites), in a subprocess, and
checks the JSON it writes: every part is recorded, the NCCL parts are skipped with the
reason "needs CUDA GPUs", and every other part passed (PyMC's part may be skipped where
PyMC is not installed, and says so). It takes a minute or two: ``tests/conftest.py``
marks it ``slow`` (the default tier leaves it out) and ``once`` (CI runs it in its
first environment only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import segments_of

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_check.py"
PARTS = ["environment", "nccl_unit", "nccl_all_reduce", "nccl_two_ranks", "step_overhead",
         "gpu_tests", "cpu_scaling", "cpu_all_reduce", "pymc_evaluation", "pymc_chains",
         "pymc_peers"]
NCCL_PARTS = ["nccl_unit", "nccl_all_reduce", "nccl_two_ranks"]
TINY = {
    "deadline": 900,
    # one test of each of two device suites, each of which computes on the device: a
    # master that ran JAX cannot fork again, so they must run in processes of their own
    "test_k": "test_all_reduce_twice_and_after_function_updates or "
              "test_a_training_step_is_one_command", "test_sizes": [2],
    "step_mlp_rows": 8, "step_rounds": 1, "step_seconds": 0.02,
    "step_resnet": {"blocks": [1], "width": 2, "image_size": 16, "rows": 4},
    "scaling_sizes": [2], "scaling_rows": 8, "scaling_rounds": 1, "scaling_seconds": 0.02,
    "scaling_attempts": 1, "scaling_phase_steps": 2, "scaling_fixed_commands": 5,
    "allreduce_bytes": [4, 4096], "allreduce_scale": 0.003,
    "pymc_rows": 2000, "pymc_sizes": [2], "pymc_repeats": 2,
    "chains_rows": 500, "chains_draws": 10, "chains_layouts": ["2x1"],
    "peers_rows": 500, "peers_draws": 10,
    "budgets": {name: 300 for name in PARTS},
}

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if importlib.util.find_spec("jax") is None:
        pytest.skip("needs jax (the CPU stand-in of device='gpu'; pip install -e .[test])")
    out = tmp_path_factory.mktemp("device_check")
    command = [sys.executable, str(SCRIPT), "--local", "--out", str(out)]
    for key, value in TINY.items():
        command += ["--set", f"{key}={json.dumps(value)}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate(timeout=1100)
    assert segments_of(process.pid) == [], "the device check left shared memory behind"
    path = out / "device_check_local.json"
    assert path.exists(), f"stdout:\n{stdout}\nstderr:\n{stderr[-4000:]}"
    return json.loads(path.read_text()), stdout, process.returncode


def test_every_part_is_recorded_with_its_time(report):
    data, stdout, returncode = report
    assert data["benchmark"] == "device_check" and data["mode"] == "local"
    assert list(data["parts"]) == PARTS
    for name, part in data["parts"].items():
        assert part["status"] in ("passed", "failed", "skipped"), name
        assert part["wall_s"] <= part["budget_s"] + 5, name
        assert name in stdout  # the summary names every part
    assert data["summary"]["failed"] == 0, json.dumps(data["parts"], indent=1)[-6000:]
    assert returncode == 0  # the script's status says whether a part failed


def test_nccl_parts_are_skipped_for_want_of_gpus(report):
    data, _, _ = report
    for name in NCCL_PARTS:
        part = data["parts"][name]
        assert part["status"] == "skipped" and "needs CUDA GPUs" in part["reason"], part


def test_every_other_part_passed_and_says_what_it_measured(report):
    data, _, _ = report
    parts = data["parts"]
    bad = {name: part for name, part in parts.items() if name not in NCCL_PARTS
           and part["status"] != "passed"
           and not (name in ("pymc_evaluation", "pymc_chains", "pymc_peers")
                    and part["status"] == "skipped"
                    and importlib.util.find_spec("pymc") is None)}
    assert not bad, json.dumps(bad, indent=1)[-6000:]
    env = parts["environment"]["result"]
    assert env["machine"]["usable_cores"] >= 1 and env["jax"]["backend"] == "cpu"
    step = parts["step_overhead"]["result"]
    assert step["device"] == "gpu" and step["jax_devices"] == ["cpu:0"]
    for model in ("mlp", "resnet"):  # equal first losses are checked inside the part
        assert step[model]["ratio_synk_over_plain"] > 0
        assert step[model]["ratio_synk_data_over_plain"] > 0
        assert step[model]["first_losses"][0] == pytest.approx(step[model]["first_losses"][1],
                                                               rel=1e-4)
    runs = parts["gpu_tests"]["result"]["runs"]
    # one pytest process per module; two processes: staged collectives
    assert [(Path(r["module"]).name, r["n_parallel"]) for r in runs] == [
        ("test_collectives.py", 2), ("test_train.py", 2)]
    for run in runs:
        assert run["returncode"] == 0 and run["counts"]["passed"] >= 1, run
        assert run["counts"]["failures"] == run["counts"]["errors"] == 0, run
    assert parts["gpu_tests"]["result"]["platform"] == "cpu"
    scaling = parts["cpu_scaling"]["result"]
    assert set(scaling["vs_ceiling_per_n"]) == {"2"}
    assert scaling["chunks"] == {"2": 4}  # the chunked step beside the even one
    assert "synk-2 chunks4 scaled shuffled allreduce-on / even split" in scaling["headline"]
    phases = scaling["phases"]["per_n"]["2"]
    assert [r["rank"] for r in phases["ms_per_step"]] == [0, 1]
    assert all(r["exchange"] > 0 and r["compute"] > 0 for r in phases["ms_per_step"])
    assert len(phases["fixed_costs"]["all_reduce_4B"]["cpu_us_per_rank"]) == 2
    for model in ("mlp", "resnet"):
        profiled = step[model]["synk_profiled_ms_per_step"]
        assert profiled["function"] > 0 and profiled["total"] >= profiled["function"]
    reduce = parts["cpu_all_reduce"]["result"]["2"]["median_us"]
    assert set(reduce["synkhronos (resident)"]) == {"4", "4096"}
    if parts["pymc_evaluation"]["status"] == "passed":
        pymc = parts["pymc_evaluation"]["result"]
        assert set(pymc["synkhronos_s"]) == {"2"} and pymc["rows"] == 2000
        assert set(pymc["fraction_of_ceiling"]) == {"2"}
    if parts["pymc_chains"]["status"] == "passed":
        chains = parts["pymc_chains"]["result"]
        assert chains["rows"] == 500 and chains["layouts"] == ["2x1"]
        assert set(chains["wall_s"]) >= {"pymc_1_thread", "pymc_defaults", "synkhronos_2x1"}
    if parts["pymc_peers"]["status"] == "passed":
        peers = parts["pymc_peers"]["result"]
        assert peers["settings"]["sample_rows"] == [500]
        (entry,) = peers["headline"]["logistic"]
        assert entry["rows"] == 500 and entry["chains"] == 2
