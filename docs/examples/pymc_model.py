"""A PyMC model's log-likelihood summed over processes (needs pymc, so pytensor<2.39).

Skips itself, with exit status 0, where PyMC is not installed: PyMC pins
``pytensor<2.39`` and cannot live next to PyTensor 3.
"""

import sys

try:
    import pymc as pm
except ImportError:
    print("skipped: PyMC is not installed (it needs pytensor<2.39)")
    sys.exit(0)

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(3)
rng = np.random.default_rng(0)
N, D = 2_000, 5
X_value = rng.normal(size=(N, D))
y_value = (rng.random(N) < 1 / (1 + np.exp(-X_value @ np.ones(D)))).astype("float64")

with pm.Model() as model:
    X = pm.Data("X", X_value)
    y = pm.Data("y", y_value)
    beta = pm.Normal("beta", 0, 1, shape=D)
    sigma = pm.HalfNormal("sigma", 1)
    pm.Normal("obs", mu=X @ beta, sigma=sigma, observed=y, shape=X.shape[0])

values = model.value_vars  # [beta, sigma_log__]: broadcast inputs
loglik = model.logp(vars=model.observed_RVs)  # a sum over rows: op "sum"
logprior = model.logp(vars=model.free_RVs, jacobian=True)  # added once, in the master

X_rows, y_rows = pt.dmatrix("X_rows"), pt.dvector("y_rows")
lik = synk.function(
    inputs=[X_rows, y_rows],
    bcast_inputs=values,
    outputs=[(loglik, "sum")] + [(g, "sum") for g in pytensor.grad(loglik, values)],
    givens={X: X_rows, y: y_rows},
)
prior = pytensor.function(values, [logprior] + pytensor.grad(logprior, values))
synk.distribute()

X_data, y_data = synk.data(X_value), synk.data(y_value)
point = model.initial_point()
args = [point[v.name] for v in values]
parallel = [a + b for a, b in zip(lik(X_data, y_data, *args), prior(*args), strict=True)]

logp, dlogp = model.compile_logp(), model.compile_dlogp()
print(f"logp {parallel[0]:.6f} (PyMC {logp(point):.6f})")
np.testing.assert_allclose(parallel[0], logp(point), rtol=1e-10)
np.testing.assert_allclose(
    np.concatenate([np.ravel(g) for g in parallel[1:]]), dlogp(point), rtol=1e-10
)
synk.close()
