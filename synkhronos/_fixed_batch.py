"""The whole batch's row count written into a graph as a constant, where each process
runs only its own rows.

A serial program may write its minibatch size into the graph: the Deep Learning
Tutorials' LeNet turns its input rows into images with ``x.reshape((batch_size, 1,
28, 28))``. Under synkhronos each process runs its share of the rows (250 of a batch
of 500 at n=2), so the constant no longer matches the tensor it shapes: every process
fails (``total size of new array must be unchanged``) after the whole program has
compiled, or, with a ``-1`` elsewhere in the shape, regroups its rows without a word.
The fix is to write the rows' count as the graph knows it: ``x.shape[0]`` (or ``-1``).

Two steps, both in the master:

- ``find``, once, when ``synk.function`` builds: every ``Reshape`` and
  ``SpecifyShape`` of the user's graph given a constant leading dimension while the
  tensor it applies to grows with the rows, i.e. PyTensor's shape inference
  (``_pytensor.shape_inference``) writes that tensor's shape in terms of the length of
  a scattered input, or of a variable that the slice pattern's givens fill with rows.
  A constant that comes from elsewhere (a weight's shape) is not one of them;
- ``check``, on each call that is not a replay (``function.py``'s ``prepare``), before
  any worker moves: a constant equal to the call's whole row count, while the call
  splits those rows (over several processes, or in several slices), is refused with
  a ``ValueError`` that names the op, the constant and the fix. Where the givens
  slice the minibatch out of shared variables (the tutorials' pattern) the first
  minibatch's rows are known when the function is built, which then checks them
  against its processes before anything is compiled.

Only a constant equal to the whole batch is refused: that is the serial program's
batch size, certainly meant to follow the rows; another constant may mean something
else, and is left to PyTensor. The count belongs to each call (the last minibatch of
an epoch may be shorter), so each call is checked; a replayed call has the rows of a
call already checked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pytensor.graph.basic import Constant
from pytensor.tensor.basic import MakeVector, get_underlying_scalar_constant_value
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.shape import Reshape, SpecifyShape

from . import _pytensor
from ._scatter import split_counts, weighted_counts

__all__ = ["FixedBatch", "find", "check"]

log = logging.getLogger("synkhronos")


@dataclass(frozen=True)
class FixedBatch:
    """One op of the graph that gives a tensor of rows a constant leading dimension."""

    op: str  # as PyTensor prints it: ``Reshape{4}``, ``SpecifyShape``
    constant: int  # the leading dimension written in the graph
    shape: tuple[int | None, ...] | None  # the whole shape written, where all constant
    tensor: str | None  # the name of the tensor it applies to
    rows_of: str | None  # the input whose rows that tensor grows with (None: itself)
    reshape: bool  # a Reshape (else a SpecifyShape)

    def fix(self) -> str:
        """The graph's code, written to follow the rows."""
        name = self.tensor or "t"
        rest = ", ..." if self.shape is None else "".join(f", {d}" for d in self.shape[1:])
        where = "" if self.tensor else f" (t: the tensor the {self.op} applies to)"
        if self.reshape:
            return (f"{name}.reshape(({name}.shape[0]{rest or ','})){where}, or -1 in "
                    f"place of {self.constant}")
        return f"pt.specify_shape({name}, (None{rest or ','})){where}"


def _leading_constant(node: Any) -> int | None:
    """The leading dimension a Reshape or SpecifyShape node is given, where the graph
    writes it as a constant (``(500, 1, 28, 28)``, ``(500, x.shape[1])``); else None
    (``x.shape[0]``, ``-1``, an open ``None``)."""
    if isinstance(node.op, Reshape):
        shape = node.inputs[1]
        if isinstance(shape, Constant) and shape.data.ndim == 1 and len(shape.data):
            first = shape.data[0]
        elif shape.owner is not None and isinstance(shape.owner.op, MakeVector):
            try:  # (a Python int there is cast to int64)
                first = get_underlying_scalar_constant_value(shape.owner.inputs[0])
            except NotScalarConstantError:
                return None
        else:
            return None
    else:
        dim = node.inputs[1] if len(node.inputs) > 1 else None
        if not isinstance(dim, Constant) or dim.data is None:
            return None
        first = dim.data
    return int(first) if int(first) >= 0 else None


def _constant_shape(node: Any) -> tuple[int | None, ...] | None:
    """The shape a Reshape or SpecifyShape node is given, where every entry is a
    constant (None: an entry SpecifyShape leaves open); else None."""
    if isinstance(node.op, Reshape):
        shape = node.inputs[1]
        if isinstance(shape, Constant):
            return tuple(int(d) for d in shape.data)
        return None
    entries: list[int | None] = []
    for dim in node.inputs[1:]:
        if not isinstance(dim, Constant):
            return None
        entries.append(None if dim.data is None else int(dim.data))
    return tuple(entries)


def find(roots: list[Any], rows: list[Any], labels: list[str]) -> tuple[FixedBatch, ...]:
    """The ops of the graph of ``roots`` (outputs and update values) that give a tensor
    growing with the rows of one of ``rows`` a constant leading dimension; ``labels``
    names each of ``rows`` in messages.

    Shape inference runs only where the graph writes such a constant, and only on
    what those ops apply to: most graphs (``x.shape[0]``, gradients) skip it.
    """
    if not rows:
        return ()
    nodes = []
    for var in _pytensor.ancestors(roots):
        node = var.owner
        if node is not None and var is node.outputs[0] and isinstance(
                node.op, (Reshape, SpecifyShape)):
            constant = _leading_constant(node)
            if constant is not None:
                nodes.append((node, constant))
    if not nodes:
        return ()
    try:
        shape = _pytensor.shape_inference([node.inputs[0] for node, _ in nodes])
    except Exception as exc:  # a graph PyTensor's inference refuses: no check then
        log.debug("synkhronos: no shape inference for the batch-size check: %s", exc)
        return ()
    found = []
    for node, constant in nodes:
        grows = _pytensor.lengths_read(shape(node.inputs[0]), rows)
        if not grows:
            continue
        label = labels[next(i for i, var in enumerate(rows) if var is grows[0])]
        found.append(FixedBatch(
            op=str(node.op), constant=constant, shape=_constant_shape(node),
            tensor=node.inputs[0].name,
            rows_of=None if node.inputs[0] is grows[0] else label,
            reshape=isinstance(node.op, Reshape)))
    return tuple(found)


def check(found: tuple[FixedBatch, ...], total: int, parts: int,
          shares: tuple[float, ...] | None, num_slices: int,
          batch: str | None = None) -> None:
    """Refuse a call of ``total`` rows split over ``parts`` processes (by ``shares``,
    or evenly) and ``num_slices`` slices in each, if one of ``found`` hard-codes
    ``total`` while no single run of the function sees all of them; ``batch`` says
    what those rows are (default: this call's whole batch)."""
    fixed = next((f for f in found if f.constant == total), None)
    if fixed is None:
        return
    counts = weighted_counts(total, shares) if shares is not None else split_counts(
        total, parts)
    largest = -(-max(counts) // num_slices)  # the most rows one run of the function sees
    if largest >= total:
        return
    if batch is None:
        batch = f"this call's whole batch of {total} rows"
    what = f"{fixed.tensor!r}" if fixed.tensor else "a tensor"
    if fixed.rows_of is not None:
        what += f" (computed from the rows of {fixed.rows_of})"
    shape = "" if fixed.shape is None else f" (shape {fixed.shape})"
    raise ValueError(
        f"the graph's {fixed.op} gives {what} the constant leading dimension "
        f"{fixed.constant}{shape}, which is {batch}; "
        f"but each process runs only its own rows ({largest} at a time at most here), "
        f"so that dimension must follow them: write {fixed.fix()}"
    )
