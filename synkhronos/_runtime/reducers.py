"""Reduction kernels: the one module where values of several processes are combined.

It owns the set of reduce operations (:class:`ReduceOp`) and the parsing of the
user's ``op`` argument, and two families of kernels:

- weighted, for function outputs: :class:`Accumulator` combines values that arrive one
  at a time (a process's slices), and :func:`reduce_values` the processes' replies;
  weights are row counts, so ``avg`` of per-process means is the mean over all rows;
- equal, for the collectives (every process counts once): :func:`combine_into` into a
  given buffer (a piece of an exchange slot), :func:`combined` into a new array, and
  :func:`ufunc_of`, the one ufunc table, which the leaders' folds between machines
  (``mpi/exchange.py``) use too.

Numpy only: it lives in ``_runtime`` so that the MPI layer can use it; the layers
above import it as ``synkhronos._reducers``.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

__all__ = ["Accumulator", "ReduceOp", "combine_into", "combined", "parse_op",
           "reduce_one", "reduce_pairs", "reduce_two", "reduce_values", "ufunc_of"]


class ReduceOp(enum.Enum):
    """How values from several processes are combined."""

    AVG = "avg"
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    GATHER = "gather"
    NONE = "none"  # no reduction: the master's own result (the user writes ``None``)

    # Members are singletons compared by identity: hash them so too, in C (Enum's own
    # hash runs in Python, and messages carrying an op are hashed on every command).
    __hash__ = object.__hash__


_UFUNCS = {
    ReduceOp.AVG: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MAX: np.maximum,
    ReduceOp.MIN: np.minimum,
}


_AVG = ReduceOp.AVG  # (an enum member costs a lookup in Python 3.11: hot paths use this)
_PER_PROCESS = (ReduceOp.GATHER, ReduceOp.NONE)  # ops that only function outputs take


def parse_op(op: Any, *, allow_gather: bool = True) -> ReduceOp:
    """Turn the user's ``op`` argument into a :class:`ReduceOp`.

    Parameters
    ----------
    op : str, ReduceOp or None
        One of ``"avg"``, ``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"gather"``
        (case-insensitive), the original Synkhronos' host-side spellings ``"c_avg"``,
        ``"c_sum"``, ... (aliases of the plain ops), a :class:`ReduceOp`, or None: no
        reduction (the master keeps its own result).
    allow_gather : bool, optional
        Whether the function-output-only ops (gather, and None) are acceptable here.

    Returns
    -------
    ReduceOp

    Raises
    ------
    TypeError
        If ``op`` is not a string, a ReduceOp or None.
    ValueError
        If ``op`` names no known operation, or is gather / None where that is not
        allowed.
    """
    if isinstance(op, ReduceOp) and (allow_gather or op not in _PER_PROCESS):
        return op  # the hot path: already parsed
    valid = [o.value for o in ReduceOp
             if o is not ReduceOp.NONE and (allow_gather or o not in _PER_PROCESS)]
    if op is None:
        parsed = ReduceOp.NONE
    elif isinstance(op, ReduceOp):
        parsed = op
    elif isinstance(op, str):
        name = op.lower()
        if name.startswith("c_"):
            name = name[2:]
        try:
            parsed = ReduceOp(name)
        except ValueError:
            raise ValueError(f"op must be one of {', '.join(valid)}"
                             f"{' or None' if allow_gather else ''}; got {op!r}") from None
    else:
        raise TypeError(f"op must be a string, a ReduceOp or None; got {type(op).__name__}")
    if parsed in _PER_PROCESS and not allow_gather:
        shown = "None" if parsed is ReduceOp.NONE else repr(op)
        raise ValueError(f"op must be one of {', '.join(valid)} here (gather and None "
                         f"are for function outputs); got {shown}")
    return parsed


def _check_weight(weight: Any) -> int:
    if isinstance(weight, (bool, np.bool_)) or not isinstance(weight, (int, np.integer)):
        raise TypeError(f"weight must be a non-negative integer; got {type(weight).__name__}")
    if weight < 0:
        raise ValueError(f"weight must be a non-negative integer; got {weight}")
    return int(weight)


class Accumulator:
    """Combine values that arrive one at a time, each weighted by its row count.

    ``avg`` is the weighted mean (equal weights if every weight is 0), accumulated
    in float64 / complex128 and returned in the first value's dtype when that is
    inexact, else float64. ``sum``, ``prod``, ``max`` and ``min`` are elementwise
    in the first value's dtype, computed in place in a private copy. ``gather``
    concatenates along axis 0 in arrival order (0-d values are stacked into 1-d).
    ``none`` (an output not reduced over processes) also concatenates: it puts one
    process's slices back together in row order.

    Parameters
    ----------
    op : ReduceOp or str
        The operation.
    """

    def __init__(self, op: ReduceOp | str) -> None:
        self._op = op = parse_op(op)
        # (asked at every value: looked up once; an enum's hash costs in Python 3.11)
        self._gathers = op in _PER_PROCESS
        self._ufunc: Any = _UFUNCS.get(op)
        self._count = 0
        self._total_weight = 0
        self._first_dtype: Any = None
        self._shape: Any = None
        self._acc: Any = None  # the running result (an ndarray once a value came)
        self._scratch: Any = None
        self._pieces: list[np.ndarray] = []
        self._handed_out = False  # result() returned self._acc; copy before changing it

    @property
    def op(self) -> ReduceOp:
        """The operation."""
        return self._op

    @property
    def count(self) -> int:
        """Number of values added so far."""
        return self._count

    @property
    def total_weight(self) -> int:
        """Sum of the weights added so far."""
        return self._total_weight

    def add(self, value: Any, weight: int) -> None:
        """Combine one more value.

        Parameters
        ----------
        value : array_like or scalar
            The value; never modified, and not referenced after this call returns.
        weight : int
            Its weight (row count), >= 0.
        """
        if type(weight) is not int or weight < 0:
            weight = _check_weight(weight)
        arr = value if type(value) is np.ndarray else np.asarray(value)
        if self._gathers:  # one process's slices, back in row order
            self._add_gather(arr)
        elif self._acc is None:
            self._first_dtype, self._shape = arr.dtype, arr.shape
            if self._op is _AVG:
                self._acc = np.empty(arr.shape, dtype=_avg_dtype(arr.dtype))
                if weight > 1:  # weight 0 is kept unweighted, see _add_avg
                    np.multiply(arr, weight, out=self._acc, dtype=self._acc.dtype)
                else:
                    np.copyto(self._acc, arr, casting="unsafe")
            else:
                self._acc = np.array(arr, copy=True)
        else:
            if arr.shape != self._shape:
                raise ValueError(f"value shape {arr.shape} does not match the first "
                                 f"value's shape {self._shape}")
            if self._handed_out:
                self._acc = self._acc.copy()
                self._handed_out = False
            acc = self._acc
            if self._op is _AVG:
                self._add_avg(arr, weight)
            elif arr.dtype is acc.dtype:
                self._ufunc(acc, arr, out=acc)
            else:
                self._ufunc(acc, arr, out=acc, casting="unsafe")
        self._count += 1
        self._total_weight += weight

    def _add_gather(self, arr: np.ndarray) -> None:
        if self._pieces:
            first = self._pieces[0]
            if (arr.ndim == 0) != (first.ndim == 0) or arr.shape[1:] != first.shape[1:]:
                raise ValueError(f"value shape {arr.shape} cannot be gathered with the "
                                 f"first value's shape {first.shape}")
        self._pieces.append(arr.copy())

    def _add_avg(self, arr: np.ndarray, weight: int) -> None:
        acc = self._acc
        need = _avg_dtype(arr.dtype)
        if need != acc.dtype and np.can_cast(acc.dtype, need):
            acc = self._acc = acc.astype(need)
            self._scratch = None
        if self._total_weight == 0 and weight > 0:
            # Everything so far had weight 0 (kept as an unweighted sum); restart.
            np.multiply(arr, weight, out=acc, dtype=acc.dtype, casting="unsafe")
        elif weight == 1 or (weight == 0 and self._total_weight == 0):
            np.add(acc, arr, out=acc, dtype=acc.dtype, casting="unsafe")
        elif weight > 0:
            if self._scratch is None:
                self._scratch = np.empty_like(acc)
            np.multiply(arr, weight, out=self._scratch, dtype=acc.dtype, casting="unsafe")
            np.add(acc, self._scratch, out=acc)

    def result(self) -> np.ndarray | None:
        """The combined value so far (an ndarray, 0-d for scalars), or None if empty."""
        if self._count == 0:
            return None
        if self._op in _PER_PROCESS:
            if self._pieces[0].ndim == 0:
                return np.stack(self._pieces)
            return np.concatenate(self._pieces, axis=0)
        if self._op is _AVG:
            dtype = self._first_dtype if self._first_dtype.kind in "fc" else np.float64
            if self._acc.dtype.kind == "c":
                dtype = np.result_type(dtype, np.complex64)
            out = np.empty(self._shape, dtype=dtype)
            divisor = self._total_weight or self._count
            np.divide(self._acc, divisor, out=out, casting="unsafe")
            return out
        self._handed_out = True
        return self._acc


_AVG_DTYPES: dict[np.dtype, np.dtype] = {}  # _avg_dtype's answers, for _average_two
_WEIGHTS: dict[tuple[int, np.dtype], np.ndarray] = {}  # _weight's 0-d arrays
_FLOAT64 = np.dtype(np.float64)


def _avg_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulation dtype for ``avg``: float64 or complex128 (wider kept)."""
    if dtype.kind not in "biufc":
        raise TypeError(f"op 'avg' needs numeric values; got dtype {dtype}")
    return np.promote_types(dtype, np.float64)


def reduce_values(op: ReduceOp | str, values: list, weights: list[int]) -> np.ndarray | None:
    """Combine ``values`` with ``weights`` by ``op`` (see :class:`Accumulator`).

    Parameters
    ----------
    op : ReduceOp or str
        The operation.
    values : list of array_like
        The values, in order.
    weights : list of int
        One non-negative weight per value.

    Returns
    -------
    np.ndarray or None
        The combined value, or None if ``values`` is empty.
    """
    if len(values) != len(weights):
        raise ValueError(f"weights must have one entry per value ({len(values)}); "
                         f"got {len(weights)}")
    if type(op) is not ReduceOp:
        op = parse_op(op)
    if _uniform(op, values, weights):
        return _reduce_uniform(op, values, weights)
    acc = Accumulator(op)
    for value, weight in zip(values, weights, strict=True):
        acc.add(value, weight)
    return acc.result()


def reduce_one(op: ReduceOp, value: Any, weight: int) -> Any:
    """``reduce_values(op, [value], [weight])``: a copy of a numeric array (an ``avg``
    of one value is that value, not ``value * weight / weight``)."""
    if (type(value) is np.ndarray and op not in _PER_PROCESS
            and value.dtype.kind in ("fc" if op is _AVG else "biufc")):
        return value.copy()
    return reduce_values(op, [value], [weight])


def reduce_pairs(ops: tuple[ReduceOp, ...], first: list, first_weight: int, second: list,
                 second_weight: int) -> list:
    """``reduce_two`` of each output (``first[i]``, ``second[i]`` by ``ops[i]``): two
    processes' replies, every output of a call at n=2."""
    if len(ops) == 1:  # one output (a loss, a likelihood and its gradient): no loop
        return [reduce_two(ops[0], first[0], first_weight, second[0], second_weight)]
    results = []
    i = 0
    for op in ops:
        results.append(reduce_two(op, first[i], first_weight, second[i], second_weight))
        i += 1
    return results


def reduce_two(op: ReduceOp, first: Any, first_weight: int, second: Any,
               second_weight: int) -> Any:
    """``reduce_values(op, [first, second], [first_weight, second_weight])`` (two
    processes' replies, the common case of a call), with ``_uniform``'s checks written
    out for two values."""
    if type(first) is np.ndarray and type(second) is np.ndarray and op not in _PER_PROCESS:
        dtype = first.dtype
        if ((second.dtype is dtype or second.dtype == dtype) and first.shape == second.shape
                and dtype.kind in "biufc" and type(first_weight) is int
                and type(second_weight) is int and first_weight > 0 and second_weight > 0):
            if op is not _AVG:  # ``combined``, written out
                if first.ndim:  # same dtypes: the ufunc's result has theirs
                    return _UFUNCS[op](first, second)
                out = np.empty(first.shape, dtype)  # (0-d: a ufunc returns a scalar)
                _UFUNCS[op](first, second, out=out)
                return out
            if first.ndim:  # (numpy hands back a scalar for 0-d: the general path)
                return _average_two(first, first_weight, second, second_weight)
            return _reduce_uniform(op, [first, second], [first_weight, second_weight])
    return reduce_values(op, [first, second], [first_weight, second_weight])


def _average_two(first: np.ndarray, first_weight: int, second: np.ndarray,
                 second_weight: int) -> np.ndarray:
    """``_reduce_uniform``'s ``avg`` of two arrays (not 0-d): the same operations in the
    same order, in as few numpy calls as they take (``avg`` is every output's default
    op, and a call's two replies come here). The weights are 0-d arrays of the
    accumulator's dtype (``_weight``): the same values as the ints they stand for, and
    an array operand costs numpy a third of what a Python int does."""
    dtype = first.dtype
    acc_dtype = _AVG_DTYPES.get(dtype)
    if acc_dtype is None:
        acc_dtype = _AVG_DTYPES[dtype] = _avg_dtype(dtype)
    if first_weight == 1:
        acc = np.array(first, dtype=acc_dtype)
    else:
        acc = np.multiply(first, _weight(first_weight, acc_dtype))
    if second_weight == 1:
        np.add(acc, second, out=acc)
    else:
        np.add(acc, np.multiply(second, _weight(second_weight, acc_dtype)), out=acc)
    total = _weight(first_weight + second_weight, acc_dtype)
    if dtype == acc_dtype:
        np.true_divide(acc, total, out=acc)
        return acc
    out = np.empty(first.shape, dtype if dtype.kind in "fc" else _FLOAT64)
    np.true_divide(acc, total, out=out, casting="unsafe")
    return out


def _weight(weight: int, dtype: np.dtype) -> np.ndarray:
    """``weight`` as a 0-d array of ``dtype`` (kept: row counts repeat call after call;
    read only, never written)."""
    key = (weight, dtype)
    value = _WEIGHTS.get(key)
    if value is None:
        if len(_WEIGHTS) >= 4096:  # many different row counts: start again
            _WEIGHTS.clear()
        value = _WEIGHTS[key] = np.array(weight, dtype=dtype)
        value.flags.writeable = False
    return value


def _uniform(op: ReduceOp, values: list, weights: list) -> bool:
    """The common case: same-dtype, same-shape numeric arrays, every weight positive."""
    if op in _PER_PROCESS or not values:
        return False
    first = values[0]
    if type(first) is not np.ndarray:
        return False
    dtype, shape = first.dtype, first.shape
    if dtype.kind not in "biufc":
        return False
    for value in values[1:]:  # (reduce_values checked that there is one weight per value)
        if (type(value) is not np.ndarray or value.shape != shape
                or (value.dtype is not dtype and value.dtype != dtype)):
            return False
    for weight in weights:
        if type(weight) is not int or weight <= 0:
            return False
    return True


def _reduce_uniform(op: ReduceOp, values: list, weights: list[int]) -> np.ndarray:
    """What ``Accumulator`` computes for ``_uniform`` values, the same operations in the
    same order, without its per-value bookkeeping (a call's reply is reduced this way).
    """
    first = values[0]
    if op is not _AVG:  # ``combined``, written out (a call's reply comes here)
        if len(values) == 1:
            return first.copy()
        ufunc = _UFUNCS[op]
        out = np.empty(first.shape, first.dtype)
        ufunc(first, values[1], out=out)
        for value in values[2:]:
            ufunc(out, value, out=out)
        return out
    acc_dtype = _avg_dtype(first.dtype)
    acc = np.array(first, dtype=acc_dtype)  # a copy, 0-d included
    if weights[0] != 1:
        acc *= weights[0]
    native = first.dtype == acc_dtype  # then value * weight is already in acc_dtype
    for value, weight in zip(values[1:], weights[1:], strict=True):
        if weight == 1:
            acc += value
        else:
            acc += value * weight if native else np.multiply(value, weight, dtype=acc_dtype)
    acc /= sum(weights)
    dtype = first.dtype if first.dtype.kind in "fc" else np.dtype(np.float64)
    return acc if acc.dtype == dtype else acc.astype(dtype)


# -- the collectives' kernels: every process counts once ---------------------------------
_KERNELS = {op: (ufunc, op is ReduceOp.AVG) for op, ufunc in _UFUNCS.items()}


def ufunc_of(op: ReduceOp) -> tuple[np.ufunc, bool]:
    """The ufunc that combines two values by ``op``, and whether to divide by the count
    after (``avg`` is the sum divided by the number of values)."""
    return _KERNELS[op]


def combine_into(out: np.ndarray, first: np.ndarray, others: list[np.ndarray],
                 op: ReduceOp) -> None:
    """``out = op(first, *others)`` elementwise; ``avg`` is the plain mean.

    ``first`` may be ``out`` itself; no other value may overlap ``out``. No checks:
    the collectives call this on buffers they laid out (same shape and dtype).
    """
    if not others:
        if first is not out:
            np.copyto(out, first)
        return
    ufunc, mean = _KERNELS[op]
    ufunc(first, others[0], out=out)
    for other in others[1:]:
        ufunc(out, other, out=out)
    if mean:
        np.true_divide(out, len(others) + 1, out=out)


def combined(values: np.ndarray, op: ReduceOp) -> np.ndarray:
    """A new array: ``op`` over the first axis of ``values`` (one value per index).

    ``values`` is the collectives' ``Group.columns`` entry: one variable in every slot
    (``backend.column``), combined in one ``ufunc.reduce``, where a list of the slots
    would take a call per value (a sum of 16 values of one float: 1.5 against
    11.9 us). Every rank that combines the same values gets the same bits.
    """
    first = values[0]
    if len(values) == 1:
        return first.copy()
    out = np.empty(first.shape, first.dtype)
    ufunc, mean = _KERNELS[op]
    ufunc.reduce(values, axis=0, dtype=first.dtype, out=out)
    if mean:
        np.true_divide(out, len(values), out=out)
    return out
