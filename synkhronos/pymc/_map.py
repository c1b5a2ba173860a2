"""``find_MAP``: the maximum a posteriori point over the divided log-density.

``pm.find_MAP`` maximises the model's log-density without the transforms' Jacobians,
from the model's initial point, with scipy's ``minimize`` (L-BFGS-B by default) and
the gradient. Here the same optimisation runs over the divided log-density (the
likelihood on every process, the prior in the master).
"""

from __future__ import annotations

import numpy as np

from . import _pymc_compat as compat
from ._likelihood import build_logp_dlogp, check_grainsize

__all__ = ["find_MAP"]


def find_MAP(model=None, *, split=None, grainsize=None, start=None, method="L-BFGS-B",
             return_raw=False, include_transformed=True, maxeval=5000, seed=None,
             **kwargs):
    """``pm.find_MAP`` with the observed log-likelihood evaluated on every process.

    Parameters
    ----------
    model : pymc.Model, optional
        The model (default: the one of the current ``with`` context).
    split, grainsize
        What is divided by rows, and in what slices; see :func:`logp_dlogp_function`.
    start : dict, optional
        Starting values, as ``pm.find_MAP``'s ``start`` (default: the initial point).
    method : str, default "L-BFGS-B"
        A gradient-based method of ``scipy.optimize.minimize``.
    return_raw : bool, default False
        Also return scipy's ``OptimizeResult``.
    include_transformed : bool, default True
        Include the transformed values, as ``pm.find_MAP``.
    maxeval : int, default 5000
        At most this many iterations (scipy's ``maxiter``).
    seed : int, optional
        Seed of the starting point (as ``pm.find_MAP``; there is no jitter).
    **kwargs
        Passed to ``scipy.optimize.minimize`` (``tol``, ``options``, ...).

    Returns
    -------
    dict or (dict, OptimizeResult)
        The values at the optimum by name, as ``pm.find_MAP`` returns them.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    TypeError, ValueError
        As :func:`logp_dlogp_function`.
    """
    from scipy.optimize import minimize

    grainsize = check_grainsize(grainsize)
    pm = compat.import_pymc()
    model = pm.modelcontext(model)
    vgf, op = build_logp_dlogp(pm, model, split, grainsize, jacobian=False)
    try:
        vgf.set_extra_values({})
        point = compat.start_point_fn(model, start)(seed)
        values = model.continuous_value_vars
        shapes = [np.shape(point[v.name]) for v in values]
        x0 = np.concatenate([np.ravel(point[v.name]) for v in values]).astype("float64")

        def cost(x):
            logp, dlogp = vgf(x)
            return -float(logp), -np.asarray(dlogp, dtype="float64")

        options = dict(kwargs.pop("options", None) or {})
        options.setdefault("maxiter", maxeval)
        result = minimize(cost, x0, jac=True, method=method, options=options, **kwargs)
        found, begin = dict(point), 0
        for v, shape in zip(values, shapes, strict=True):
            size = int(np.prod(shape, dtype=int))
            found[v.name] = result.x[begin:begin + size].reshape(shape).astype(v.dtype)
            begin += size
        estimate = compat.map_point(model, found, include_transformed)
    finally:
        if op is not None:
            op.release()
    return (estimate, result) if return_raw else estimate
