"""Which observed variables and data rows a model's log-likelihood divides into.

Step 1 of :mod:`synkhronos.pymc`: from the model and the user's ``split``, the observed
variables summed on every process, the ones left to the master, and the data
variables (``pm.Data`` containers, observed values, anonymous array constants) divided
by rows. Nothing is compiled or moved here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np


@dataclasses.dataclass
class _Split:
    """What the model's log-likelihood divides into.

    ``observed``: observed variables summed on every process; ``master_observed``: the
    other observed variables (their log-probability stays in the master); ``roots``:
    the data variables divided by rows, with a label for messages; ``rows``: their
    common length.
    """

    observed: list
    master_observed: list
    roots: dict
    rows: int


def _data_value(var) -> np.ndarray | None:
    """The array a data variable holds (a shared variable's value or a constant)."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.tensor.variable import TensorConstant

    if isinstance(var, SharedVariable):
        value = var.get_value(borrow=True)
        return value if isinstance(value, np.ndarray) else None
    if isinstance(var, TensorConstant):
        return np.asarray(var.data)
    return None


def _rows_of(var) -> int | None:
    """The first-axis length of a data variable, or None (not an array of rows)."""
    value = _data_value(var)
    return value.shape[0] if value is not None and value.ndim >= 1 else None


def _data_roots(graphs: list, model) -> list:
    """The data variables that ``graphs`` read, not looking into free variables."""
    from pytensor.graph.traversal import graph_inputs

    blockers = list(model.free_RVs)
    return [var for var in graph_inputs(graphs, blockers=blockers)
            if var not in blockers and _rows_of(var) is not None]


def _observed_rows(model, rv) -> int | None:
    """The number of rows of an observed variable's data, or None if it has no rows."""
    value = model.rvs_to_values[rv]
    if value.ndim == 0:
        return None
    lengths = {_rows_of(root) for root in _data_roots([value], model)
               if root.ndim == value.ndim}
    return lengths.pop() if len(lengths) == 1 else None


def _label(var) -> str:
    return repr(var.name) if var.name else f"an unnamed {var.type} constant"


def _choose_split(model, split) -> _Split:
    """Step 1: the observed variables and data variables that are divided by rows."""
    from pytensor.compile.sharedvalue import SharedVariable

    observed = list(model.observed_RVs)
    if not observed:
        raise ValueError("the model has no observed variables: there is no likelihood to "
                         "divide by rows")
    lengths = {rv: _observed_rows(model, rv) for rv in observed}
    named: list = []
    if split is None:
        chosen = [rv for rv in observed if lengths[rv] is not None]
        if not chosen:
            raise ValueError("no observed variable of the model has rows of data to divide "
                             "(every observed value is a scalar)")
    else:
        names = [split] if isinstance(split, str) else split
        if not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"split must be a name or a list of names of pm.Data containers "
                            f"and observed variables; got {split!r}")
        names = list(names)
        if not names:
            raise ValueError("split must name at least one pm.Data container or observed "
                             "variable")
        chosen = []
        for name in names:
            var = model.named_vars.get(name)
            if var is None:
                raise ValueError(f"split names {name!r}, which is not a variable of the model")
            if var in observed:
                chosen.append(var)
            elif isinstance(var, SharedVariable) and _rows_of(var) is not None:
                named.append(var)
            else:
                raise ValueError(f"split names {name!r}, which is neither a pm.Data container "
                                 "with rows nor an observed variable")
        for rv in observed:  # an observed variable that reads a divided container is divided
            if rv not in chosen and any(
                root in named for root in _data_roots([rv, model.rvs_to_values[rv]], model)
            ):
                chosen.append(rv)
        for var in named:
            if not any(var in _data_roots([rv, model.rvs_to_values[rv]], model)
                       for rv in chosen):
                raise ValueError(f"split names {var.name!r}, which no observed variable's "
                                 "likelihood reads")
        unsplittable = [rv.name for rv in chosen if lengths[rv] is None]
        if unsplittable:
            raise ValueError(f"split names observed variable {unsplittable[0]!r}, whose data "
                             "have no rows to divide")
    counts = {n for n in (lengths[rv] for rv in chosen) if n is not None}
    if len(counts) > 1:
        listed = ", ".join(f"{rv.name!r}: {lengths[rv]}" for rv in chosen)
        raise ValueError(f"the observed variables have different numbers of rows ({listed});"
                         " pass split=[...] naming the ones to divide")
    rows = counts.pop()
    roots: dict = {}
    for rv in chosen:
        value = model.rvs_to_values[rv]
        value_roots = _data_roots([value], model)
        for root in _data_roots([rv, value], model):
            if root in roots:
                continue
            length = _rows_of(root)
            required = root in named or root in value_roots
            if required and length != rows:
                raise ValueError(f"split divides {_label(root)} by rows, but it has {length} "
                                 f"rows and the observed data {rows}")
            # Named containers and observed values are always divided; the default also
            # divides every container of the observations' length; anonymous constants
            # of that length are divided either way (they cannot be named).
            if required or (length == rows and (
                split is None or not isinstance(root, SharedVariable)
            )):
                roots[root] = root.name or f"rows{len(roots)}"
    master_observed = [rv for rv in observed if rv not in chosen]
    return _Split(chosen, master_observed, roots, rows)
