"""PyMC's logp and dlogp of an unmodified model, with the likelihood on every process.

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

synk.fork(3)
rng = np.random.default_rng(0)
N, D = 2_000, 5
X_value = rng.normal(size=(N, D))
y_value = X_value @ np.ones(D) + rng.normal(size=N)

with pm.Model() as model:  # written for PyMC alone: nothing here knows synkhronos
    X = pm.Data("X", X_value)
    beta = pm.Normal("beta", 0, 1, shape=D)
    sigma = pm.HalfNormal("sigma", 1)
    pm.Normal("obs", mu=X @ beta, sigma=sigma, observed=y_value)

# Rows of X and of the observed values are divided among the 3 processes; each sums
# the log-likelihood and gradient of its rows; the prior is added once, in the master.
parallel = synkhronos.pymc.logp_dlogp_function(model)
serial = model.logp_dlogp_function(ravel_inputs=True)  # PyMC's own, for comparison
parallel.set_extra_values({})
serial.set_extra_values({})

point = np.concatenate([np.full(D, 0.5), [0.1]])  # beta, then log(sigma)
logp, dlogp = parallel(point)
want_logp, want_dlogp = serial(point)
print(f"logp {logp:.6f} (PyMC {want_logp:.6f})")
np.testing.assert_allclose(logp, want_logp, rtol=1e-10)
np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-10)

# Your own steps: PyMC's NUTS over the parallel function, chains in the master.
with model:
    step = pm.NUTS(logp_dlogp_func=parallel)
    idata = pm.sample(step=step, draws=100, tune=100, chains=1, cores=1, random_seed=1,
                      progressbar=False, compute_convergence_checks=False)
means = idata.posterior["beta"].mean(("chain", "draw")).values
print("posterior mean of beta:", np.round(means, 2))
synk.close()
