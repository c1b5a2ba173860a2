"""The public collectives on shared variables: validate in the master, then one exchange.

Every function here follows the same path::

    1. session    forked, usable, and at least one ``synk.distribute()`` done
    2. targets    the shared variables (one or a list) -> their ids in every process;
                  a variable no distributed function uses is a ValueError naming it
    3. arguments  op, rank, nd_up, batch; values filtered by each variable's own type
                  (cast only where PyTensor would cast)
    4. exchange   one command (``fused.py``, on the session's backend), or a small
                  shape query and one command where sizes must be known first; the
                  few paths without a command check the session themselves

Steps 1-3 live in ``_checks.py``; every error of theirs is raised before any process
moves. An ``all_reduce`` with the same variables and op as the last one (between a
training loop's steps) has passed them already: it runs the step the last one kept
(``fused.Repeat``; the last exact and the last low-precision all-reduce are kept
apart, so a call never runs the other exchange's step). Step 4 builds the collective's
``Step`` (``fused.py``) and runs it as one command, holding the session's command lock
from the staging of values to the end, so that collectives from several threads of the
master never interleave. A list of variables travels as one fused buffer, and a single
variable returns a single value where a list returns a list.

``all_reduce(..., exchange="bf16" | "fp16")`` is the low-precision exchange: each
process's float32 values rounded to 16 bits for the trip, summed in float32
(``rounded.py``); step 3 refuses it for other dtypes and ops.

``shared_vars`` may name a variable by its name (a string), as in the original
Synkhronos, when exactly one shared variable of the distributed functions has it.
The original's ``nccl=`` keyword is accepted everywhere it was (``broadcast``,
``gather``, ``all_gather``, ``reduce``, ``all_reduce``): it chose GPU (NCCL) or host
communication there; on CPU processes it changes nothing.

Per-rank examples below use two processes, with ``w`` a float32 vector holding
``[1, 2]`` in rank 0 (the master) and ``[3, 4]`` in rank 1.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from .. import _pytensor
from .._core.session import current
from .._runtime import epoch
from .._scatter import select_rows
from ._checks import (
    FRONT,
    begin,
    check_fixed_length,
    check_rank,
    each_rows_batch,
    filter_values,
    low_precision,
    one_or_list,
    reduce_op,
    rows_batch,
)
from .backend import store_value
from .fused import (
    Repeat,
    all_reduce_step,
    broadcast_step,
    get_value_step,
    low_precision_step,
    place_step,
    reduce_step,
    regions_step,
    run_step,
    shapes_step,
)

__all__ = [
    "broadcast",
    "scatter",
    "gather",
    "all_gather",
    "reduce",
    "all_reduce",
    "set_value",
    "get_value",
    "get_lengths",
    "get_shapes",
]

Op = Literal["avg", "sum", "prod", "max", "min"]
Rounding = Literal["bf16", "fp16"]  # the 16-bit formats of a low-precision exchange


def _run(session: Any, backend: Any, build: Any, *args: Any) -> Any:
    """Build one step under the session's command lock and run it; its result."""
    took = session.enter()
    try:
        return run_step(session, backend, build(session, backend, *args))
    finally:
        session.leave(took)


def _overwritten(session: Any, targets: Any) -> None:
    """These variables get a value in every process (or, from ``set_value``, in the
    master alone, by request): the master's ``set_value`` before it needs no broadcast
    (``fresh.py``)."""
    if session.fresh is not None:
        session.fresh.overwritten(targets.variables)


def _shapes(session: Any, backend: Any, targets: Any) -> list:
    return _run(session, backend, lambda s, b: shapes_step(targets))


# -- step 4: the exchanges (steps 1-3 are in _checks.py) ------------------------------
def broadcast(shared_vars: Any, values: Any = None, nccl: bool = True) -> None:
    """Copy the master's values (or ``values``) into every process's variables.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions.
    values : array_like, synk.Data, or list of them, optional
        New values, one per variable (a single value for a single variable); cast
        only where PyTensor would. The master's variables take them too.
    nccl : bool
        The original's choice of GPU or host communication; ignored on CPU.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError, TypeError
        A variable no distributed function uses; values that do not fit.

    Examples
    --------
    >>> synk.broadcast(w)                 # doctest: +SKIP
    rank 0: w = [1, 2]    rank 1: w = [1, 2]
    >>> synk.broadcast(w, [5, 6])         # doctest: +SKIP
    rank 0: w = [5, 6]    rank 1: w = [5, 6]
    """
    session, front, targets, single = begin("broadcast", shared_vars)
    if values is not None:
        values = filter_values(targets, values, single, keep_data=False)
    _overwritten(session, targets)
    _run(session, front.backend, broadcast_step, targets, values)


def scatter(shared_vars: Any, values: Any, batch: Any = None) -> None:
    """Split ``values`` along axis 0 and give each process its block of rows.

    Rows are cut as function inputs are: contiguous blocks in rank order, the first
    ``L % n`` ranks one row longer.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions.
    values : array_like, synk.Data, or list of them
        One per variable, each split on its own (their lengths may differ). A
        ``synk.Data`` of the variable's dtype is read in place by every process.
    batch : int, slice, or 1-d sequence of int, optional
        Rows of each value to scatter (as ``batch`` of a function call); it must be
        valid for every value.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError, TypeError
        Values that do not fit or are 0-d; a bad ``batch``.

    Examples
    --------
    >>> synk.scatter(w, [1, 2, 3])        # doctest: +SKIP
    rank 0: w = [1, 2]    rank 1: w = [3]
    """
    session, front, targets, single = begin("scatter", shared_vars)
    values = filter_values(targets, values, single, keep_data=True)
    selections = each_rows_batch(targets, values, batch, "scatter")
    counts = [[selection.part(session.n, r).length for r in range(session.n)]
              for selection in selections]
    check_fixed_length(targets, counts, "scatter")
    _overwritten(session, targets)
    _run(session, front.backend, place_step, targets, values, selections, None)


def gather(shared_vars: Any, nd_up: int = 1, nccl: bool = True) -> Any:
    """Every process's values, collected in the master; no value changes.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions.
    nd_up : {1, 0}
        1: stack on a new leading axis (shapes must agree across processes);
        0: concatenate along axis 0 (lengths may differ; 0-d values are stacked).
    nccl : bool
        The original's choice of GPU or host communication; ignored on CPU.

    Returns
    -------
    numpy.ndarray or list of numpy.ndarray
        New arrays, in rank order.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError
        Shapes that cannot be stacked (``nd_up=1``) or concatenated (``nd_up=0``).

    Examples
    --------
    >>> synk.gather(w)                    # doctest: +SKIP
    array([[1., 2.], [3., 4.]])           (every w unchanged)
    >>> synk.gather(w, nd_up=0)           # doctest: +SKIP
    array([1., 2., 3., 4.])
    """
    session, front, targets, single = begin("gather", shared_vars)
    if isinstance(nd_up, bool) or nd_up not in (0, 1):
        raise ValueError(f"nd_up must be 1 (stack) or 0 (concatenate); got {nd_up!r}")
    backend = front.backend
    shapes = _shapes(session, backend, targets)
    for i, label in enumerate(targets.labels):
        per_rank = [rank_shapes[i] for rank_shapes in shapes]
        if nd_up == 1 and len(set(per_rank)) > 1:
            raise ValueError(f"gather with nd_up=1 stacks values, so {label} needs the same "
                             f"shape in every process; got {per_rank} (use nd_up=0 to "
                             "concatenate along axis 0)")
        if nd_up == 0 and len({s[1:] for s in per_rank}) > 1:
            raise ValueError(f"gather with nd_up=0 concatenates along axis 0, so {label} "
                             f"needs the same trailing shape in every process; got {per_rank}")
    parts = _run(session, backend, regions_step, targets, shapes, False)
    results = [
        np.stack(pieces) if nd_up == 1 or pieces[0].ndim == 0 else np.concatenate(pieces)
        for pieces in parts
    ]
    return one_or_list(results, single)


def all_gather(shared_vars: Any, nccl: bool = True) -> None:
    """Every process's variables become the concatenation of all processes' values.

    Values are joined along axis 0 in rank order; lengths may differ across
    processes (after an uneven ``scatter``), trailing shapes may not.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions, at least 1-d.
    nccl : bool
        The original's choice of GPU or host communication; ignored on CPU.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError
        A 0-d variable, or trailing shapes that differ across processes.

    Examples
    --------
    >>> synk.all_gather(w)                # doctest: +SKIP
    rank 0: w = [1, 2, 3, 4]    rank 1: w = [1, 2, 3, 4]
    """
    session, front, targets, _ = begin("all_gather", shared_vars)
    for label, ndim in zip(targets.labels, targets.ndims, strict=True):
        if ndim == 0:
            raise ValueError(f"all_gather concatenates along axis 0, but {label} is 0-d")
    backend = front.backend
    shapes = _shapes(session, backend, targets)
    for i, label in enumerate(targets.labels):
        per_rank = [rank_shapes[i] for rank_shapes in shapes]
        if len({s[1:] for s in per_rank}) > 1:
            raise ValueError(f"all_gather concatenates along axis 0, so {label} needs the "
                             f"same trailing shape in every process; got {per_rank}")
    total = [sum(rank_shapes[i][0] for rank_shapes in shapes)
             for i in range(len(targets.uids))]
    check_fixed_length(targets, [[n] for n in total], "all_gather")
    _run(session, backend, regions_step, targets, shapes, True)


def reduce(shared_vars: Any, op: Op = "avg", in_place: bool = True, nccl: bool = True) -> Any:
    """Combine every process's values elementwise into the master.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions, of the same shape in every process.
    op : {"avg", "sum", "prod", "max", "min"}
        ``"avg"`` is the plain mean over processes (floating variables only).
    in_place : bool
        True: the result goes into the master's variables and None is returned.
        False: the result is returned as new arrays; no process's value changes.
    nccl : bool
        The original's choice of GPU or host communication; ignored on CPU.

    Returns
    -------
    None, numpy.ndarray or list of numpy.ndarray

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError
        An unknown ``op``; shapes that differ across processes (nothing changes).
    TypeError
        ``"avg"`` of an integer variable.

    Examples
    --------
    >>> synk.reduce(w, op="sum")          # doctest: +SKIP
    rank 0: w = [4, 6]    rank 1: w = [3, 4]
    >>> synk.reduce(w, op="max", in_place=False)   # doctest: +SKIP
    array([3., 4.])                       (every w unchanged)
    """
    session, front, targets, single = begin("reduce", shared_vars)
    parsed = reduce_op(op, targets)
    results = _run(session, front.backend, reduce_step, targets, parsed, bool(in_place))
    return None if in_place else one_or_list(results, single)


def all_reduce(shared_vars: Any, op: Op = "avg", nccl: bool = True, *,
               exchange: Rounding | None = None) -> None:
    """Combine every process's values elementwise; the result goes into every process.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions, of the same shape in every process.
        A list travels as one fused buffer: prefer one call on a list (or one
        flattened variable) to many calls.
    op : {"avg", "sum", "prod", "max", "min"}
        ``"avg"`` is the plain mean over processes (floating variables only).
    nccl : bool
        The original's choice of GPU or host communication; ignored on CPU.
    exchange : {None, "bf16", "fp16"}
        None (default): the exact exchange. ``"bf16"``/``"fp16"``: a low-precision
        exchange, as PyTorch DDP's compression hooks: each process rounds its values
        to bfloat16 or IEEE half (to nearest, ties to even) and they travel as 16-bit
        words; the rounded values are summed in float32 in rank order (``"avg"``: then
        divided by the number of processes) and the float32 result goes into every
        process. For float32 variables and ``op`` ``"sum"`` or ``"avg"`` only (anything
        else raises); with one process the values are rounded all the same.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError
        An unknown ``op`` or ``exchange``; an ``exchange`` with an op other than
        ``"sum"``/``"avg"``; shapes that differ across processes (nothing changes).
    TypeError
        ``"avg"`` of an integer variable; an ``exchange`` with a variable that is not
        float32.

    Examples
    --------
    >>> synk.all_reduce(w)                # doctest: +SKIP
    rank 0: w = [2, 3]    rank 1: w = [2, 3]
    >>> synk.all_reduce(w, op="sum")      # doctest: +SKIP
    rank 0: w = [4, 6]    rank 1: w = [4, 6]
    >>> synk.all_reduce(g, op="sum", exchange="bf16")   # doctest: +SKIP
    rank 0: g = [0.30029297]    rank 1: g = [0.30029297]
    (g was 0.1 in rank 0 and 0.2 in rank 1, which bf16 rounds to 0.100097656 and
    0.20019531; the exact exchange gives 0.3)
    """
    session = current()
    if session is not None:  # the same call as the last (a training loop's): steps 1-3 done
        front = FRONT.get(session.ctx)
        if exchange is None:
            repeat = front.repeat
            if repeat is not None and repeat.matches(shared_vars, op):
                _run(session, front.backend, repeat.step)
                return
        else:
            repeat = front.rounded
            if (repeat is not None and exchange is repeat.exchange
                    and repeat.matches(shared_vars, op)):
                _run(session, front.backend, repeat.step)
                return
    session, front, targets, single = begin("all_reduce", shared_vars)
    parsed = reduce_op(op, targets)
    rounding = None if exchange is None else low_precision(exchange, parsed, targets)
    if rounding is None:
        if session.n == 1:
            session.check_usable()
            return  # one process: every op leaves its values as they are
        if targets.by_name or not epoch.REPLAY:  # (by name: resolved anew at every call)
            front.repeat = None
            _run(session, front.backend, all_reduce_step, targets, parsed)
            return
        front.repeat = repeat = Repeat(shared_vars, single, op, targets, parsed)
    else:  # (with one process too: its values are rounded all the same)
        if targets.by_name or not epoch.REPLAY:
            front.rounded = None
            _run(session, front.backend, low_precision_step, targets, parsed, rounding, False)
            return
        front.rounded = repeat = Repeat(shared_vars, single, op, targets, parsed, exchange,
                                        rounding)
    _run(session, front.backend, repeat.step)


def set_value(rank: int, shared_vars: Any, values: Any, batch: Any = None) -> None:
    """Set the variables of process ``rank`` only.

    Collective: every process takes part; returns when all have finished (when
    ``rank`` is the master's, no other process is involved).

    Parameters
    ----------
    rank : int
        The process whose variables change.
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions.
    values : array_like, synk.Data, or list of them
        One per variable; cast only where PyTensor would.
    batch : int, slice, or 1-d sequence of int, optional
        Rows of ``values`` to use (values must then agree in length).

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError, TypeError
        A rank out of range; values that do not fit; a bad ``batch``.

    Examples
    --------
    >>> synk.set_value(1, w, [7, 8])      # doctest: +SKIP
    rank 0: w = [1, 2]    rank 1: w = [7, 8]
    """
    session, front, targets, single = begin("set_value", shared_vars)
    rank = check_rank(session, rank)
    values = filter_values(targets, values, single, keep_data=True)
    if batch is None:
        selection = None
    else:
        selection = rows_batch(targets, values, batch, "set_value with batch")
        check_fixed_length(targets, [[selection.length]] * len(values), "set_value")
    if rank == session.ctx.master_rank:
        session.check_usable()  # no command: the master alone changes
        for var, value in zip(targets.variables, values, strict=True):
            whole = value if isinstance(value, np.ndarray) else value.data
            store_value(session.ctx, var, np.array(select_rows(whole, selection)))
        _overwritten(session, targets)
        return
    _run(session, front.backend, place_step, targets, values, (selection,) * len(values), rank)


def get_value(rank: int, shared_vars: Any) -> Any:
    """Copies of the values of process ``rank``'s variables.

    Collective: every process takes part; returns when all have finished (when
    ``rank`` is the master's, no other process is involved).

    Parameters
    ----------
    rank : int
        The process to read.
    shared_vars : SharedVariable, str, or list of them
        Shared variables of distributed functions.

    Returns
    -------
    numpy.ndarray or list of numpy.ndarray

    Examples
    --------
    >>> synk.get_value(1, w)              # doctest: +SKIP
    array([3., 4.], dtype=float32)
    """
    session, front, targets, single = begin("get_value", shared_vars)
    rank = check_rank(session, rank)
    if rank == session.ctx.master_rank:
        session.check_usable()  # no command: the master alone reads
        return one_or_list([np.array(_pytensor.value(var)) for var in targets.variables],
                           single)
    backend = front.backend
    shapes = _shapes(session, backend, targets)[rank]
    return one_or_list(_run(session, backend, get_value_step, targets, rank, shapes), single)


def get_shapes(shared_vars: Any) -> Any:
    """The shape of each variable in every process.

    Collective: every process takes part; returns when all have finished.

    Returns
    -------
    list of tuple, or list of list of tuple
        For one variable, its shape per rank; for a list, one such list per variable.

    Examples
    --------
    >>> synk.get_shapes(w)                # doctest: +SKIP
    [(2,), (2,)]
    """
    session, front, targets, single = begin("get_shapes", shared_vars)
    shapes = _shapes(session, front.backend, targets)
    per_var = [[tuple(rank_shapes[i]) for rank_shapes in shapes]
               for i in range(len(targets.uids))]
    return one_or_list(per_var, single)


def get_lengths(shared_vars: Any) -> Any:
    """The length (axis 0) of each variable in every process.

    Collective: every process takes part; returns when all have finished.

    Returns
    -------
    list of int, or list of list of int
        For one variable, its length per rank; for a list, one such list per variable.

    Raises
    ------
    ValueError
        A 0-d variable (it has no length).

    Examples
    --------
    >>> synk.scatter(w, [1, 2, 3]); synk.get_lengths(w)   # doctest: +SKIP
    [2, 1]
    """
    session, front, targets, single = begin("get_lengths", shared_vars)
    for label, ndim in zip(targets.labels, targets.ndims, strict=True):
        if ndim == 0:
            raise ValueError(f"{label} is 0-d and has no length; use get_shapes")
    shapes = _shapes(session, front.backend, targets)
    per_var = [[rank_shapes[i][0] for rank_shapes in shapes]
               for i in range(len(targets.uids))]
    return one_or_list(per_var, single)
