"""A zoo of PyMC models as PyMC's documentation and examples write them.

Each builder returns ``(model, split)``: the model, unmodified, and the ``split`` a user
passes for it (None: the default). Small data: the zoo compares log-densities, it does
not sample.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt

ROWS = 101  # uneven over 2 and 3 processes


def _rng(seed):
    return np.random.default_rng(seed)


def glm_numpy():
    """Linear regression, numpy arrays, no shape= on the data."""
    rng = _rng(1)
    x = rng.normal(size=(ROWS, 3))
    y = x @ np.array([1.0, -0.5, 0.2]) + rng.normal(size=ROWS)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 1, shape=3)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", x @ beta, sigma, observed=y)
    return model, None


def glm_data():
    """Logistic regression with pm.Data containers."""
    rng = _rng(2)
    x = rng.normal(size=(ROWS, 2))
    y = (rng.random(ROWS) < 0.4).astype("int64")
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y_data", y)
        beta = pm.Normal("beta", 0, 1, shape=2)
        alpha = pm.Normal("alpha", 0, 2)
        pm.Bernoulli("y", logit_p=alpha + pm.math.dot(xd, beta), observed=yd)
    return model, None


def dims_coords():
    """Poisson regression written with coords and dims."""
    rng = _rng(3)
    x = rng.normal(size=(ROWS, 2))
    y = rng.poisson(2.0, size=ROWS)
    coords = {"obs": np.arange(ROWS), "feature": ["a", "b"]}
    with pm.Model(coords=coords) as model:
        xd = pm.Data("x", x, dims=("obs", "feature"))
        beta = pm.Normal("beta", 0, 0.5, dims="feature")
        intercept = pm.Normal("intercept", 0, 1)
        pm.Poisson("y", pm.math.exp(intercept + pm.math.dot(xd, beta)), observed=y,
                   dims="obs")
    return model, None


def hierarchical():
    """Varying intercepts: a group index container, non-centred."""
    rng = _rng(4)
    groups = 5
    g = rng.integers(groups, size=ROWS)
    y = rng.normal(size=groups)[g] + rng.normal(size=ROWS)
    with pm.Model(coords={"group": range(groups)}) as model:
        gd = pm.Data("g", g)
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        z = pm.Normal("z", 0, 1, dims="group")
        sigma = pm.Exponential("sigma", 1)
        pm.Normal("y", mu + tau * z[gd], sigma, observed=y)
    return model, None


def mixture():
    """A two-component normal mixture."""
    rng = _rng(5)
    y = np.concatenate([rng.normal(-1, 0.5, ROWS // 2), rng.normal(2, 0.5, ROWS - ROWS // 2)])
    with pm.Model() as model:
        w = pm.Dirichlet("w", np.ones(2))
        mu = pm.Normal("mu", np.array([-1.0, 1.0]), 2, shape=2,
                       transform=pm.distributions.transforms.ordered)
        sigma = pm.HalfNormal("sigma", 1, shape=2)
        pm.NormalMixture("y", w=w, mu=mu, sigma=sigma, observed=y)
    return model, None


def censored():
    """Censored normal observations."""
    rng = _rng(6)
    y = np.clip(rng.normal(0.5, 1, size=ROWS), -1, 1.5)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Censored("y", pm.Normal.dist(mu, sigma), lower=-1, upper=1.5, observed=y)
    return model, None


def truncated():
    """A truncated normal likelihood with a predictor."""
    rng = _rng(7)
    x = rng.normal(size=ROWS)
    y = np.abs(rng.normal(1 + 0.5 * x, 1)) + 0.01
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1)
        a = pm.Normal("a", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Truncated("y", pm.Normal.dist(a + b * x, sigma), lower=0, upper=20, observed=y)
    return model, None


def zero_inflated():
    """Zero-inflated Poisson counts."""
    rng = _rng(8)
    y = rng.poisson(3, size=ROWS) * (rng.random(ROWS) > 0.3)
    with pm.Model() as model:
        psi = pm.Beta("psi", 1, 1)
        mu = pm.Exponential("mu", 0.5)
        pm.ZeroInflatedPoisson("y", psi=psi, mu=mu, observed=y)
    return model, None


def ordinal():
    """Ordered-logistic regression with ordered cutpoints."""
    rng = _rng(9)
    x = rng.normal(size=ROWS)
    y = rng.integers(4, size=ROWS)
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1)
        cut = pm.Normal("cut", np.arange(3.0) - 1, 2, shape=3,
                        transform=pm.distributions.transforms.ordered)
        pm.OrderedLogistic("y", eta=b * x, cutpoints=cut, observed=y)
    return model, None


def mv_normal():
    """A bivariate normal over rows, LKJ prior on its Cholesky factor."""
    rng = _rng(10)
    y = rng.multivariate_normal([0.5, -0.5], [[1, 0.5], [0.5, 2]], size=ROWS)
    with pm.Model() as model:
        chol, _, _ = pm.LKJCholeskyCov("chol", n=2, eta=2, sd_dist=pm.HalfNormal.dist(1),
                                       compute_corr=True)
        mu = pm.Normal("mu", 0, 1, shape=2)
        pm.MvNormal("y", mu, chol=chol, observed=y)
    return model, None


def multinomial():
    """Multinomial counts, a row's total and its softmax probabilities by row."""
    rng = _rng(11)
    n = rng.integers(5, 15, size=ROWS)
    x = rng.normal(size=ROWS)
    y = np.stack([rng.multinomial(k, [0.2, 0.3, 0.5]) for k in n])
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=3)
        a = pm.Normal("a", 0, 1, shape=3)
        p = pm.math.softmax(a + x[:, None] * b, axis=-1)
        pm.Multinomial("y", n=n, p=p, observed=y)
    return model, None


def dirichlet_multinomial():
    """Overdispersed counts: Dirichlet-multinomial with a shared concentration."""
    rng = _rng(12)
    n = np.full(ROWS, 20)
    y = np.stack([rng.multinomial(20, rng.dirichlet([2, 3, 5])) for _ in range(ROWS)])
    with pm.Model() as model:
        alpha = pm.Gamma("alpha", 2, 0.5, shape=3)
        pm.DirichletMultinomial("y", n=n, a=alpha, observed=y)
    return model, None


def two_datasets():
    """Two observed variables of different lengths, each with its own predictor."""
    rng = _rng(13)
    x1, x2 = rng.normal(size=ROWS), rng.normal(size=37)
    with pm.Model() as model:
        x1d = pm.Data("x1", x1)
        x2d = pm.Data("x2", x2)
        b = pm.Normal("b", 0, 1)
        s1 = pm.HalfNormal("s1", 1)
        s2 = pm.HalfNormal("s2", 1)
        pm.Normal("obs1", b * x1d, s1, observed=0.7 * x1 + rng.normal(size=ROWS))
        pm.StudentT("obs2", nu=4, mu=b * x2d + 1, sigma=s2,
                    observed=0.7 * x2 + 1 + rng.normal(size=37))
    return model, ["obs1", "x1", "obs2", "x2"]


def missing_values():
    """An observed value with missing entries: PyMC imputes them."""
    rng = _rng(14)
    x = rng.normal(size=ROWS)
    y = 1 + 0.5 * x + rng.normal(size=ROWS)
    y[rng.choice(ROWS, 9, replace=False)] = np.nan
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a + b * x, sigma, observed=np.ma.masked_invalid(y))
    return model, None


def potential():
    """A likelihood written as a Potential over pm.Data rows."""
    rng = _rng(15)
    x = rng.normal(size=ROWS)
    y = 2 * x + rng.normal(size=ROWS)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y", y)
        b = pm.Normal("b", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Potential("lik", pm.logp(pm.Normal.dist(b * xd, sigma), yd).sum())
        pm.Potential("shrink", -pt.abs(b))  # a prior term: stays in the master
    return model, ["lik", "x", "y"]


ZOO = {f.__name__: f for f in [
    glm_numpy, glm_data, dims_coords, hierarchical, mixture, censored, truncated,
    zero_inflated, ordinal, mv_normal, multinomial, dirichlet_multinomial, two_datasets,
    missing_values, potential,
]}
