"""Shared variables that hold data rows, as ``givens`` and ``sliceable_shareds`` name them.

The Theano tutorials keep a whole data set in shared variables and pick each minibatch
through ``givens`` with a slice whose bounds come from a scalar input::

    f = synk.function([index], cost, updates=...,
                      givens={x: data_x[index * bs:(index + 1) * bs],
                              y: pt.cast(data_y, "int32")[index * bs:(index + 1) * bs]})

This module owns the reading of such graphs at build time and the one computation it
needs at call time:

- ``shared_of``: the shared variable that a value reads through elementwise views
  (a cast, a scaling by a constant), so that ``T.cast(shared_y, "int32")`` counts
  as ``shared_y`` for ``sliceable_shareds`` and for the slice pattern;
- ``find_slices``: the givens whose value is a step-1 slice along axis 0 of such a
  view (a ``Subtensor`` on the first dimension only). It returns a ``SlicePattern``
  holding the givens with the slice taken out (``view(shared)``), so that the
  stand-in machinery of ``function.py`` (one input per row-holding shared variable,
  fed with each process's rows) serves this pattern too; the scalar inputs become
  broadcast inputs;
- ``SlicePattern.rows``: per call, in the master: the bounds evaluated on the call's
  broadcast inputs (a small function compiled once),
  clipped as numpy clips a slice, and the slice's rows divided by the rule that
  divides scattered rows: one ``(start, stop)`` per process and per shared variable,
  sent with the call. Each process passes ``value[start:stop]`` for its stand-in;
  ``SlicePattern.first_rows``: the same length at build time, for the first
  minibatch (every scalar input 0), which is the program's batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable, equal_computations
from pytensor.tensor.basic import ScalarFromTensor
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.subtensor import Subtensor, get_idx_list

from . import _pytensor
from ._scatter import block, offsets, weighted_counts

__all__ = ["shared_of", "find_slices", "check_scalars", "SlicePattern"]

PATTERN = "givens={x: data_x[index * bs:(index + 1) * bs]}"


def _is_constant_like(var: Variable) -> bool:
    """A value computed from constants only, broadcast along every axis (it cannot
    change which rows a view's rows correspond to)."""
    if not all(var.type.broadcastable):
        return False
    roots = [v for v in _pytensor.ancestors([var]) if v.owner is None]
    return all(isinstance(v, Constant) for v in roots)


def _view_input(var: Variable) -> Variable | None:
    """The one input an elementwise view reads rows from, or None if ``var`` is not an
    elementwise op of one variable and constants (a cast, ``x / 255.``)."""
    node = var.owner
    if node is None or not isinstance(node.op, Elemwise) or len(node.outputs) != 1:
        return None
    varying = [v for v in node.inputs if not _is_constant_like(v)]
    if len(varying) != 1 or varying[0].type.broadcastable != var.type.broadcastable:
        return None
    return varying[0]


def shared_of(var: Any) -> SharedVariable | None:
    """The shared variable ``var`` is, or reads through elementwise views; else None."""
    while isinstance(var, Variable) and not isinstance(var, SharedVariable):
        var = _view_input(var)
    return var if isinstance(var, SharedVariable) else None


def _row_slice(value: Any) -> tuple[SharedVariable, Variable, Any, Any] | None:
    """``(shared, sliced, start, stop)`` when ``value`` is a step-1 slice along axis 0
    of a view of a shared variable (with views on top allowed); ``sliced`` is the
    Subtensor's output, ``start``/``stop`` its bound variables (or None)."""
    var = value
    while isinstance(var, Variable):
        node = var.owner
        if node is not None and type(node.op) is Subtensor:
            break
        var = _view_input(var)
    if not isinstance(var, Variable) or var.owner is None:
        return None
    node = var.owner
    index = get_idx_list(node.inputs, node.op.idx_list)
    if len(index) != 1 or not isinstance(index[0], slice):
        return None
    step = index[0].step
    if step is not None and not (isinstance(step, Constant) and step.data == 1):
        return None
    shared = shared_of(node.inputs[0])
    if shared is None:
        return None
    return shared, var, index[0].start, index[0].stop


def _bound_tensor(bound: Any) -> Variable:
    """A bound of a Subtensor (a scalar-typed variable) as a 0-d tensor."""
    owner = bound.owner
    if owner is not None and isinstance(owner.op, ScalarFromTensor):
        return owner.inputs[0]
    return pytensor.tensor.as_tensor_variable(bound)


@dataclass
class SlicePattern:
    """The givens that slice rows of shared variables, and how to compute each call's
    rows (see the module docstring)."""

    shareds: list[SharedVariable]  # each sliced variable once, in givens order
    bounds: list[tuple[Any, Any]]  # per shared: (start, stop) tensors or None
    entries: list[tuple[Any, Any, SharedVariable]]  # (given key, view of shared, shared)
    others: list[tuple[Any, Any]]  # the other givens, untouched
    scalars: list[Variable]  # the inputs that become broadcast
    _compute: Any = field(default=None, repr=False)
    _inputs: list = field(default_factory=list, repr=False)

    def givens(self, stand_ins: dict) -> list[tuple[Any, Any]]:
        """The givens with each slice replaced by its view of the stand-in (which each
        process feeds with its own rows of the slice)."""
        mine = [(key, _pytensor.substitute(view, {shared: stand_ins[shared]}))
                for key, view, shared in self.entries]
        return mine + self.others

    def compile_kwargs(self, signature: list, roots: list, kwargs: dict) -> dict:
        """``pytensor.function``'s keywords for the function with the slices taken out.

        An input used only in the bounds (``index``) is no longer in that graph, so
        PyTensor's check of unused inputs runs here instead, on the graph with the
        slices, as the serial function's would; the compiled one ignores them.
        """
        policy = kwargs.get("on_unused_input") or "raise"
        used = set(_pytensor.ancestors(roots))
        for i, var in enumerate(signature):
            if var not in used and policy == "raise":
                name = f" ({var.name!r})" if var.name else ""
                raise ValueError(
                    f"input {i}{name} is not used by the outputs, updates or givens "
                    "(pass on_unused_input='ignore' to allow it, as in pytensor.function)"
                )
        return dict(kwargs, on_unused_input="ignore")

    def compile(self, signature: list) -> None:
        """Build the bounds' function of the call's inputs (once, in the master)."""
        outputs = [b for pair in self.bounds for b in pair if b is not None]
        self._inputs = list(signature)
        self._compute = pytensor.function(self._inputs, outputs,
                                          mode=_pytensor.scalar_mode(),
                                          on_unused_input="ignore")
        # its inputs are made exact below (dtype, ndim): skip PyTensor's own check
        self._compute.trust_input = True

    def _evaluate(self, values: list) -> list:
        """The bounds for one call's values (numpy arrays, Data, or, from
        ``as_pytensor``, anything PyTensor would accept)."""
        arrays = []
        for var, value in zip(self._inputs, values, strict=True):
            value = value.data if hasattr(value, "ref") else value  # a synk.Data
            if not (isinstance(value, np.ndarray) and value.dtype == var.type.numpy_dtype
                    and value.ndim == var.ndim):
                value = var.type.filter(value, strict=False, allow_downcast=True)
            arrays.append(value)
        return self._compute(*arrays)

    def whole(self, values: list) -> list[tuple[int, int]]:
        """``(start, stop)`` of each shared variable's slice, as numpy clips it.

        Raises ValueError when the slices select different numbers of rows (they are
        the rows of one minibatch)."""
        computed = iter(self._evaluate(values) if self._compute is not None else [])
        spans = []
        for shared, (start, stop) in zip(self.shareds, self.bounds, strict=True):
            length = np.shape(_pytensor.value(shared))[0]
            lo = None if start is None else int(next(computed))
            hi = None if stop is None else int(next(computed))
            first, last, _ = slice(lo, hi).indices(length)
            spans.append((first, max(first, last)))
        counts = {hi - lo for lo, hi in spans}
        if len(counts) > 1:
            found = ", ".join(f"{hi - lo} of {shared.name or 'a shared variable'!r}"
                              for shared, (lo, hi) in zip(self.shareds, spans, strict=True))
            raise ValueError(f"the givens' slices of shared variables must select the same "
                             f"number of rows (the rows of one minibatch); got {found}")
        return spans

    def first_rows(self) -> int | None:
        """The slice's rows with every input 0 (the tutorials' first minibatch,
        ``index = 0``); None where an input is not a scalar, or where the bounds make
        no sense at 0 (slices of different lengths, a division by an input): each
        call's rows are checked anyway."""
        if any(var.ndim for var in self._inputs):
            return None
        try:
            spans = self.whole([np.zeros((), var.type.numpy_dtype) for var in self._inputs])
        except Exception:
            return None
        return spans[0][1] - spans[0][0]

    def rows(self, values: list, parts: int, shares: tuple[float, ...] | None = None
             ) -> tuple[tuple, int]:
        """Each process's ``(start, stop)`` per shared variable, and the slice's length
        (the slice split evenly, or in proportion to ``shares``)."""
        spans = self.whole(values)
        length = spans[0][1] - spans[0][0]
        cuts = None if shares is None else offsets(weighted_counts(length, shares))
        per_rank = []
        for rank in range(parts):
            lo, hi = block(length, parts, rank) if cuts is None else cuts[rank:rank + 2]
            per_rank.append(tuple((start + lo, start + hi) for start, _ in spans))
        return tuple(per_rank), length


def check_scalars(inputs: list, pattern: SlicePattern | None) -> None:
    """Refuse a scalar among the scattered inputs (it has no rows to scatter), and any
    input with rows beside the slice pattern (which divides the slice's rows)."""
    for i, var in enumerate(inputs):
        name = f" ({var.name!r})" if var.name else ""
        if pattern is None and var.ndim == 0:
            raise ValueError(
                f"input {i}{name} is a scalar, so it cannot be scattered along axis 0: pass "
                f"it in bcast_inputs, or use it in the bounds of givens that slice rows of "
                f"shared variables (the Theano tutorials' pattern, {PATTERN}), where the "
                "scalar inputs are broadcast and the slice's rows divided"
            )
        if pattern is not None and var.ndim > 0:
            raise ValueError(
                f"input {i}{name} would be scattered, but the function's givens slice rows "
                f"of shared variables ({PATTERN}), and those rows are what the processes "
                "divide: pass it in bcast_inputs, or give its rows through the givens too"
            )


def find_slices(givens: list, inputs: list, sliceable: list) -> SlicePattern | None:
    """The slice pattern among ``givens``, or None if no given slices a shared variable.

    Raises ValueError for a shared variable sliced by two givens with different bounds
    (one stand-in holds one process's rows), or one also in ``sliceable_shareds``.
    """
    entries: list[tuple[Any, Any, SharedVariable]] = []
    others: list[tuple[Any, Any]] = []
    shareds: list[SharedVariable] = []
    bounds: list[tuple[Any, Any]] = []
    for key, value in givens:
        found = _row_slice(value) if isinstance(value, Variable) else None
        if found is None:
            others.append((key, value))
            continue
        shared, sliced, start, stop = found
        pair = (None if start is None else _bound_tensor(start),
                None if stop is None else _bound_tensor(stop))
        name = f" {shared.name!r}" if shared.name else ""
        if any(shared is s for s in sliceable):
            raise ValueError(
                f"shared variable{name} is in sliceable_shareds and also sliced by givens "
                f"({PATTERN}); use one or the other"
            )
        if any(shared is s for s in shareds):
            earlier = bounds[[id(s) for s in shareds].index(id(shared))]
            if not _same_bounds(earlier, pair):
                raise ValueError(
                    f"shared variable{name} is sliced by two givens with different bounds; "
                    "the slice pattern gives each process one block of a variable's rows"
                )
        else:
            shareds.append(shared)
            bounds.append(pair)
        view = _pytensor.substitute(value, {sliced: sliced.owner.inputs[0]})
        entries.append((key, view, shared))
    if not entries:
        return None
    if sliceable:
        raise ValueError(
            f"the givens slice rows of shared variables ({PATTERN}) and sliceable_shareds "
            "is given too; the processes can divide the rows of one or the other"
        )
    scalars = [var for var in inputs if var.ndim == 0]
    return SlicePattern(shareds, bounds, entries, others, scalars)


def _same_bounds(a: tuple, b: tuple) -> bool:
    if (a[0] is None) != (b[0] is None) or (a[1] is None) != (b[1] is None):
        return False
    xs = [v for v in a if v is not None]
    ys = [v for v in b if v is not None]
    return not xs or equal_computations(xs, ys)
