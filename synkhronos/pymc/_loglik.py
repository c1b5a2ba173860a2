"""``compute_log_likelihood``: PyMC's pointwise log-likelihood with the rows divided.

For LOO and WAIC, PyMC evaluates every observation's log-likelihood at every draw of
the posterior: a map over rows, with no sum. Here each group of divided rows (see
``_split``) is one ``synk.function`` whose outputs are the observed variables'
elementwise log-probabilities, gathered by rows (op ``"gather"``); every process
computes its rows at each draw. Observed variables that are not divided are
evaluated in the master by PyMC's own compiled function. PyMC's own code turns the
results into its dataset (dims, coords), so the group equals
``pm.compute_log_likelihood``'s.
"""

from __future__ import annotations

import types
from collections.abc import Iterable

import numpy as np

from .. import data, distribute, function
from . import _pymc_compat as compat
from ._likelihood import row_terms, session_size
from ._split import _choose_split, _data_value

__all__ = ["compute_log_likelihood"]


class _PointFunction:
    """A posterior point (free variables' values by name) -> one array per name, as
    PyMC's ``apply_function_over_dataset`` calls it."""

    def __init__(self, names: list[str]):
        self.names = names
        self.parts: list = []  # (fn, row_data, free variable names, {name: output index})
        self.master = None  # (PyMC's point function, its output names)
        self.f = types.SimpleNamespace(trust_input=False)  # (PyMC sets this)

    def __call__(self, point: dict) -> list[np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for fn, row_data, free, outputs in self.parts:
            results = fn(*row_data, *[point[name] for name in free])
            found.update((name, np.asarray(results[i])) for name, i in outputs.items())
        if self.master is not None:
            fn, names = self.master
            found.update(zip(names, fn(point), strict=True))
        return [found[name] for name in self.names]

    def release(self) -> None:
        for _, row_data, _, _ in self.parts:
            for item in row_data:
                item.free_memory()


def compute_log_likelihood(idata, model=None, *, split=None, **kwargs):
    """``pm.compute_log_likelihood`` with the rows divided among the processes.

    Each process evaluates the elementwise log-likelihood of its rows at every draw of
    ``idata``'s posterior; the rows are gathered in order. Observed variables that are
    not divided (see ``split``) are evaluated in the master. Takes every keyword of the
    installed ``pm.compute_log_likelihood``, with its defaults.

    Parameters
    ----------
    idata : arviz.InferenceData
        Holds the posterior (``sample``'s or ``pm.sample``'s).
    model : pymc.Model, optional
        The model (default: the one of the current ``with`` context).
    split : str or list of str, optional
        What is divided by rows; see :func:`logp_dlogp_function`.
    **kwargs
        ``pm.compute_log_likelihood``'s: ``var_names`` (observed variables to
        evaluate, default every one), ``extend_inferencedata`` (default True: add the
        ``log_likelihood`` group to ``idata`` and return it; else return the group
        alone), ``sample_dims``, ``progressbar`` (PyMC's progress bar over the draws,
        default True), ``compile_kwargs`` and, in PyMC 6, ``backend`` (the mode of
        the master's function and of the rows' function).

    Returns
    -------
    arviz.InferenceData or xarray.Dataset
        As ``pm.compute_log_likelihood``: equal to it up to rounding.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    TypeError
        A keyword the installed ``pm.compute_log_likelihood`` does not take (before
        anything else); ``var_names`` is not a list of names; ``split`` as in
        :func:`logp_dlogp_function`.
    ValueError
        ``var_names`` names something that is not an observed variable; ``split`` as in
        :func:`logp_dlogp_function`.

    Notes
    -----
    Collective: one parallel call per draw and group of rows.
    """
    pm = compat.import_pymc()
    given = compat.bind_arguments(pm.compute_log_likelihood,
                                  "synkhronos.pymc.compute_log_likelihood", (idata,),
                                  dict(kwargs, model=model))
    defaults = compat.log_likelihood_defaults()
    var_names = given.get("var_names")
    progressbar = given.get("progressbar", defaults["progressbar"])
    sample_dims = tuple(given.get("sample_dims", defaults["sample_dims"]))
    compile_kwargs = compat.compile_kwargs(given.get("backend"),
                                                    given.get("compile_kwargs"))
    model = pm.modelcontext(model)
    if session_size() is None:
        raise RuntimeError("synk.fork() must be called before "
                           "synkhronos.pymc.compute_log_likelihood()")
    observed = {rv.name: rv for rv in model.observed_RVs}
    if var_names is None:
        names = list(observed)
    else:
        if isinstance(var_names, str) or not isinstance(var_names, Iterable):
            raise TypeError(f"var_names must be a list of observed variables' names; got "
                            f"{var_names!r}")
        names = list(var_names)
        wrong = [name for name in names if name not in observed]
        if wrong:
            raise ValueError(f"var_names must name observed variables of the model; "
                             f"{wrong[0]!r} is not one")
    plan = _choose_split(model, split)
    point_fn = _PointFunction(names)
    try:
        divided = set()
        with model:
            for group in plan.groups:
                wanted = [rv for rv in group.observed if rv.name in names]
                if not wanted:
                    continue
                terms, rows, stand_ins = row_terms(pm, model, group)
                observed_terms = terms[:len(group.observed)]  # (potentials follow)
                outputs = [(term, "gather") for rv, term in zip(group.observed,
                                                                observed_terms, strict=True)
                           if rv in wanted]
                free = [rv for rv in model.free_RVs
                        if any(stand_ins[rv] in _inputs(term) for term, _ in outputs)]
                fn = function(inputs=list(rows.values()),
                              bcast_inputs=[stand_ins[rv] for rv in free], outputs=outputs,
                              mode=compat.pymc_mode(model, compile_kwargs.get("mode")),
                              name="pymc_log_likelihood")
                distribute()
                row_data = [data(_data_value(var), name=group.roots[var]) for var in rows]
                point_fn.parts.append((fn, row_data, [rv.name for rv in free],
                                       {rv.name: i for i, rv in enumerate(wanted)}))
                divided.update(rv.name for rv in wanted)
        rest = [name for name in names if name not in divided]
        if rest:
            umodel = compat.untransformed(model)
            fn = umodel.compile_fn(inputs=umodel.value_vars,
                                   outs=umodel.logp(vars=[umodel[n] for n in rest], sum=False),
                                   on_unused_input="ignore", **compile_kwargs)
            point_fn.master = (fn, rest)
        dataset = compat.log_likelihood_dataset(point_fn, idata, model, names, progressbar,
                                                sample_dims)
    finally:
        point_fn.release()
    if given.get("extend_inferencedata", True):
        return compat.set_group(idata, "log_likelihood", dataset)
    return dataset


def _inputs(graph) -> set:
    from pytensor.graph.traversal import graph_inputs

    return set(graph_inputs([graph]))
