"""Ctrl-C during ``synkhronos.pymc.sample`` with chains at once (2 chains x 2 processes),
then with the chains one after another (2 chains over one session of 2 processes).

Ctrl-C is made deliverable first (Python's default SIGINT handler), whatever this
process inherited: a test suite started in the background has SIGINT ignored.

Samples three times, each time far more draws than the test waits for: twice with
the chains at once, then once with them one after another (``cores=1``, fewer draws:
PyMC's own sequential sampler would run the second chain to its end). Once every
running chain has sent a draw after tuning (PyMC's ``callback``, in this process),
prints ``{"round": k, "chains": [pid, ...]}`` (PyMC's chain processes; none one after
another) as one JSON line and waits for the test's SIGINT; ``sample`` then returns
the draws so far, as ``pm.sample`` does, and the script prints ``{"round": k, "draws":
[...]}``, the draws each chain kept.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys

os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
signal.signal(signal.SIGINT, signal.default_int_handler)

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402

import synkhronos.pymc as synk_pymc  # noqa: E402

rng = np.random.default_rng(1)
x = rng.normal(size=(401, 3))
y = (rng.random(401) < 1 / (1 + np.exp(-x @ np.array([0.5, -0.5, 1.0])))).astype("int64")
with pm.Model() as model:
    b = pm.Normal("b", 0, 1, shape=3)
    pm.Bernoulli("y", logit_p=x @ b, observed=y)

for round_, (cores, draws) in enumerate([(2, 100_000), (2, 100_000), (1, 5_000)]):
    seen: set[int] = set()

    def callback(trace, draw, round_=round_, seen=seen, running=cores):
        if len(seen) < running and not draw.tuning:  # (in tuning, PyMC keeps none)
            seen.add(draw.chain)
            if len(seen) == running:
                pids = sorted(p.pid for p in multiprocessing.active_children())
                print(json.dumps({"round": round_, "chains": pids}), flush=True)

    idata = synk_pymc.sample(draws, divide=True, model=model, tune=20, chains=2, cores=cores,
                             processes_per_chain=2, random_seed=round_, callback=callback,
                             progressbar=False, compute_convergence_checks=False,
                             nuts_sampler="pymc")
    kept = [int(n) for n in np.isfinite(idata.posterior["b"].values[..., 0]).sum(axis=1)]
    print(json.dumps({"round": round_, "draws": kept}), flush=True)
sys.exit(0)
