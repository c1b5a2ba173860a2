"""synkhronos.pymc.sample with chains at once, each with its own group of processes,
checked against pm.sample itself (PyMC 5.28 and 6).

Without a session of the user, ``cores`` chains run at once, each in a PyMC chain
process that forks its own session of ``processes_per_chain`` processes:

- 2 chains at once x 2 processes (4 processes on 2 cores): the same draws as
  ``pm.sample`` for the same seed (up to rounding) and the same sample stats; no chain
  process, worker or segment is left, and this process never held a session;
- 3 chains, 2 at once, 1 process each, on a model with coords and dims: the third
  chain's process runs when its turn comes (at one process a chain no session is
  forked: PyMC's own function); one InferenceData with the model's dims;
- a likelihood that mixes rows is refused with the check's ValueError, raised in the
  chain's process; ``mp_ctx`` other than fork, and bad ``cores``, are refused before
  anything is forked;
- Ctrl-C (``scripts/pymc_chains_ctrl_c.py``; SIGINT to the whole process group, as a
  terminal sends it, then to the master alone, as a Jupyter interrupt may): ``sample``
  returns the draws so far, as ``pm.sample`` does, and no chain process, worker or
  segment is left; with the chains one after another (a session of 2 processes), one
  Ctrl-C stops both (PyMC's sequential sampler would run the second to its end).

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos.pymc as synk_pymc  # noqa: E402
from synkhronos.testing import child_pids, leftover_segments, session_open  # noqa: E402

from ..processes import leader_alive, poll  # noqa: E402
from .test_pymc import logistic_model, rows_mixing_model  # noqa: E402

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "pymc_chains_ctrl_c.py"
QUIET = dict(progressbar=False, compute_convergence_checks=False)


def grouped_model(rows=120, groups=3, seed=2):
    rng = np.random.default_rng(seed)
    group = rng.integers(groups, size=rows)
    y = rng.normal(size=groups)[group] + rng.normal(scale=0.5, size=rows)
    with pm.Model(coords={"group": ["u", "v", "w"][:groups], "obs": range(rows)}) as model:
        g = pm.Data("g", group, dims="obs")
        a = pm.Normal("a", 0, 1, dims="group")
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a[g], sigma, observed=y, dims="obs")
    return model


class ChainWatch:
    """A ``pm.sample`` callback (it runs in this process at every draw) that notes the
    chain processes and their workers once every running chain has sent a draw."""

    def __init__(self, running: int):
        self.running = running
        self.seen: set[int] = set()
        self.pids: set[int] = set()

    def __call__(self, trace, draw):
        if len(self.seen) < self.running:
            self.seen.add(draw.chain)
            for child in multiprocessing.active_children():
                self.pids.add(child.pid)
                self.pids.update(child_pids(child.pid))

    def assert_gone(self):
        assert self.pids, "no chain process was seen"
        assert poll(lambda: not any(leader_alive(pid) for pid in self.pids), 10), self.pids
        left = [entry for pid in self.pids for entry in leftover_segments(pid)]
        assert left == [], left


@pytest.mark.timeout(600)
def test_chains_at_once_draw_as_pm_sample():
    model = logistic_model(rows=601)
    watch = ChainWatch(running=2)
    options = dict(draws=60, tune=60, chains=2, random_seed=4, **QUIET)
    got = synk_pymc.sample(divide=True, model=model, cores=2, processes_per_chain=2, callback=watch,
                           **options)
    assert not session_open()  # the sessions were the chain processes'
    watch.assert_gone()
    assert len(watch.pids) >= 4, watch.pids  # two chain processes and a worker each
    want = pm.sample(model=model, nuts_sampler="pymc", cores=1, **options)
    for name in ("a", "b"):
        a, b = got.posterior[name].values, want.posterior[name].values
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * b.std(), err_msg=name)
    assert set(got.sample_stats.data_vars) == set(want.sample_stats.data_vars)
    np.testing.assert_array_equal(got.sample_stats["tree_depth"].values,
                                  want.sample_stats["tree_depth"].values)


@pytest.mark.timeout(600)
def test_more_chains_than_run_at_once_keep_dims():
    model = grouped_model()
    watch = ChainWatch(running=2)
    idata = synk_pymc.sample(40, divide=True, model=model, tune=40, chains=3, cores=2,
                             processes_per_chain=1, random_seed=3, callback=watch, **QUIET)
    assert idata.posterior["a"].dims == ("chain", "draw", "group")
    assert list(idata.posterior["a"].coords["group"].values) == ["u", "v", "w"]
    assert idata.posterior.sizes["chain"] == 3 and idata.posterior.sizes["draw"] == 40
    assert np.all(np.isfinite(idata.posterior["sigma"].values))
    assert not session_open()
    watch.assert_gone()


@pytest.mark.timeout(600)
def test_chains_at_once_refuse_what_they_cannot_run():
    mixing = rows_mixing_model()
    # the check runs in each chain's process, at its first evaluation
    with pytest.raises(ValueError, match="not a sum over the divided rows"):
        synk_pymc.sample(10, divide=True, model=mixing, tune=10, chains=2, cores=2,
                         processes_per_chain=2, nuts_sampler="pymc", **QUIET)
    assert not session_open()
    model = logistic_model(rows=11)
    with pytest.raises(ValueError, match="mp_ctx='spawn'.*cores=1"):
        # (only where it divides: PyMC's own function samples with any mp_ctx)
        synk_pymc.sample(10, divide=True, model=model, chains=2, cores=2, mp_ctx="spawn")
    for bad, error in ((0, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match="cores must be"):
            synk_pymc.sample(10, model=model, cores=bad)
    assert not session_open() and child_pids() == []


@pytest.mark.timeout(600)
def test_ctrl_c_stops_every_chain_group():
    proc = subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for round_, target in enumerate(("group", "master", "group")):
            line = json.loads(proc.stdout.readline() or "null")
            assert line is not None, proc.communicate(timeout=60)[1][-3000:]
            assert line["round"] == round_
            # the chain processes and their workers, while they sample (one after
            # another: the session's workers, the script's children)
            pids = set(line["chains"]) if round_ < 2 else set(child_pids(proc.pid))
            for pid in line["chains"]:
                pids.update(child_pids(pid))
            assert len(pids) >= (4 if round_ < 2 else 1), pids
            if target == "group":
                os.killpg(proc.pid, signal.SIGINT)
            else:
                os.kill(proc.pid, signal.SIGINT)
            line = json.loads(proc.stdout.readline() or "null")
            assert line is not None, proc.communicate(timeout=60)[1][-3000:]
            assert 0 < max(line["draws"]) < 100_000, line  # the draws so far came back
            if round_ == 2:  # the second chain stopped too: PyMC kept the first alone
                assert len(line["draws"]) == 1 and line["draws"][0] < 5_000, line
                assert poll(lambda: leftover_segments(proc.pid) == [], 10)
            assert poll(lambda pids=pids: not any(leader_alive(p) for p in pids), 10), pids
            left = [entry for pid in pids for entry in leftover_segments(pid)]
            assert left == [], left
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
