"""What ``synk.function`` is given, checked before anything is compiled.

Outputs with their reductions (a variable, a ``(variable, op)`` pair, or a list of
them), updates with how they accumulate across slices, lists of input variables, and
the sliceable shared variables (an elementwise view of one counts as the variable);
and the signature compiled from them (``row_inputs``: a stand-in input for each shared
variable that holds data rows, the givens rewritten to read it). Every check raises
``TypeError``/``ValueError`` naming the item; nothing here touches the session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytensor.graph.basic import Variable

from . import _givens, _pytensor
from ._reducers import ReduceOp, parse_op

__all__ = ["parse_outputs", "parse_updates", "variables", "sliceable", "check_used",
           "check_sliceable_outputs", "check_chunked", "RowInputs", "row_inputs"]


def parse_outputs(outputs: Any) -> tuple[list, list[ReduceOp], bool, tuple[bool, ...]]:
    """(variables, ops, single, whether each op was given) from a variable, a
    (variable, op) pair, or a list."""
    if outputs is None:
        return [], [], False, ()
    if _is_pair(outputs) or isinstance(outputs, Variable):
        found, ops, _, said = parse_outputs([outputs])
        return found, ops, True, said
    if not isinstance(outputs, (list, tuple)):
        raise TypeError(
            f"outputs must be a variable, a (variable, op) pair or a list of them; "
            f"got {type(outputs).__name__}"
        )
    found, ops, given = [], [], []
    for i, item in enumerate(outputs):
        pair = _is_pair(item)
        var, op = item if pair else (item, "avg")
        if not isinstance(var, Variable):
            raise TypeError(f"output {i} must be a PyTensor variable; got {type(var).__name__}")
        found.append(var)
        ops.append(parse_op(op, allow_gather=True))
        given.append(pair)
    return found, ops, False, tuple(given)


def _is_pair(item: Any) -> bool:
    return (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], Variable)
        and (item[1] is None or isinstance(item[1], (str, ReduceOp)))
    )


def parse_updates(updates: Any) -> tuple[list[tuple], list[ReduceOp]]:
    """((shared, new value) pairs, ops) from a dict or a list of 2- or 3-tuples."""
    if updates is None:
        return [], []
    items = list(updates.items()) if isinstance(updates, dict) else list(updates)
    pairs, ops = [], []
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise TypeError(f"update {i} must be a (shared, new_value[, op]) tuple; got {item!r}")
        pairs.append((item[0], item[1]))
        ops.append(parse_op(item[2] if len(item) == 3 else "avg", allow_gather=False))
    return pairs, ops


def variables(value: Any, what: str) -> list:
    """``value`` (None, a variable or a list of them) as a list of variables."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for i, var in enumerate(items):
        if not isinstance(var, Variable):
            raise TypeError(f"{what}[{i}] must be a PyTensor variable; got {type(var).__name__}")
    return items


def sliceable(value: Any) -> list:
    """``sliceable_shareds`` as shared variables: an elementwise view of one (a cast,
    the Theano tutorials' labels) counts as the variable it reads."""
    found = variables(value, "sliceable_shareds")
    for i, var in enumerate(found):
        shared = _givens.shared_of(var)
        if shared is None:
            raise TypeError(f"sliceable_shareds[{i}] must be a shared variable or an "
                            f"elementwise view of one (a cast); got {var!r}")
        found[i] = shared
    return found


def check_used(sliceable: list, outputs: list, updates: list, givens: list) -> None:
    """Refuse a sliceable shared variable that nothing the function computes reads."""
    if not sliceable:
        return
    roots = list(outputs) + [value for _, value in updates]
    replaced = [var for var, _ in givens]
    roots += [value for _, value in givens if isinstance(value, Variable)]
    used = set(_pytensor.ancestors(roots))
    for i, var in enumerate(sliceable):
        if var not in used or var in replaced:
            name = f" {var.name!r}" if var.name else ""
            raise ValueError(
                f"sliceable_shareds[{i}]{name} is not used by the function's outputs, "
                "updates or givens; remove it from sliceable_shareds"
            )


def check_sliceable_outputs(ops: list[ReduceOp], subset: tuple[int, ...] | None) -> None:
    """Refuse a sliced call of an output with op None: it has no rule to combine the
    master's slices by, so its sliced result could not equal the unsliced one (the
    original Synkhronos returned the last slice's, silently)."""
    for i in range(len(ops)) if subset is None else subset:
        if ops[i] is ReduceOp.NONE:
            raise ValueError(
                f"output {i} has op None (not reduced), so its slices cannot be "
                "combined into the unsliced result: give it an op (\"gather\" for "
                "per-row values), leave it out with output_subset, or call with "
                "num_slices=1"
            )


def _adds_into(variable: Variable, value: Variable) -> bool:
    """Whether ``value`` is ``variable`` plus something: ``variable + x``, or a chain of
    ``inc_subtensor`` (or of Ops that say they add into an input, ``adds_into``)
    starting from ``variable`` itself."""
    node = value.owner
    if node is None:
        return False
    scalar_op = getattr(node.op, "scalar_op", None)
    if type(scalar_op).__name__ == "Add":  # elementwise variable + ...
        return any(var is variable for var in node.inputs)
    while node is not None:
        op = node.op
        into = getattr(op, "adds_into", None)
        if into is None and type(op).__name__ == "IncSubtensor" and not op.set_instead_of_inc:
            into = 0
        if into is None:
            return False
        base = node.inputs[into]
        if base is variable:
            return True
        node = base.owner
    return False


def check_chunked(chunks: Any, ops: list[ReduceOp], subset: tuple[int, ...] | None,
                  updates: list) -> int:
    """``chunks`` as an int (0: none), refused where a call in chunks could not equal the
    call on each process's block.

    A call in chunks runs the function once per chunk, in whichever process takes it,
    and applies its updates after each chunk: the updates must add into their
    variables (a gradient accumulated, ``grad_shared + g``), and the outputs must be
    reductions that do not depend on which process ran which rows (not ``"gather"``,
    whose rows would come back in the order the processes took the chunks, nor None).
    """
    if chunks is None:
        return 0
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be None or an int >= 1; got {chunks!r}")
    for i in range(len(ops)) if subset is None else subset:
        if ops[i] in (ReduceOp.GATHER, ReduceOp.NONE):
            shown = "None" if ops[i] is ReduceOp.NONE else repr(ops[i].value)
            raise ValueError(
                f"output {i} has op {shown}: in chunks the processes run the rows "
                "in the order they take them, so its rows could not come back in order; "
                "call without chunks, or leave it out with output_subset")
    for variable, value in updates:
        if not _adds_into(variable, value):
            raise ValueError(
                f"the update of {variable.name or variable!r} does not add into it: in "
                "chunks each process applies the updates after every chunk it runs, which "
                "equals the call on whole blocks only for updates of the form "
                "variable + value (a gradient accumulated); call without chunks")
    return chunks


@dataclass
class RowInputs:
    """The compiled function's signature: the user's inputs, then one stand-in input
    per shared variable that holds data rows (``sliceable_shareds``, and the variables
    that givens slice in the Theano tutorials' pattern), with the givens rewritten to
    read the stand-ins. Each process passes its selected rows of a variable for its
    stand-in."""

    inputs: list  # scattered (none with the slice pattern: its scalars are broadcast)
    bcast_inputs: list
    slices: _givens.SlicePattern | None  # the tutorials' pattern, where givens use it
    shareds: list  # the row-holding shared variables, in stand-in order
    stand_ins: list  # one input per shared variable
    givens: list  # the givens to compile with
    kwargs: dict  # ``pytensor.function``'s keywords (the pattern may add to them)


def row_inputs(inputs: list, bcast_inputs: list, sliceable_shareds: list, given: list,
               roots: list, kwargs: dict) -> RowInputs:
    """The signature of a function given these (``roots``: its outputs and update
    values, which the slice pattern's bounds are compiled beside)."""
    slices = _givens.find_slices(given, inputs, sliceable_shareds)
    _givens.check_scalars(inputs, slices)
    shareds = list(sliceable_shareds)
    if slices is not None:
        shareds += slices.shareds
    stand_ins = [var.type(name=var.name) for var in shareds]
    by_shared = dict(zip(shareds, stand_ins, strict=True))
    if slices is not None:  # the scalar inputs become broadcast; the master compiles
        bcast_inputs = slices.scalars + bcast_inputs  # the slice's bounds
        inputs = []
        kwargs = slices.compile_kwargs(bcast_inputs, roots + [v for _, v in given], kwargs)
        slices.compile(bcast_inputs)
        given = slices.givens(by_shared)
    mine = {var: by_shared[var] for var in sliceable_shareds}
    # The original's pattern givens=[(x, s_x)], sliceable_shareds=[s_x]: each process
    # passes its selected rows of s_x in place of s_x, so the stand-in goes into the
    # user's replacement values (PyTensor refuses chained givens).
    given = [(var, _pytensor.substitute(value, mine) if isinstance(value, Variable)
              else value) for var, value in given]
    return RowInputs(inputs, bcast_inputs, slices, shareds, stand_ins,
                     given + list(mine.items()), kwargs)
