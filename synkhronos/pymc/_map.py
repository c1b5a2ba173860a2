"""``find_MAP``: the maximum a posteriori point over the divided log-density.

``pm.find_MAP`` maximises the model's log-density without the transforms' Jacobians,
from the model's initial point (PyMC 6: optionally jittered), with the gradient. Here
the same optimisation, as the installed PyMC runs it (``_pymc_compat.map_minimize``),
runs over the divided log-density (the likelihood on every process, the prior in the
master). The call is bound by the installed ``pm.find_MAP``'s own signature, so its
positional and keyword arguments, PyMC 5's and 6's alike, mean what they mean there.
"""

from __future__ import annotations

import numpy as np

from . import _pymc_compat as compat
from ._likelihood import build_logp_dlogp, check_grainsize, session_size

__all__ = ["find_MAP"]

_CALLED = "synkhronos.pymc.find_MAP"
# PyMC 6's renamed keywords (the old names still work there, with a FutureWarning).
_RENAMED = {"start": "initvals", "seed": "random_seed"}


def find_MAP(*args, split=None, grainsize=None, **kwargs):
    """``pm.find_MAP`` with the observed log-likelihood evaluated on every process.

    Takes every argument of the installed ``pm.find_MAP``, by position or by name, as
    it does (PyMC 5: ``start, vars, method, return_raw, include_transformed,
    progressbar, progressbar_theme, maxeval, model, *args, seed, **kwargs``; PyMC 6:
    ``method, *, vars, use_grad, initvals, jitter, jitter_max_retries, random_seed,
    progressbar, idata_kwargs, model, backend, compile_kwargs, **optimizer_kwargs`` and
    its deprecated names), and gives what it gives: the values at the optimum by name.

    Parameters
    ----------
    *args, **kwargs
        ``pm.find_MAP``'s: the starting values, the variables optimised (``vars``; the
        others stay at their starting values), the method (scipy's ``minimize``; PyMC 6
        also ``"basinhopping"``), the progress bar, the evaluation limit (PyMC 5's
        ``maxeval``) and what goes on to the optimizer, ``model`` (default: the one of
        the current ``with`` context) included; a model passed first is the model
        (``find_MAP(model)``), as no first argument of ``pm.find_MAP`` is one.
    split, grainsize
        What is divided by rows, and in what slices; see :func:`logp_dlogp_function`.

    Returns
    -------
    dict or (dict, OptimizeResult)
        The values at the optimum by name (and with ``return_raw`` the optimizer's
        result), as ``pm.find_MAP`` returns them.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    TypeError
        An argument the installed ``pm.find_MAP`` does not take, or a model passed
        positionally after the first argument (pass ``model=``; as the first one it is
        taken as the model); one that needs second derivatives
        (``use_hess``, ``use_hessp``, ``compute_hessian``: the divided log-density
        has a gradient only) or another return type (``return_inferencedata=True``).
        All before anything is computed.
    ValueError
        As :func:`logp_dlogp_function`; PyMC 6: an old and a new name of one keyword.
    """
    pm = compat.import_pymc()
    if args and isinstance(args[0], pm.Model) and "model" not in kwargs:
        # find_MAP(model): no first argument of pm.find_MAP is a model, so this one
        # means what synkhronos's own signature said it means
        kwargs["model"], args = args[0], args[1:]
    given = compat.bind_arguments(pm.find_MAP, _CALLED, args, kwargs)
    if any(isinstance(value, pm.Model) for name, value in given.items() if name != "model"):
        raise TypeError(f"{_CALLED}() takes pm.find_MAP's positional arguments; pass the "
                        "model as model=...")
    if isinstance(given.get("method"), dict):  # PyMC 6 takes a start point there
        given["start"] = given.pop("method")
    for old, new in _RENAMED.items():
        if old in given and "initvals" in compat.map_parameters():
            if given.get(new) is not None:
                raise ValueError(f"Cannot pass both `{old}` and `{new}`; `{old}` is "
                                 "deprecated.")
            given[new] = given.pop(old)
    for name in ("use_hess", "use_hessp", "compute_hessian"):
        if given.pop(name, None):
            raise TypeError(f"{_CALLED}() cannot honour {name}=True: the divided "
                            "log-density has a gradient but no second derivatives")
    if given.pop("return_inferencedata", False):
        raise TypeError(f"{_CALLED}() cannot honour return_inferencedata=True: it "
                        "returns the dict of values, as pm.find_MAP(return_inferencedata="
                        "False) does")
    grainsize = check_grainsize(grainsize)
    model = pm.modelcontext(given.pop("model", None))
    if session_size() is None:
        raise RuntimeError(f"synk.fork() must be called before {_CALLED}()")
    return _find_map(pm, model, split, grainsize, given)


def _find_map(pm, model, split, grainsize, given: dict):
    """The optimisation, with ``given`` (the bound arguments) in PyMC 5's or 6's names."""
    start = given.pop("initvals", given.pop("start", None))
    seed = given.pop("random_seed", given.pop("seed", None))
    jitter = bool(given.pop("jitter", False))
    retries = given.pop("jitter_max_retries", 10)
    user_vars = given.pop("vars", None)
    return_raw = given.pop("return_raw", False)
    idata_kwargs = dict(given.pop("idata_kwargs", None) or {})
    include_transformed = given.pop("include_transformed",
                                    idata_kwargs.get("include_transformed", True))
    progressbar = given.pop("progressbar", True)
    theme = given.pop("progressbar_theme", None)
    maxeval = given.pop("maxeval", None)
    if "initvals" in compat.map_parameters():
        if maxeval is not None:  # PyMC 6's old name of scipy's maxiter
            given.setdefault("maxiter", maxeval)
    elif maxeval is None:
        maxeval = 5000  # PyMC 5's default: evaluations
    compile_kwargs = compat.resolved_compile_kwargs(given.pop("backend", None),
                                                    given.pop("compile_kwargs", None))
    method, use_grad = compat.map_method(given.pop("method", "L-BFGS-B"),
                                         given.pop("use_grad", None), given)
    args = tuple(given.pop("args", ()))
    rng = np.random.default_rng(seed)  # (PyMC 6: the jitter's seeds and basinhopping's)
    vgf, op = build_logp_dlogp(pm, model, split, grainsize, jacobian=False,
                               caller="find_MAP", compile_kwargs=compile_kwargs)
    try:
        vgf.set_extra_values({})
        values = model.continuous_value_vars
        chosen = (set(values) if user_vars is None
                  else set(compat.map_value_vars(model, user_vars)) & set(values))
        if not chosen:
            raise ValueError("Model has no unobserved continuous variables.")
        point_fn = compat.map_start_fn(model, start, chosen if jitter else set())
        shapes = {v.name: np.shape(model.initial_point()[v.name]) for v in values}
        sizes = [int(np.prod(shapes[v.name], dtype=int)) for v in values]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        entries = np.concatenate([np.arange(offsets[i], offsets[i + 1])
                                  for i, v in enumerate(values) if v in chosen]).astype(int)

        def flat(point):
            return np.concatenate([np.ravel(point[v.name]) for v in values]).astype("float64")

        point = point_fn(int(rng.integers(2**30)) if jitter else seed)
        for _ in range(retries if jitter else 0):  # as PyMC 6: a finite jittered start
            if np.isfinite(vgf(flat(point))[0]):
                break
            point = point_fn(int(rng.integers(2**30)))
        whole = flat(point)

        def fused(x):
            full = whole.copy()
            full[entries] = x
            logp, dlogp = vgf(full)
            return float(logp), np.asarray(dlogp, dtype="float64")[entries]

        x, result = compat.map_minimize(fused, whole[entries], method, use_grad, progressbar,
                                        theme, maxeval, args, given, rng)
        optimum = whole.copy()
        optimum[entries] = x
        found = dict(point)
        for v, begin, end in zip(values, offsets[:-1], offsets[1:], strict=True):
            found[v.name] = optimum[begin:end].reshape(shapes[v.name]).astype(v.dtype)
        estimate = compat.map_point(model, found, include_transformed)
    finally:
        if op is not None:
            op.release()
    return (estimate, result) if return_raw else estimate
