"""The public collectives on shared variables: validate in the master, then one exchange.

Every function here follows the same path::

    1. session    forked, usable, and at least one ``synk.distribute()`` done
    2. targets    the shared variables (one or a list) -> their ids in every process;
                  a variable no distributed function uses is a ValueError naming it
    3. arguments  op, rank, nd_up, batch; values filtered by each variable's own type
                  (cast only where PyTensor would cast)
    4. exchange   the session's backend (``backend_for``) runs it: one command, or a
                  small shape query and one command where sizes must be known first;
                  ``Session.run`` checks the session is usable (not broken, not inside
                  another command, the forking thread) before anything moves, and the
                  few paths without a command check it themselves

Every error of steps 1-3 is raised before any process moves. A list of variables
travels as one fused buffer, and a single variable returns a single value where a
list returns a list.

Per-rank examples below use two processes, with ``w`` a float32 vector holding
``[1, 2]`` in rank 0 (the master) and ``[3, 4]`` in rank 1.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.tensor.type import TensorType

from .._reducers import ReduceOp, parse_op
from .._scatter import Batch, normalize_batch
from ..distribute import registry
from ..session import Session, current, require
from .backend import Targets, backend_for

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
_OPS = {op.value: op for op in ReduceOp if op is not ReduceOp.GATHER}
_CACHE_LIMIT = 256


# -- steps 1-3 ---------------------------------------------------------------------------
class _Front:
    """The master's per-session state of this module: the registry, the backend, and
    the validated targets of recent calls, keyed by the ids of their variables."""

    def __init__(self, session: Session) -> None:
        self.registry = registry(session)
        self.backend = backend_for(session)
        self.targets: dict[Any, Targets] = {}


def _begin(what: str, shared_vars: Any) -> tuple[Session, _Front, Targets, bool]:
    """The session, its front, the validated targets, and whether one variable came."""
    session = current()
    if session is None:
        require(f"synk.{what}()")  # raises, saying to call synk.fork() first
    if not session.is_master:
        session.check_usable()  # raises: only the master issues commands
    front = session.local_or_none("collectives.api")  # the hot path: no closure to build
    if front is None:
        front = session.local("collectives.api", lambda: _Front(session))
    if not front.registry.distributed_once:
        raise RuntimeError(
            f"call synk.distribute() before synk.{what}(): collectives act on the shared "
            "variables of distributed functions"
        )
    single = not isinstance(shared_vars, (list, tuple))
    key = id(shared_vars) if single else tuple(map(id, shared_vars))
    targets = front.targets.get(key)  # it holds the variables, so their ids stay theirs
    if targets is None:
        variables = (shared_vars,) if single else tuple(shared_vars)
        targets = _resolve(front.registry, variables, single)
        if len(front.targets) >= _CACHE_LIMIT:
            front.targets.clear()
        front.targets[key] = targets
    return session, front, targets, single


def _label(var: Any, index: int, single: bool) -> str:
    where = "" if single else f" (shared_vars[{index}])"
    name = getattr(var, "name", None)
    return f"shared variable {name!r}{where}" if name else f"unnamed shared variable{where}"


def _resolve(reg: Any, variables: tuple, single: bool) -> Targets:
    if not variables:
        raise ValueError("shared_vars is empty; give a shared variable or a list of them")
    uids, labels = [], []
    for i, var in enumerate(variables):
        label = _label(var, i, single)
        if not isinstance(var, SharedVariable) or not isinstance(var.type, TensorType):
            raise TypeError(
                f"{label} must be a PyTensor tensor shared variable; got {type(var).__name__}"
            )
        uid = reg.uid(var)
        if uid is None:
            raise ValueError(
                f"{label} is not used by any distributed function; build a synk.function "
                "that uses it and call synk.distribute() first"
            )
        if uid in uids:
            raise ValueError(f"{label} appears more than once in shared_vars")
        uids.append(uid)
        labels.append(label)
    dtypes = tuple(np.dtype(var.type.dtype) for var in variables)
    return Targets(
        variables=variables,
        uids=tuple(uids),
        labels=tuple(labels),
        dtypes=dtypes,
        ndims=tuple(var.type.ndim for var in variables),
        inexact=all(dtype.kind in "fc" for dtype in dtypes),
    )


def _reduce_op(op: Any, targets: Targets) -> ReduceOp:
    parsed = _OPS.get(op) if isinstance(op, str) else None
    if parsed is None:
        parsed = parse_op(op, allow_gather=False)
    if parsed is ReduceOp.AVG and not targets.inexact:
        for label, dtype in zip(targets.labels, targets.dtypes, strict=True):
            if dtype.kind not in "fc":
                raise TypeError(
                    f"op 'avg' needs floating-point variables; {label} has dtype {dtype} "
                    "(use op='sum' and divide, or a float variable)"
                )
    return parsed


def _check_rank(session: Session, rank: Any) -> int:
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be an integer; got {type(rank).__name__}")
    if not 0 <= rank < session.n:
        raise ValueError(f"rank must be in 0..{session.n - 1} for {session.n} processes; "
                         f"got {rank}")
    return int(rank)


def _is_data(value: Any) -> bool:
    return hasattr(value, "ref") and hasattr(value, "alloc_size")


def _values(targets: Targets, values: Any, single: bool, keep_data: bool) -> list:
    """One value per variable, filtered by the variable's type.

    A ``synk.Data`` of the variable's dtype and ndim is kept as is when ``keep_data``
    (the ranks read it in place); any other value becomes a numpy array the variable
    could hold.
    """
    if single:
        values = [values]
    elif not isinstance(values, (list, tuple)):
        raise TypeError(f"values must be a list with one value per shared variable "
                        f"({len(targets.uids)}); got {type(values).__name__}")
    elif len(values) != len(targets.uids):
        raise ValueError(f"values must hold one value per shared variable "
                         f"({len(targets.uids)}); got {len(values)}")
    result = []
    for var, label, dtype, ndim, value in zip(
        targets.variables, targets.labels, targets.dtypes, targets.ndims, values, strict=True
    ):
        if _is_data(value):
            if keep_data and value.dtype == dtype and value.ndim == ndim:
                result.append(value)
                continue
            value = value.data
        try:
            result.append(np.asarray(var.type.filter(value, strict=False)))
        except (TypeError, ValueError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"value for {label} does not fit it: {exc}") from exc
    return result


def _rows_batch(targets: Targets, values: list, batch: Any, what: str) -> Batch:
    """The one row selection of ``values``, which must agree in length (axis 0)."""
    lengths = []
    for label, value in zip(targets.labels, values, strict=True):
        if value.ndim == 0:
            raise ValueError(f"{what} splits values along axis 0, but the value for "
                             f"{label} is 0-d")
        lengths.append(value.shape[0])
    if len(set(lengths)) > 1:
        pairs = zip(lengths, targets.labels, strict=True)
        got = ", ".join(f"{n} for {label}" for n, label in pairs)
        raise ValueError(f"{what} values must share their length along axis 0; got {got}")
    return normalize_batch(batch, lengths[0])


def _check_fixed_length(targets: Targets, lengths: list[list[int]], what: str) -> None:
    """Refuse new lengths that a variable's static shape forbids (``lengths[var]``)."""
    for var, label, per_rank in zip(targets.variables, targets.labels, lengths, strict=True):
        fixed = var.type.shape[0] if var.type.ndim else None
        if fixed is not None and any(length != fixed for length in per_rank):
            raise ValueError(f"{what} would give {label} lengths {per_rank}, but its type "
                             f"fixes its length to {fixed}")


def _one_or_list(results: list, single: bool) -> Any:
    return results[0] if single else results


# -- the collectives ---------------------------------------------------------------------
def broadcast(shared_vars: Any, values: Any = None) -> None:
    """Copy the master's values (or ``values``) into every process's variables.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
        Shared variables of distributed functions.
    values : array_like, synk.Data, or list of them, optional
        New values, one per variable (a single value for a single variable); cast
        only where PyTensor would. The master's variables take them too.

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
    session, front, targets, single = _begin("broadcast", shared_vars)
    if values is not None:
        values = _values(targets, values, single, keep_data=False)
    front.backend.broadcast(session, targets, values)


def scatter(shared_vars: Any, values: Any, batch: Any = None) -> None:
    """Split ``values`` along axis 0 and give each process its block of rows.

    Rows are cut as function inputs are: contiguous blocks in rank order, the first
    ``L % n`` ranks one row longer.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
        Shared variables of distributed functions.
    values : array_like, synk.Data, or list of them
        One per variable, all of the same length along axis 0. A ``synk.Data`` of
        the variable's dtype is read in place by every process.
    batch : int, slice, or 1-d sequence of int, optional
        Rows of ``values`` to scatter (as ``batch`` of a function call).

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or before the first ``synk.distribute()``.
    ValueError, TypeError
        Values that do not fit, differ in length, or are 0-d; a bad ``batch``.

    Examples
    --------
    >>> synk.scatter(w, [1, 2, 3])        # doctest: +SKIP
    rank 0: w = [1, 2]    rank 1: w = [3]
    """
    session, front, targets, single = _begin("scatter", shared_vars)
    values = _values(targets, values, single, keep_data=True)
    selection = _rows_batch(targets, values, batch, "scatter")
    counts = [selection.part(session.n, r).length for r in range(session.n)]
    _check_fixed_length(targets, [counts] * len(values), "scatter")
    front.backend.scatter(session, targets, values, selection)


def gather(shared_vars: Any, nd_up: int = 1) -> Any:
    """Every process's values, collected in the master; no value changes.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
        Shared variables of distributed functions.
    nd_up : {1, 0}
        1: stack on a new leading axis (shapes must agree across processes);
        0: concatenate along axis 0 (lengths may differ; 0-d values are stacked).

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
    session, front, targets, single = _begin("gather", shared_vars)
    if isinstance(nd_up, bool) or nd_up not in (0, 1):
        raise ValueError(f"nd_up must be 1 (stack) or 0 (concatenate); got {nd_up!r}")
    backend = front.backend
    shapes = backend.shapes(session, targets)
    for i, label in enumerate(targets.labels):
        per_rank = [rank_shapes[i] for rank_shapes in shapes]
        if nd_up == 1 and len(set(per_rank)) > 1:
            raise ValueError(f"gather with nd_up=1 stacks values, so {label} needs the same "
                             f"shape in every process; got {per_rank} (use nd_up=0 to "
                             "concatenate along axis 0)")
        if nd_up == 0 and len({s[1:] for s in per_rank}) > 1:
            raise ValueError(f"gather with nd_up=0 concatenates along axis 0, so {label} "
                             f"needs the same trailing shape in every process; got {per_rank}")
    parts = backend.gather(session, targets, shapes)
    results = [
        np.stack(pieces) if nd_up == 1 or pieces[0].ndim == 0 else np.concatenate(pieces)
        for pieces in parts
    ]
    return _one_or_list(results, single)


def all_gather(shared_vars: Any) -> None:
    """Every process's variables become the concatenation of all processes' values.

    Values are joined along axis 0 in rank order; lengths may differ across
    processes (after an uneven ``scatter``), trailing shapes may not.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
        Shared variables of distributed functions, at least 1-d.

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
    session, front, targets, _ = _begin("all_gather", shared_vars)
    for label, ndim in zip(targets.labels, targets.ndims, strict=True):
        if ndim == 0:
            raise ValueError(f"all_gather concatenates along axis 0, but {label} is 0-d")
    backend = front.backend
    shapes = backend.shapes(session, targets)
    for i, label in enumerate(targets.labels):
        per_rank = [rank_shapes[i] for rank_shapes in shapes]
        if len({s[1:] for s in per_rank}) > 1:
            raise ValueError(f"all_gather concatenates along axis 0, so {label} needs the "
                             f"same trailing shape in every process; got {per_rank}")
    total = [sum(rank_shapes[i][0] for rank_shapes in shapes)
             for i in range(len(targets.uids))]
    _check_fixed_length(targets, [[n] for n in total], "all_gather")
    backend.all_gather(session, targets, shapes)


def reduce(shared_vars: Any, op: Op = "avg", in_place: bool = True) -> Any:
    """Combine every process's values elementwise into the master.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
        Shared variables of distributed functions, of the same shape in every process.
    op : {"avg", "sum", "prod", "max", "min"}
        ``"avg"`` is the plain mean over processes (floating variables only).
    in_place : bool
        True: the result goes into the master's variables and None is returned.
        False: the result is returned as new arrays; no process's value changes.

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
    session, front, targets, single = _begin("reduce", shared_vars)
    parsed = _reduce_op(op, targets)
    results = front.backend.reduce(session, targets, parsed, bool(in_place))
    return None if in_place else _one_or_list(results, single)


def all_reduce(shared_vars: Any, op: Op = "avg") -> None:
    """Combine every process's values elementwise; the result goes into every process.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
        Shared variables of distributed functions, of the same shape in every process.
        A list travels as one fused buffer: prefer one call on a list (or one
        flattened variable) to many calls.
    op : {"avg", "sum", "prod", "max", "min"}
        ``"avg"`` is the plain mean over processes (floating variables only).

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
    >>> synk.all_reduce(w)                # doctest: +SKIP
    rank 0: w = [2, 3]    rank 1: w = [2, 3]
    >>> synk.all_reduce(w, op="sum")      # doctest: +SKIP
    rank 0: w = [4, 6]    rank 1: w = [4, 6]
    """
    session, front, targets, _ = _begin("all_reduce", shared_vars)
    front.backend.all_reduce(session, targets, _reduce_op(op, targets))


def set_value(rank: int, shared_vars: Any, values: Any, batch: Any = None) -> None:
    """Set the variables of process ``rank`` only.

    Collective: every process takes part; returns when all have finished (when
    ``rank`` is the master's, no other process is involved).

    Parameters
    ----------
    rank : int
        The process whose variables change.
    shared_vars : SharedVariable or list of SharedVariable
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
    session, front, targets, single = _begin("set_value", shared_vars)
    rank = _check_rank(session, rank)
    values = _values(targets, values, single, keep_data=True)
    if batch is None:
        selection = None
    else:
        selection = _rows_batch(targets, values, batch, "set_value with batch")
        _check_fixed_length(targets, [[selection.length]] * len(values), "set_value")
    front.backend.set_value(session, rank, targets, values, selection)


def get_value(rank: int, shared_vars: Any) -> Any:
    """Copies of the values of process ``rank``'s variables.

    Collective: every process takes part; returns when all have finished (when
    ``rank`` is the master's, no other process is involved).

    Parameters
    ----------
    rank : int
        The process to read.
    shared_vars : SharedVariable or list of SharedVariable
        Shared variables of distributed functions.

    Returns
    -------
    numpy.ndarray or list of numpy.ndarray

    Examples
    --------
    >>> synk.get_value(1, w)              # doctest: +SKIP
    array([3., 4.], dtype=float32)
    """
    session, front, targets, single = _begin("get_value", shared_vars)
    rank = _check_rank(session, rank)
    return _one_or_list(front.backend.get_value(session, rank, targets), single)


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
    session, front, targets, single = _begin("get_shapes", shared_vars)
    shapes = front.backend.shapes(session, targets)
    per_var = [[tuple(rank_shapes[i]) for rank_shapes in shapes]
               for i in range(len(targets.uids))]
    return _one_or_list(per_var, single)


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
    session, front, targets, single = _begin("get_lengths", shared_vars)
    for label, ndim in zip(targets.labels, targets.ndims, strict=True):
        if ndim == 0:
            raise ValueError(f"{label} is 0-d and has no length; use get_shapes")
    shapes = front.backend.shapes(session, targets)
    per_var = [[rank_shapes[i][0] for rank_shapes in shapes]
               for i in range(len(targets.uids))]
    return _one_or_list(per_var, single)
