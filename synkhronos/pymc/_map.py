"""``find_MAP``: ``pm.find_MAP`` on the rewritten model.

``pm.find_MAP`` itself, every argument as the installed PyMC (5 or 6) takes it, on the
model whose divided terms are one term over the row-sum Op (``_model``): the
likelihood on every process, the prior and the optimiser's loop in the master. What
needs second derivatives (the Op has a gradient only) or would return an
InferenceData of the rewritten model is refused before anything is computed.
"""

from __future__ import annotations

import inspect

from . import _pymc_compat as compat
from ._likelihood import build, check_grainsize, session_size
from ._model import named_keys, variables

__all__ = ["find_MAP"]

_CALLED = "synkhronos.pymc.find_MAP"


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
    backend
        PyMC 6's (the mode of its functions and of the rows'); on PyMC 5 the rows'
        alone, ``"c"``, ``"numba"`` or ``"jax"``.

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
    for name in ("use_hess", "use_hessp", "compute_hessian"):
        if given.get(name):
            raise TypeError(f"{_CALLED}() cannot honour {name}=True: the divided "
                            "log-density has a gradient but no second derivatives")
    if given.get("return_inferencedata"):
        raise TypeError(f"{_CALLED}() cannot honour return_inferencedata=True: it "
                        "returns the dict of values, as pm.find_MAP(return_inferencedata="
                        "False) does")
    grainsize = check_grainsize(grainsize)
    model = pm.modelcontext(given.get("model"))
    if session_size() is None:
        raise RuntimeError(f"synk.fork() must be called before {_CALLED}()")
    if "backend" in inspect.signature(pm.find_MAP).parameters:
        compile_kwargs = compat.compile_kwargs(given.get("backend"),
                                               given.get("compile_kwargs"))
    else:  # PyMC 5: the rows' backend alone (its find_MAP compiles in the default mode)
        compile_kwargs = compat.compile_kwargs(given.pop("backend", None),
                                               given.pop("compile_kwargs", None))
    rewritten, op = build(pm, model, split, grainsize, caller="find_MAP",
                          compile_kwargs=compile_kwargs)
    try:
        given["model"] = rewritten
        if "vars" in given:
            given["vars"] = variables(model, rewritten, given["vars"])
        for name in ("start", "initvals"):
            if name in given:
                given[name] = named_keys(given[name])
        return compat.call_bound(pm.find_MAP, given)
    finally:
        if op is not None:
            op.release()
