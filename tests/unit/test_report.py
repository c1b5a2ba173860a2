"""The environment report of ``python -m synkhronos`` (``synkhronos._report``): never forks."""

from __future__ import annotations

import json
import os

import numpy as np
import pytensor
import pytest

from synkhronos import _report

SECTIONS = {"synkhronos", "python", "pytensor", "numpy", "packages", "mpi", "cpu", "shm",
            "gpus", "launcher", "fork"}
LAUNCH_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK",
                    "SLURM_PROCID", "SLURM_STEP_ID", "PMIX_RANK")


@pytest.fixture
def plain_environment(monkeypatch):
    """No launcher variables and no SYNK_* settings, whatever started the tests."""
    for name in LAUNCH_VARIABLES + ("SYNK_N_PARALLEL", "SYNK_TIMEOUT", "SYNK_REDUCTION"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def report():
    return _report.gather()


def test_every_section_is_present_and_the_report_is_json(report):
    assert set(report) == SECTIONS
    assert json.loads(json.dumps(report)) == report


def test_no_probe_failed_here(report):
    failed = {name: s["error"] for name, s in report.items() if "error" in s}
    assert failed == {}


def test_versions_are_those_imported(report):
    import synkhronos

    assert report["synkhronos"]["version"] == synkhronos.__version__
    assert report["synkhronos"]["path"] == os.path.dirname(synkhronos.__file__)
    assert report["pytensor"]["version"] == pytensor.__version__
    assert report["numpy"]["version"] == np.__version__
    assert report["pytensor"]["default_linker"].endswith("Linker")
    # numpy's BLAS is loaded, so threadpoolctl lists at least one pool
    assert any(pool["internal_api"] for pool in report["numpy"]["threadpools"])


def test_mpi_library_is_named_when_mpi4py_is_installed(report):
    if report["packages"]["mpi4py"] is None:
        assert report["mpi"] == {"mpi4py": None, "library": None}
    else:
        assert report["mpi"]["library"], report["mpi"]
    import sys

    loaded = "mpi4py.MPI" in sys.modules
    _report.gather()
    assert ("mpi4py.MPI" in sys.modules) == loaded  # asked in a child: not loaded here


def test_cpu_and_shm_match_the_system(report):
    cores = sorted(os.sched_getaffinity(0))
    assert report["cpu"]["usable_cores"] == cores
    assert report["cpu"]["n_usable"] == len(cores)
    assert 1 <= report["cpu"]["physical_cores"] <= len(cores)
    stat = os.statvfs("/dev/shm")
    assert report["shm"]["size_bytes"] == stat.f_frsize * stat.f_blocks
    assert 0 <= report["shm"]["free_bytes"] <= report["shm"]["size_bytes"]


def test_fork_choice_follows_fork_rules(plain_environment):
    choice = _report.gather()["fork"]
    n_cores = len(os.sched_getaffinity(0))
    assert choice["n_parallel"] == n_cores
    assert choice["n_parallel_from"] == "usable cores"
    assert choice["device"] == "cpu" and choice["reduction"] == "fast"
    assert choice["spin_seconds"] > 0


def test_fork_choice_reads_synk_n_parallel(plain_environment, monkeypatch):
    n_cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("SYNK_N_PARALLEL", str(n_cores + 1))
    choice = _report.gather()["fork"]
    assert choice["n_parallel"] == n_cores + 1
    assert choice["n_parallel_from"] == "SYNK_N_PARALLEL"
    assert choice["spin_seconds"] == 0.0  # more processes than cores: no spinning


def test_a_bad_synk_n_parallel_is_reported_not_raised(plain_environment, monkeypatch):
    monkeypatch.setenv("SYNK_N_PARALLEL", "many")
    report = _report.gather()
    assert "SYNK_N_PARALLEL" in report["fork"]["error"]
    assert "error" not in report["cpu"]


def test_launcher_is_read_from_the_environment(plain_environment, monkeypatch):
    assert _report.gather()["launcher"]["kind"] == "local"
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    launcher = _report.gather()["launcher"]
    assert launcher == {"kind": "openmpi", "size": 2, "rank": 0, "several_machines": True}


def test_cpu_list_format():
    assert _report._cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert _report._cpu_list("5") == [5]


@pytest.mark.parametrize("files, membership, quota", [
    ({"cpu.max": "150000 100000"}, "0::/\n", 1.5),
    ({"job/cpu.max": "max 100000", "cpu.max": "200000 100000"}, "0::/job\n", None),
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, "3:cpu,cpuacct:/\n",
     None),
    ({"cpu/a/cpu.cfs_quota_us": "50000", "cpu/a/cpu.cfs_period_us": "100000"},
     "3:cpu,cpuacct:/a\n", 0.5),
    ({}, "", None),
], ids=["v2", "v2-own-cgroup-unlimited", "v1-none", "v1-half", "no-cgroup"])
def test_cgroup_quota(tmp_path, files, membership, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "membership").write_text(membership)
    assert _report._cgroup_quota(str(tmp_path), str(tmp_path / "membership")) == quota


def test_text_report_names_every_section(report):
    text = _report.format_report(report)
    for name in SECTIONS:
        assert f"\n{name}:" in "\n" + text
    assert "free" in text  # /dev/shm's line


def test_text_check_says_failed_and_why():
    text = _report.format_check({"ok": False, "n_parallel": 2, "seconds": {"fork": 0.5},
                                 "problems": ["the function's 'sum' output differs"]})
    assert "FAILED" in text and "500.0 ms" in text and "'sum' output differs" in text


def test_gpu_models_are_read_from_the_driver_files(tmp_path, monkeypatch):
    for bus, model in (("0000:1b:00.0", "NVIDIA H100 80GB HBM3"), ("0000:2c:00.0", None)):
        (tmp_path / bus).mkdir()
        text = "IRQ:\t\t 16\n" + (f"Model: \t\t {model}\n" if model else "")
        (tmp_path / bus / "information").write_text(text)
    monkeypatch.setattr(_report, "_GPU_DRIVER", str(tmp_path))
    gpus = _report._gpus()
    assert gpus["driver_lists"] == ["NVIDIA H100 80GB HBM3 (0000:1b:00.0)",
                                    "unknown model (0000:2c:00.0)"]
