"""synkhronos.pymc.sample: pm.sample with the likelihood on every process.

Skips itself, with exit status 0, where PyMC is not installed (it is the ``pymc``
extra: PyMC 5.28 on Python 3.11, PyMC 6 on Python >= 3.12).
"""

import sys

try:
    import pymc as pm
except ImportError:
    print("skipped: PyMC is not installed (pip install -e '.[pymc]')")
    sys.exit(0)

import numpy as np

import synkhronos as synk
import synkhronos.pymc

rng = np.random.default_rng(0)
N, D = 5_000, 4
X = rng.normal(size=(N, D))
y = (rng.random(N) < 1 / (1 + np.exp(-(X @ np.linspace(-1, 1, D) + 0.5)))).astype("int64")

with pm.Model() as model:  # an ordinary PyMC model
    beta = pm.Normal("beta", 0, 1, shape=D)
    intercept = pm.Normal("intercept", 0, 2)
    pm.Bernoulli("y", logit_p=intercept + X @ beta, observed=y)

synk.fork(2)  # optional: without one, each chain running at once forks its own
options = dict(draws=300, tune=300, chains=2, random_seed=7, progressbar=False)
idata = synkhronos.pymc.sample(model=model, **options)  # same arguments as pm.sample
reference = pm.sample(model=model, cores=1, **options)  # its default sampler, as ours
synk.close()

for name in ("beta", "intercept"):
    ours = idata.posterior[name].values
    theirs = reference.posterior[name].values
    print(f"{name}: {np.round(ours.mean(axis=(0, 1)), 2)} "
          f"(pm.sample: {np.round(theirs.mean(axis=(0, 1)), 2)})")
    np.testing.assert_allclose(ours, theirs, atol=1e-4)  # same seed, same draws
