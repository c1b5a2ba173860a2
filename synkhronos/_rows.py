"""Which parts of a function's graph follow the scattered rows: decided when it is built.

Every process runs the function on its own rows, and the master reduces what comes
back; the serial program's numbers come back only where the graph treats the rows
as rows. Three ways a ported script breaks that without a word, each settled here
from the graph (PyTensor's shape inference, ``_pytensor.shape_inference`` and
``simplified``), never from a call's values:

1. **Inputs split along another axis.** Sequence data is time-major (``(time,
   batch)``, the Deep Learning Tutorials' LSTM): split along axis 0 it would give each
   process some time steps of every sequence. ``in_axes`` (JAX's name: one axis per
   scattered input) says which axis holds the rows. The compiled function takes each
   such input with that axis first (``moved``: a new input, and the user's variable
   replaced by its transpose back), so that everything after -- staging, each
   process's rows, ``batch``, slices -- splits axis 0 as always; each process views
   its inputs with the axis moved (``Call.axes``, a view, no copy).
2. **Scans over the rows.** A scattered input whose rows a ``scan`` iterates over
   (its number of steps is their count) would run each process over its own steps
   only: refused, naming the input and ``in_axes``, unless its axis was given
   (``in_axes=0`` says the steps are independent rows).
3. **Per-row outputs.** An output one of whose axes has the rows' length (a
   prediction per row) is not averaged, summed or multiplied across processes:
   with the default op it is gathered (concatenated in row order, along that axis),
   with ``"gather"`` likewise; an explicit reduction is refused with the hint
   ``"gather"``, and so is any op but None and an explicit ``"gather"`` on an output
   with the rows along two axes (``x.dot(x.T)``). A dimension merely computed from
   the rows' count (``x[1:]``) is left to the op given: shape inference also writes
   constants that way (a gradient's ``36 * L // max(L, 1)``), so it tells nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _pytensor
from ._reducers import ReduceOp

__all__ = ["in_axes", "Moved", "move", "check_scans", "PerRow", "per_row_outputs",
           "put_back"]

log = logging.getLogger("synkhronos")


def in_axes(value: Any, inputs: list) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Each scattered input's row axis (normalized, >= 0) and whether it was given.

    ``value``: None (axis 0 for all, not given), an int for all, or one int per
    input."""
    n = len(inputs)
    if value is None:
        return (0,) * n, (False,) * n
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        items = [value] * n
    elif isinstance(value, (list, tuple)):
        items = list(value)
        if len(items) != n:
            raise ValueError(f"in_axes must hold one axis per entry of inputs ({n}); "
                             f"got {len(items)}")
    else:
        raise TypeError(f"in_axes must be an int or a list of ints, one per input; "
                        f"got {type(value).__name__}")
    axes = []
    for i, (var, axis) in enumerate(zip(inputs, items, strict=True)):
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"in_axes[{i}] must be an int; got {axis!r}")
        ndim = getattr(var.type, "ndim", 0)
        if ndim == 0:
            if isinstance(value, (list, tuple)):
                raise ValueError(f"in_axes[{i}]: input {i} ({var.name!r}) is a scalar, "
                                 "which has no axis to split")
            axes.append(0)  # (an int for all: the scalar is refused where inputs are)
            continue
        if not -ndim <= axis < ndim:
            raise ValueError(f"in_axes[{i}] is {axis}, out of range for input {i} "
                             f"({var.name!r}) of {ndim} dimensions")
        axes.append(int(axis) % ndim)
    return tuple(axes), (True,) * n


@dataclass
class Moved:
    """The compiled function's scattered inputs (rows first) and the replacement of
    each user's input by its view of them."""

    inputs: list  # one per scattered input: the user's own where its axis is 0
    replace: dict  # user's input -> the moved input transposed back (axis != 0 only)


def move(inputs: list, axes: tuple[int, ...]) -> Moved:
    """Inputs whose rows lie along ``axes`` as inputs with the rows first."""
    moved, replace = [], {}
    for var, axis in zip(inputs, axes, strict=True):
        if axis == 0:
            moved.append(var)
            continue
        first = _pytensor.moved_type(var, axis)
        order = list(range(1, var.ndim))
        order.insert(axis, 0)  # moved input's axis 0 goes back to ``axis``
        moved.append(first)
        replace[var] = first.dimshuffle(*order)
    return Moved(moved, replace)


def check_scans(steps: list, rows: list, labels: list[str], given: tuple[bool, ...]) -> None:
    """Refuse a ``scan`` whose number of steps (``steps``: ``_pytensor.scan_steps``)
    is the rows' count of one of ``rows`` (the first ``len(given)`` are scattered
    inputs, ``given``: whether their axis was said; the others hold rows of shared
    variables)."""
    if not steps or not rows:
        return
    try:
        simple = _pytensor.simplified(steps)
    except Exception as exc:  # a graph PyTensor's rewrites refuse: nothing can be told
        log.debug("synkhronos: no check of scans over the rows: %s", exc)
        return
    for dim in simple:
        read = _pytensor.row_length_of(dim, rows)[1]
        if read is None:
            continue
        i = next(i for i, r in enumerate(rows) if r is read)
        if i < len(given) and given[i]:
            continue  # the user said the rows lie along that axis
        fix = ("if it is time-major sequence data, scatter it along its batch axis "
               "with in_axes (synk.function(..., in_axes=1)); if the steps are "
               "independent rows, say so with in_axes=0") if i < len(given) else (
               "lay those rows out along another axis than 0, or pass them as a "
               "scattered input with in_axes")
        raise ValueError(
            f"{labels[i]} is split by rows along its axis 0, and a scan iterates over "
            f"that axis (its number of steps is the rows' count), so each process would "
            f"run only its own steps of the sequence: {fix}")


@dataclass(frozen=True)
class PerRow:
    """How outputs whose shape follows the rows are returned."""

    ops: list  # each output's op, the default "avg" of a per-row output now GATHER
    axes: tuple[int | None, ...] | None  # per output, the axis gathered where not 0
    outputs: list  # what to compile: an output gathered along axis a with a first


def per_row_outputs(outputs: list, ops: list[ReduceOp], explicit: tuple[bool, ...],
                    analysed: list, rows: list) -> PerRow:
    """Gather or refuse the outputs whose shape follows the rows (module docstring,
    3). ``analysed``: the outputs as each process computes them (givens applied, so
    that ``rows`` are their inputs); ``explicit``: whether each op was given."""
    wanted = [i for i, out in enumerate(analysed)
              if ops[i] is not ReduceOp.NONE and getattr(out.type, "ndim", 0) > 0]
    if not wanted or not rows:
        return PerRow(list(ops), None, list(outputs))
    ops, outputs = list(ops), list(outputs)
    axes: list[int | None] = [None] * len(outputs)
    try:
        shape = _pytensor.shape_inference([analysed[i] for i in wanted])
        found = {}
        for i in wanted:
            dims = list(shape(analysed[i]))
            symbolic = [k for k, d in enumerate(dims)
                        if getattr(d, "owner", None) is not None]
            if symbolic:
                found[i] = (symbolic, _pytensor.simplified([dims[k] for k in symbolic]))
    except Exception as exc:  # a graph PyTensor's inference refuses: nothing can be told
        log.debug("synkhronos: no shape inference for per-row outputs: %s", exc)
        return PerRow(ops, None, outputs)
    for i, (symbolic, simple) in found.items():
        # Only a dimension that is plainly the rows' count: one merely computed from
        # it may be shape inference's long way round to a constant (a gradient's
        # ``36 * L // max(L, 1)``), so it tells nothing.
        exact = [k for k, dim in zip(symbolic, simple, strict=True)
                 if _pytensor.row_length_of(dim, rows)[0] is not None]
        if not exact:
            continue
        what = f"output {i}" + (f" ({outputs[i].name!r})" if outputs[i].name else "")
        if explicit[i] and ops[i] is ReduceOp.GATHER and len(exact) > 1:
            continue  # concatenated along axis 0, as asked
        if len(exact) > 1:
            raise ValueError(
                f"{what} has one entry per scattered row along each of its axes "
                f"{tuple(exact)}, so no reduction of the processes' results (nor a "
                "gather along one axis) equals the serial one: return it with op None "
                "(the master's own result), or compute it from per-row values")
        axis = exact[0]
        if explicit[i] and ops[i] is not ReduceOp.GATHER:
            raise ValueError(
                f"{what} has one entry per scattered row along its axis {axis}, so "
                f"reducing it with op {ops[i].value!r} across processes would combine "
                f"different rows: give it the op \"gather\" (the rows in order, as the "
                "serial function returns them)")
        ops[i] = ReduceOp.GATHER
        if axis:
            order = list(range(outputs[i].ndim))
            order.insert(0, order.pop(axis))
            outputs[i] = outputs[i].dimshuffle(*order)
            axes[i] = axis
    return PerRow(ops, tuple(axes) if any(a is not None for a in axes) else None, outputs)


def put_back(results: list, axes: tuple[int | None, ...], subset: tuple[int, ...] | None
             ) -> list:
    """Outputs gathered along axis 0 with their rows' axis where the graph has it."""
    chosen = range(len(axes)) if subset is None else subset
    return [r if a is None or r is None else np.moveaxis(r, 0, a)
            for r, a in zip(results, (axes[i] for i in chosen), strict=True)]
