"""Pure checks of one call's arguments, in the master, before anything moves.

Everything a caller can get wrong that the master can see is caught here, with a
``TypeError`` or ``ValueError`` that names the input; nothing is written anywhere:

- ``Binder``: positional and keyword arguments -> one value per input;
- ``check_inputs``: ndim, dtype (cast only where PyTensor would cast: the input's
  own ``type.filter`` decides), agreeing lengths of scattered inputs, minibatch Data,
  ``batch``;
- ``check_batch_s``: the form of ``batch_s``; its ranges are checked by each process
  against its own rows, inside the call, all or nothing (``_shard``);
- ``check_subset``, ``check_num_slices``;
- ``trustable``: whether these checks cover all PyTensor would check per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pytensor.tensor.type import TensorType

from ._scatter import Batch, normalize_batch, split_batch_s
from .data import Data

__all__ = ["Binder", "Checked", "check_inputs", "check_batch_s", "check_subset",
           "check_num_slices", "label", "trustable"]

_MISSING = object()


def label(var: Any, index: int) -> str:
    """How messages name input ``index``."""
    return f"input {index} ({var.name!r})" if var.name else f"input {index}"


def _is_data(value: Any) -> bool:
    return isinstance(value, Data)


class Binder:
    """Maps a call's positional and keyword arguments onto the function's inputs."""

    def __init__(self, signature: list, n_scattered: int):
        self.signature = signature
        self.n_scattered = n_scattered
        self.index = {var.name: i for i, var in enumerate(signature) if var.name}

    def bind(self, args: tuple, kwargs: dict) -> list:
        size = len(self.signature)
        if len(args) > size:
            raise TypeError(
                f"the function takes {size} inputs (inputs + bcast_inputs); got {len(args)}"
            )
        values = list(args) + [_MISSING] * (size - len(args))
        for key, value in kwargs.items():
            i = self.index.get(key)
            if i is None:
                raise TypeError(f"unexpected keyword argument {key!r}: no input has that name")
            if values[i] is not _MISSING:
                raise TypeError(f"got multiple values for input {key!r}")
            values[i] = value
        missing = [label(self.signature[i], i) for i, v in enumerate(values) if v is _MISSING]
        if missing:
            raise TypeError(f"missing a value for {', '.join(missing)}")
        return values


@dataclass
class Checked:
    """A call's inputs after validation, before staging."""

    values: list  # Data objects, or numpy arrays of the input's dtype
    casts: tuple  # per input: dtype a Data must be cast to in each process, or None
    length: int  # rows of the scattered inputs (0 if none)
    batch: Batch | None
    total_rows: int
    minibatch: tuple[bool, ...] | None = None  # per scattered input, if any is a buffer


# (input type, Data dtype, allow_downcast) -> whether PyTensor would cast; types hash
# by value, so equal inputs of different functions share an answer.
_castable: dict[tuple[Any, np.dtype, Any], bool] = {}


def trustable(inputs: list, n_scattered: int, n_bcast: int) -> bool:
    """Whether the master's checks cover everything PyTensor would check per call.

    True when every input is a dense tensor, every scattered input has no static
    length along axis 0 (a process's share of rows then always fits the type; the
    master checks the rest of its shape), and the sliceable shared variables'
    stand-ins have no static shape at all (their values are never checked by the
    master: collectives may have put rows of any shape there).
    """
    for i, var in enumerate(inputs):
        if type(var.type) is not TensorType:  # sparse and other subclasses filter
            return False
        if i >= n_scattered + n_bcast:  # a sliceable shared variable's rows: unchecked
            if var.ndim == 0 or var.type.shape.count(None) != var.ndim:
                return False
        elif i < n_scattered and (var.ndim == 0 or var.type.shape[0] is not None):
            return False
    return True


def _check_static_shape(var: Any, index: int, shape: tuple, rows_axis: int | None) -> None:
    static = var.type.shape
    if static.count(None) == len(static):  # the common case, checked cheaply
        return
    for axis, (want, got) in enumerate(zip(static, shape, strict=True)):
        if want is not None and want != got and axis != rows_axis:
            raise ValueError(
                f"{label(var, index)} has static shape {static}; got a Data of shape "
                f"{shape} (axis {axis} must be {want})"
            )


def _check_data(var: Any, index: int, value: Any, allow_downcast: Any,
                rows_axis: int | None) -> str | None:
    """Validate a Data input against its variable; return the dtype to cast to, or None."""
    if value.ndim != var.ndim:
        raise TypeError(
            f"{label(var, index)} expects {var.ndim} dimensions; got a Data with {value.ndim}"
        )
    _check_static_shape(var, index, value.shape, rows_axis)
    if value.dtype == var.type.numpy_dtype:
        return None
    name = label(var, index)
    key = (var.type, value.dtype, allow_downcast)
    ok = _castable.get(key)
    if ok is None:
        probe = np.zeros((1,) * var.ndim, dtype=value.dtype)
        try:
            var.type.filter(probe, strict=False, allow_downcast=allow_downcast)
            ok = True
        except TypeError:
            ok = False
        _castable[key] = ok
    if not ok:
        raise TypeError(
            f"{name} expects dtype {var.dtype}; got a Data of dtype {value.dtype}, "
            "which PyTensor would not cast (make the Data with the input's dtype)"
        )
    return var.dtype


def check_inputs(signature: list, n_scattered: int, values: list, batch: Any,
                 allow_downcast: Any = None, axes: tuple[int, ...] | None = None) -> Checked:
    """Validate every input value and ``batch``; nothing is written anywhere.

    ``axes``: the axis each scattered input's rows lie along (``in_axes``), None: 0.

    Scattered inputs that are not minibatch Data must agree in length; ``batch``
    selects among their rows. A minibatch ``Data`` is not indexed: it supplies its
    first ``len(selection)`` rows, so it must hold at least that many (with only
    minibatch inputs and no ``batch``, they must agree in length; with ``batch``, it
    is checked against the shortest).
    """
    checked, casts, minibatch = [], [], []
    lengths: list[tuple[int, int]] = []  # (input index, length) of indexed inputs
    buffers: list[tuple[int, int]] = []  # the same, of minibatch Data
    for i, (var, value) in enumerate(zip(signature, values, strict=True)):
        scattered = i < n_scattered
        axis = (axes[i] if axes is not None else 0) if scattered else None
        if _is_data(value):
            casts.append(_check_data(var, i, value, allow_downcast, axis))
            shape = value.shape
        else:
            try:
                value = var.type.filter(value, strict=False, allow_downcast=allow_downcast)
            except TypeError as exc:
                raise TypeError(f"{label(var, i)}: {exc}") from exc
            if not value.flags.c_contiguous:  # (np.ascontiguousarray makes 0-d into 1-d)
                value = value.copy(order="C")
            casts.append(None)
            shape = value.shape
        checked.append(value)
        if axis is not None:
            if len(shape) == 0:
                raise ValueError(f"{label(var, i)} is scattered along axis 0 but is a scalar")
            is_buffer = _is_data(value) and value.minibatch
            minibatch.append(is_buffer)
            (buffers if is_buffer else lengths).append((i, shape[axis]))
    for group in (lengths, buffers if not lengths and batch is None else []):
        for i, length in group[1:]:
            if length != group[0][1]:
                first = group[0][0]
                along = "axis 0" if axes is None else "their axis of rows (in_axes)"
                raise ValueError(
                    f"scattered inputs must share their length along {along}; got "
                    f"{group[0][1]} for {label(signature[first], first)} and {length} for "
                    f"{label(signature[i], i)}"
                )
    if batch is not None and n_scattered == 0:
        raise ValueError("batch selects rows of scattered inputs, but this function has none")
    if lengths:
        length = lengths[0][1]
    elif buffers:
        length = min(n for _, n in buffers)
    else:
        length = 0
    if not n_scattered:
        selection = None
    elif batch is None:
        selection = Batch(0, length)
    elif not lengths and isinstance(batch, (list, tuple, np.ndarray)):
        # only minibatch buffers, which are never indexed: the indices only count rows
        selection = Batch(0, normalize_batch(batch, np.iinfo(np.int64).max).length)
    else:
        selection = normalize_batch(batch, length)
    total = selection.length if selection is not None else 0
    for i, rows in buffers:
        if rows < total:
            raise ValueError(
                f"{label(signature[i], i)} is a minibatch Data of {rows} rows, fewer than "
                f"the {total} rows the call selects (it supplies its first {total} rows)"
            )
    return Checked(checked, tuple(casts), length, selection, total,
                   tuple(minibatch) if buffers else None)


def check_batch_s(variables: list, batch_s: Any, parts: int) -> tuple | None:
    """The form of ``batch_s`` (one raw selection per process); each rank checks its
    own selection against its own rows inside the call (``_shard``)."""
    if batch_s is None:
        return None
    if not variables:
        raise ValueError("batch_s selects rows of sliceable_shareds, but this function has none")
    return split_batch_s(batch_s, parts)


def check_subset(output_subset: Any, n_outputs: int) -> tuple[int, ...] | None:
    if output_subset is None:
        return None
    if not isinstance(output_subset, (list, tuple)):
        raise TypeError(f"output_subset must be a list of output indices; got {output_subset!r}")
    subset = []
    for i in output_subset:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"output_subset must hold integers; got {i!r}")
        if not 0 <= i < n_outputs:
            raise ValueError(
                f"output_subset index {i} is out of range for {n_outputs} outputs"
            )
        subset.append(int(i))
    if len(set(subset)) != len(subset):
        raise ValueError(f"output_subset has repeated indices: {subset}")
    return tuple(subset)


def check_num_slices(num_slices: Any) -> int:
    if isinstance(num_slices, bool) or not isinstance(num_slices, (int, np.integer)):
        raise TypeError(f"num_slices must be an integer >= 1; got {num_slices!r}")
    if num_slices < 1:
        raise ValueError(f"num_slices must be an integer >= 1; got {num_slices}")
    return int(num_slices)


