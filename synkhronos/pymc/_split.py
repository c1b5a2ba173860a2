"""Which observed variables and data rows a model's log-likelihood divides into.

Step 1 of :mod:`synkhronos.pymc`: from the model and the user's ``split``, the observed
variables summed on every process, the ones left to the master, and the data
variables (``pm.Data`` containers, observed values, anonymous array constants) divided
by rows. Nothing is compiled or moved here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import clone_replace, graph_replace
from pytensor.graph.traversal import ancestors, graph_inputs
from pytensor.tensor.subtensor import AdvancedSubtensor
from pytensor.tensor.variable import TensorConstant

from . import _pymc_compat as compat


@dataclasses.dataclass
class _Group:
    """Terms divided on the same rows (one group a length; ``_likelihood._join`` runs
    every group in one ``synk.function``).

    ``observed``: observed variables whose log-probability is summed by rows;
    ``potentials``: ``pm.Potential`` terms named in ``split`` (sums over these rows);
    ``roots``: the data variables divided by rows, with a label for messages;
    ``rows``: their common length; ``graphs``: each observed variable's graph with its
    row selections moved onto the data (see ``_move_masks``).
    """

    observed: list
    potentials: list
    roots: dict
    rows: int
    graphs: dict = dataclasses.field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [var.name for var in [*self.observed, *self.potentials]]


@dataclasses.dataclass
class _Split:
    """What the model's log-likelihood divides into.

    ``groups``: the divided terms, one group per number of rows (two datasets in one
    model are two groups); ``master_observed`` and ``master_potentials``: the terms
    left to the master.
    """

    groups: list[_Group]
    master_observed: list
    master_potentials: list


def _data_value(var) -> np.ndarray | None:
    """The array a data variable holds (a shared variable's value or a constant)."""
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


def _move_masks(model, rv):
    """``rv`` with each selection of rows by a boolean constant moved onto the data.

    PyMC's automatic imputation (``observed=np.ma.masked_invalid(y)``) makes the observed
    part a variable whose parameters are ``expr[mask]``: ``expr`` over every row of the
    data, ``mask`` its observed rows. Divided as it is, each process would compute
    ``expr`` on every row. Here ``expr`` is rebuilt on the data's observed rows
    (``x[mask]`` for each data variable of the mask's length), which equals
    ``expr[mask]`` for a row-wise ``expr``; the check at a jittered point (against
    PyMC's own log-probability) refuses the rest. Returns ``rv`` itself when it holds no
    such selection.
    """
    # Cloning stops at stand-ins for the free variables, put back at the end.
    stand_ins = {free: free.type(name=free.name) for free in model.free_RVs}
    replace = {}
    for var in ancestors([rv], blockers=list(model.free_RVs)):
        node = var.owner
        if node is None or not isinstance(node.op, AdvancedSubtensor) or len(node.inputs) != 2:
            continue
        expr, mask = node.inputs
        if not (isinstance(mask, TensorConstant) and mask.dtype == "bool" and mask.ndim == 1):
            continue
        selector = np.asarray(mask.data)
        length = selector.shape[0]
        rows = {root: pt.constant(_data_value(root)[selector], name=root.name and
                                  f"{root.name}[observed]")
                for root in _data_roots([expr], model) if _rows_of(root) == length}
        if not rows:
            raise ValueError(f"observed variable {rv.name!r} selects its observed rows "
                             f"from a graph that reads no data of {length} rows: it cannot "
                             "be divided by rows; pass split=[...] without it")
        replace[var] = clone_replace(expr, {**stand_ins, **rows}, rebuild_strict=False)
    if not replace:
        return rv
    moved = clone_replace(rv, {**stand_ins, **replace}, rebuild_strict=False)
    return graph_replace(moved, {new: free for free, new in stand_ins.items()}, strict=False)


def _inline_graphs(model, rv):
    """``rv`` with the inner graph of each ``OpFromGraph`` in its parameters written out.

    Such an Op (PyTensor 3's ``Softmax``, a user's ``OpFromGraph``) keeps its inner
    graph's static shapes, here the whole data's: rebuilt on a process's rows it would
    fix them (``SpecifyShape(x, 101, 3)``). Written out, its nodes are made again from
    the rows like any other. Random variables built as inner graphs are rebuilt from
    their own constructor instead (``_likelihood``). Returns ``rv`` itself when it
    holds no such Op.
    """
    def written_out(node):
        return dict(zip(node.outputs, compat.inline_inner_graph(node), strict=True))

    graph = rv
    for _ in range(16):  # an inner graph may hold another such Op
        replace = {}
        for var in ancestors(graph.owner.inputs, blockers=list(model.free_RVs)):
            node = var.owner
            if (node is not None and isinstance(node.op, OpFromGraph)
                    and not compat.is_symbolic_rv(node.op)
                    and var not in replace):
                replace.update(written_out(node))
        if not replace:
            return graph
        graph = graph_replace(graph, replace, strict=False)
    return graph


def _names(split) -> list[str]:
    names = [split] if isinstance(split, str) else split
    if not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"split must be a name or a list of names of pm.Data containers, "
                        f"observed variables and potentials; got {split!r}")
    names = list(names)
    if not names:
        raise ValueError("split must name at least one pm.Data container, observed variable "
                         "or potential")
    return names


def _potential_rows(model, potential, named: list) -> int:
    """The rows a named Potential sums over: the length of the named containers it
    reads (all alike)."""
    lengths: set[int] = {_rows_of(root) for root in _data_roots([potential], model)  # type: ignore[misc]
                         if root in named}
    if not lengths:
        raise ValueError(f"split names potential {potential.name!r}, which reads none of the "
                         "pm.Data containers split names; name the containers whose rows it "
                         "sums over")
    if len(lengths) > 1:
        raise ValueError(f"split names potential {potential.name!r}, which reads named "
                         f"containers of different lengths ({sorted(lengths)})")
    return lengths.pop()


def _choose_split(model, split) -> _Split:
    """Step 1: the observed variables, potentials and data variables divided by rows."""
    observed = list(model.observed_RVs)
    if not observed and split is None:
        if model.potentials:
            names = [p.name for p in model.potentials]
            raise ValueError(
                f"the model has no observed variables, and its potentials {names} are "
                "divided only when named: pass split=[the potential's name, the pm.Data "
                f"containers whose rows it sums over], e.g. split=[{names[0]!r}, 'x']")
        raise ValueError("the model has no observed variables: there is no likelihood to "
                         "divide by rows")
    lengths: dict[Any, Any] = {rv: _observed_rows(model, rv) for rv in observed}
    graphs = {rv: _inline_graphs(model, _move_masks(model, rv)) if lengths[rv] is not None
              else rv for rv in observed}
    named: list = []
    potentials: list = []
    if split is None:
        chosen = [rv for rv in observed if lengths[rv] is not None]
        if not chosen:
            raise ValueError("no observed variable of the model has rows of data to divide "
                             "(every observed value is a scalar)")
        counts = {lengths[rv] for rv in chosen}
        if len(counts) > 1:
            listed = ", ".join(f"{rv.name!r}: {lengths[rv]}" for rv in chosen)
            every = [rv.name for rv in chosen]
            raise ValueError(
                f"the observed variables have different numbers of rows ({listed}); by "
                f"default one length is divided. Name them to divide each on its own rows, "
                f"with the pm.Data containers each reads by rows: split={every!r} + "
                "[containers]; or name one of them to divide it alone")
    else:
        chosen = []
        for name in _names(split):
            var = model.named_vars.get(name)
            if var is None:
                raise ValueError(f"split names {name!r}, which is not a variable of the model")
            if var in observed:
                chosen.append(var)
            elif var in model.potentials:
                potentials.append(var)
            elif isinstance(var, SharedVariable) and _rows_of(var) is not None:
                named.append(var)
            else:
                raise ValueError(f"split names {name!r}, which is neither a pm.Data container "
                                 "with rows, an observed variable nor a potential")
        for rv in observed:  # an observed variable that reads a divided container is divided
            if rv not in chosen and any(
                root in named for root in _data_roots([graphs[rv], model.rvs_to_values[rv]],
                                                      model)
            ):
                chosen.append(rv)
        for var in named:
            if not any(var in _data_roots([graphs[rv], model.rvs_to_values[rv]], model)
                       for rv in chosen) and not any(
                    var in _data_roots([p], model) for p in potentials):
                raise ValueError(f"split names {var.name!r}, which no observed variable's "
                                 "likelihood or named potential reads")
        unsplittable = [rv.name for rv in chosen if lengths[rv] is None]
        if unsplittable:
            raise ValueError(f"split names observed variable {unsplittable[0]!r}, whose data "
                             "have no rows to divide")
    by_rows: dict[int, _Group] = {}
    for rv in chosen:
        by_rows.setdefault(lengths[rv], _Group([], [], {}, lengths[rv])).observed.append(rv)
    for pot in potentials:
        rows = _potential_rows(model, pot, named)
        by_rows.setdefault(rows, _Group([], [], {}, rows)).potentials.append(pot)
    for group in by_rows.values():
        group.graphs = {rv: graphs[rv] for rv in group.observed}
        read = [*group.graphs.values(), *[model.rvs_to_values[rv] for rv in group.observed],
                *group.potentials]
        value_roots = _data_roots([model.rvs_to_values[rv] for rv in group.observed], model)
        for root in _data_roots(read, model):
            length = _rows_of(root)
            required = root in named or root in value_roots
            if required and length != group.rows:
                raise ValueError(f"split divides {_label(root)} by rows, but it has {length} "
                                 f"rows and the observed data of {group.names} have "
                                 f"{group.rows}")
            # Named containers and observed values are always divided; the default also
            # divides every container of the observations' length; anonymous constants
            # of that length are divided either way (they cannot be named).
            if required or (length == group.rows and (
                split is None or not isinstance(root, SharedVariable)
            )):
                group.roots[root] = root.name or f"rows{len(group.roots)}"
    master_observed = [rv for rv in observed if rv not in chosen]
    master_potentials = [p for p in model.potentials if p not in potentials]
    return _Split(list(by_rows.values()), master_observed, master_potentials)
