"""The same script on several machines and on one: equal results (SPEC section 8).

Each case launches a script of ``scripts/`` under ``mpiexec`` (2 machines x 1 or 2
processes, over shared memory, TCP over loopback, or two network namespaces) and alone
with the same total number of processes, and compares what the masters wrote:

- ``suite.py``: the shared cases (``tests/cases.py``, which the integration suite runs
  on one machine too). Everything is bit-identical, except in fast mode the
  reductions of collectives (names starting ``reduce/``), equal within rounding; in
  exact mode those are bit-identical too; and every result with a reference equals
  numpy's on the full data.
- ``train.py``: the issue's Done-when -- an Appendix-A-style training script
  (``make_train_function``, ``synk.Data`` inputs, shuffled minibatches) gives the same
  parameters in every process under ``mpiexec -n 2`` (each machine forking 2) as one
  machine with 4 processes: within rounding in fast mode, bit-identical in exact mode.

After every launch no process of the job is left, and no ``/dev/shm`` entry of any of
its machines.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.cases import Check

from . import harness
from .harness import NETNS_HOSTS

MACHINES = 2
# (transport, processes per machine, reduction)
SUITE_LAYOUTS = [("shm", 2, "fast"), ("shm", 2, "exact"), ("tcp", 2, "exact"),
                 ("tcp", 1, "fast"), ("netns", 2, "fast")]
TRAIN_LAYOUTS = [("shm", "fast"), ("shm", "exact"), ("netns", "exact")]


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """``alone(script, processes, *args)``: the folder of a run on one machine (cached)."""
    runs: dict[tuple, object] = {}

    def run(script: str, processes: int, *args: str):
        key = (script, processes, args)
        if key not in runs:
            out = tmp_path_factory.mktemp(f"alone_{script[:-3]}_{processes}")
            harness.alone(script, "--processes", str(processes), *args, out=out)
            runs[key] = out
        return runs[key]

    return run


def launched(launcher, script, out, transport, processes, reduction, *args):
    result = launcher(script, "--processes", str(processes), "--reduction", reduction, *args,
                      transport=transport, out=out, timeout=300)
    assert result.returncode == 0, result.describe()
    assert result.stragglers == [], result.describe()
    return result


def expected_hosts(transport: str, processes: int) -> list[str] | None:
    if transport != "netns":
        return None
    return [host for host in NETNS_HOSTS for _ in range(processes)]


def tolerance(array: np.ndarray) -> dict:
    return {"rtol": 1e-5, "atol": 1e-3} if array.dtype == np.float32 else {
        "rtol": 1e-10, "atol": 1e-9}


@pytest.mark.parametrize("transport, processes, reduction", SUITE_LAYOUTS,
                         ids=[f"{t}-2x{p}-{r}" for t, p, r in SUITE_LAYOUTS])
def test_suite_equals_one_machine(launcher, alone, tmp_path, transport, processes, reduction):
    total = MACHINES * processes
    reference = alone("suite.py", total)  # first: it warms the compile cache
    result = launched(launcher, "suite.py", tmp_path, transport, processes, reduction)
    mine, ref = result.json("suite.json"), json.loads((reference / "suite.json").read_text())
    assert mine["n"] == ref["n"] == total
    assert mine["machines"] == [r // processes for r in range(total)]
    if expected_hosts(transport, processes):
        assert mine["hosts"] == expected_hosts(transport, processes)
    for key in ("f/batch_s_refused", "f/worker_error", "reduce/mismatch", "rounded/refused"):
        assert mine[key] == ref[key], key
    assert mine["f/worker_error"][0] == total - 1  # the global rank of the last process
    got, want = np.load(tmp_path / "suite.npz"), np.load(reference / "suite.npz")
    assert sorted(got.files) == sorted(want.files)
    for key in want.files:
        if reduction == "fast" and key.startswith("reduce/"):
            np.testing.assert_allclose(got[key], want[key], err_msg=key, **tolerance(want[key]))
        else:
            assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), (
                f"{key} differs from the run on one machine")
    references = np.load(tmp_path / "reference.npz")
    for key in references.files:
        Check(got[key], references[key]).compare(key)
    assert harness.alive(mine["pids"]) == []
    assert harness.leftovers(mine["pids"]) == []


@pytest.mark.parametrize("transport, reduction", TRAIN_LAYOUTS,
                         ids=[f"{t}-{r}" for t, r in TRAIN_LAYOUTS])
def test_training_equals_one_machine(launcher, alone, tmp_path, transport, reduction):
    """The Done-when: mpiexec -n 2, each machine forking 2, against one machine of 4."""
    reference = alone("train.py", 4, "--hidden", "600")  # first: it warms the cache
    result = launched(launcher, "train.py", tmp_path, transport, 2, reduction,
                      "--hidden", "600")  # a gradient over 64 kB: the large paths too
    info = result.json("train.json")
    assert info["n_parallel"] == 4
    if expected_hosts(transport, 2):
        assert info["hosts"] == expected_hosts(transport, 2)
    got, want = np.load(tmp_path / "train.npz"), np.load(reference / "train.npz")
    for key in want.files:
        if reduction == "exact":
            assert np.array_equal(got[key], want[key]), f"{key} is not bit-identical"
        else:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                                       err_msg=key)
    for i in range(4):  # every process holds the same parameters
        ranks = got[f"ranks{i}"]
        assert all(np.array_equal(ranks[0], other) for other in ranks[1:])
    assert harness.alive(info["pids"]) == []
    assert harness.leftovers(info["pids"]) == []
