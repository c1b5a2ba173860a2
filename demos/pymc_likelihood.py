"""A PyMC model's log-likelihood and gradient over a large data set, on every core.

The model is a Bernoulli (logistic) regression. Its observed data are PyMC ``Data``
containers (shared variables); ``givens`` replaces them by inputs that synkhronos
scatters across processes, and the per-process log-likelihoods and gradients are
summed (op ``"sum"``). The prior is added once, in the master. The result is checked
against PyMC's own compiled ``logp`` and ``dlogp`` on the whole data set.

PyMC pins ``pytensor<2.39``: run this in an environment with ``pip install -e .[pymc]``.

    python demos/pymc_likelihood.py [--n-parallel N] [--rows 1000000] [--features 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def build(x_data: np.ndarray, y_data: np.ndarray):
    """The PyMC model and the pieces synkhronos needs from it."""
    with pm.Model() as model:
        x = pm.Data("x", x_data)
        y = pm.Data("y", y_data)
        beta = pm.Normal("beta", 0.0, 1.0, shape=x_data.shape[1])
        intercept = pm.Normal("intercept", 0.0, 2.0)
        pm.Bernoulli("obs", logit_p=intercept + x @ beta, observed=y, shape=x.shape[0])
    values = model.value_vars
    likelihood = model.logp(vars=model.observed_RVs)  # a sum over rows: splits by rows
    prior = model.logp(vars=model.free_RVs, jacobian=True)  # counted once, in the master
    return model, values, likelihood, prior


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)  # before building graphs
    rng = np.random.default_rng(0)
    x_data = rng.normal(size=(args.rows, args.features))
    true_beta = rng.normal(size=args.features)
    y_data = (rng.random(args.rows) < 1 / (1 + np.exp(-(x_data @ true_beta)))).astype("int64")
    model, values, likelihood, prior = build(x_data, y_data)

    x_in = pt.matrix("x_in", dtype=model["x"].dtype)
    y_in = pt.vector("y_in", dtype=model["y"].dtype)
    gradients = pytensor.grad(likelihood, values)
    parallel = synk.function(
        inputs=[x_in, y_in],
        bcast_inputs=values,
        outputs=[(likelihood, "sum")] + [(g, "sum") for g in gradients],
        givens={model["x"]: x_in, model["y"]: y_in},
    )
    synk.distribute()
    prior_fn = pytensor.function(values, [prior] + pytensor.grad(prior, values))

    x_shared = synk.data(x_data.astype(model["x"].dtype))
    y_shared = synk.data(y_data.astype(model["y"].dtype))  # PyMC keeps int data as int32
    point = {"beta": np.full(args.features, 0.1), "intercept": np.array(-0.2)}
    inputs = [point[v.name] for v in values]

    def logp_and_grad():
        lik = parallel(x_shared, y_shared, *inputs)
        pri = prior_fn(*inputs)
        return lik[0] + pri[0], [a + b for a, b in zip(lik[1:], pri[1:], strict=True)]

    logp, grad = logp_and_grad()
    pymc_logp = model.compile_logp()(point)
    pymc_dlogp = model.compile_dlogp()(point)
    np.testing.assert_allclose(logp, pymc_logp, rtol=1e-9)
    np.testing.assert_allclose(np.concatenate([np.ravel(g) for g in grad]), pymc_dlogp, rtol=1e-9)

    start = time.perf_counter()
    for _ in range(args.repeats):
        logp_and_grad()
    synk_seconds = (time.perf_counter() - start) / args.repeats
    serial = pytensor.function(values, [likelihood] + gradients)
    serial(*inputs)
    start = time.perf_counter()
    for _ in range(args.repeats):
        serial(*inputs)
    serial_seconds = (time.perf_counter() - start) / args.repeats
    print(f"logp {logp:.6f} equals PyMC's {pymc_logp:.6f}; gradient equals PyMC's dlogp")
    print(f"{args.rows} rows: {synk_seconds * 1e3:.1f} ms per logp+gradient on {n} processes, "
          f"{serial_seconds * 1e3:.1f} ms in one process ({serial_seconds / synk_seconds:.2f}x)")
    synk.close()


if __name__ == "__main__":
    main()
