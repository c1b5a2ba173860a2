"""A large-data log-likelihood summed over processes, the prior added once.

The model is written the way PyMC writes one: the data live in shared variables
(``pm.Data``), the log-density is a graph of the parameters' values. ``givens``
replaces each data shared variable with a scattered input, so every process sums the
log-likelihood of its own rows; op "sum" adds the pieces up. The prior does not
depend on the data and is added once, in the master.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy.optimize import minimize

import synkhronos as synk

synk.fork(3)
rng = np.random.default_rng(0)
N, D = 10_000, 5
X_value = rng.normal(size=(N, D))
y_value = (rng.random(N) < 1 / (1 + np.exp(-X_value @ np.arange(1.0, D + 1)))).astype("float64")

# The model: data in shared variables, as pm.Data would hold them.
X = pytensor.shared(X_value, name="X")
y = pytensor.shared(y_value, name="y")
beta = pt.dvector("beta")  # the parameters' values: broadcast, never scattered
logit = X.dot(beta)
loglik = pt.sum(y * logit - pt.softplus(logit))  # Bernoulli(logit_p), summed over rows
logprior = pt.sum(-0.5 * beta**2 - 0.5 * np.log(2 * np.pi))  # Normal(0, 1)

# Distributed likelihood and gradient: the data shared variables become inputs.
X_rows, y_rows = pt.dmatrix("X_rows"), pt.dvector("y_rows")
lik = synk.function(
    inputs=[X_rows, y_rows],
    bcast_inputs=[beta],
    outputs=[(loglik, "sum"), (pytensor.grad(loglik, beta), "sum")],
    givens={X: X_rows, y: y_rows},
)
prior = pytensor.function([beta], [logprior, pytensor.grad(logprior, beta)])  # master only
synk.distribute()

X_data, y_data = synk.data(X_value), synk.data(y_value)


def logp_and_grad(beta_value):
    lik_value, lik_grad = lik(X_data, y_data, beta_value)
    prior_value, prior_grad = prior(beta_value)
    return lik_value + prior_value, lik_grad + prior_grad


# The serial model, for comparison: the same graph on the whole shared data.
serial = pytensor.function([beta], [loglik + logprior, pytensor.grad(loglik + logprior, beta)])
point = np.full(D, 0.5)
value, grad = logp_and_grad(point)
print(f"logp {value:.6f} (serial {serial(point)[0]:.6f})")
np.testing.assert_allclose(value, serial(point)[0], rtol=1e-10)
np.testing.assert_allclose(grad, serial(point)[1], rtol=1e-10)

# The maximum a posteriori point, with scipy (a PyTensor dependency) driving the calls.
result = minimize(lambda b: tuple(-v for v in logp_and_grad(b)), point, jac=True)
print("MAP estimate:", np.round(result.x, 2))
assert np.abs(logp_and_grad(result.x)[1]).max() < 1e-2  # a stationary point
synk.close()
