"""Sample a PyMC model of a large data set with its likelihood on every core.

A logistic regression written as anyone writes it in PyMC (numpy data, nothing changed
for synkhronos) is sampled twice: by ``synkhronos.pymc.sample``, which sums the
log-likelihood and its gradient over the processes, each on its own block of rows, and
keeps the prior in the master; and by ``pm.sample`` itself, with the same seed. The
posterior means must agree within 3 Monte Carlo standard errors (the demo exits with an
error otherwise); the wall times of both are printed.

Needs the ``pymc`` extra (PyMC 5.28 on Python 3.11, PyMC 6 on Python >= 3.12).

    python demos/pymc_sampling.py [--n-parallel N] [--rows 200000] [--features 10]
"""

from __future__ import annotations

import argparse
import time

import arviz as az
import numpy as np
import pymc as pm
import xarray as xr

import synkhronos as synk
import synkhronos.pymc as synk_pymc


def logistic_regression(rows: int, features: int, seed: int) -> pm.Model:
    """Generated data and the model, exactly as it would be written for PyMC alone."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    true_beta = rng.normal(scale=0.5, size=features)
    y = rng.random(rows) < 1 / (1 + np.exp(-(x @ true_beta - 0.5)))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 1, shape=features)
        intercept = pm.Normal("intercept", 0, 2)
        pm.Bernoulli("y", logit_p=intercept + x @ beta, observed=y.astype("int64"))
    return model


def mcse(draws: xr.DataArray) -> np.ndarray:
    """ArviZ's Monte Carlo standard error of each component's posterior mean (draws
    with ``chain`` and ``draw`` dimensions), flattened."""
    return az.mcse(xr.Dataset({"draws": draws}), method="mean")["draws"].values.ravel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--tune", type=int, default=500)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    n = synk.fork(args.n_parallel)
    model = logistic_regression(args.rows, args.features, args.seed)
    options = dict(draws=args.draws, tune=args.tune, chains=args.chains,
                   random_seed=args.seed, progressbar=False, compute_convergence_checks=False)

    start = time.perf_counter()
    parallel = synk_pymc.sample(model=model, **options)
    parallel_seconds = time.perf_counter() - start
    start = time.perf_counter()
    serial = pm.sample(model=model, nuts_sampler="pymc", cores=1, **options)
    serial_seconds = time.perf_counter() - start

    worst = 0.0
    for name in ("beta", "intercept"):
        a, b = parallel.posterior[name].values, serial.posterior[name].values
        gap = np.abs(a.mean(axis=(0, 1)) - b.mean(axis=(0, 1))).ravel()
        error = np.sqrt(mcse(parallel.posterior[name]) ** 2 + mcse(serial.posterior[name]) ** 2)
        worst = max(worst, float(np.max(gap / error)))
        print(f"{name}: synkhronos {np.round(a.mean(axis=(0, 1)), 3)}, "
              f"PyMC {np.round(b.mean(axis=(0, 1)), 3)}")
    if worst > 3:
        raise SystemExit(f"posterior means differ by {worst:.2f} MCSE (more than 3)")
    synk.close()
    print(f"pymc_sampling passed on {n} processes: means within {worst:.2f} MCSE of pm.sample; "
          f"{args.rows} rows, {args.chains} chains of {args.tune}+{args.draws}: "
          f"{parallel_seconds:.1f} s (synkhronos.pymc.sample) vs {serial_seconds:.1f} s "
          f"(pm.sample, one BLAS thread), compile included")


if __name__ == "__main__":
    main()
