"""Data and data(): numpy arrays in POSIX shared memory that every process maps.

This module owns the inputs that travel to functions without being copied: a ``Data``
is a numpy array whose memory is one shared-memory segment, created by the master and
mapped by every process that uses it. Only the master creates, resizes and frees
segments; workers only map them, by name, when a command first needs them.

How data moves::

    master                                   every process (master included)
    ------                                   -------------------------------
    1. synk.data(value): the arena creates a
       segment, the master maps it and
       copies value in; x.data views it
    2. a command sends x.ref() -- a DataRef
       (segment, dtype, shape), a few bytes  3. ref.view(ctx): the process's arena
                                                maps the segment by name once and views
                                                it as an array, no copy
    4. growth past alloc_size: a new segment,
       leading values copied over, the old
       one released (unlinked and logged)    5. before the next command, workers drop
                                                their mapping of the old segment; the
                                                next ref names the new one

A name is never resized: each allocation gets a fresh name, so a name always maps one
fixed size, and a worker holding a mapping can never read past its end. Shrinking, or
growing within ``alloc_size``, only changes the shape that the next ref carries.

An allocation is released by ``free_memory()``, by reallocation, when the ``Data`` is
garbage-collected in the master (a ``weakref.finalize`` that unlinks the name and asks
workers to drop it), and by ``synk.close()``, which sweeps every segment of the
program. A ``Data`` of zero items has no segment at all (POSIX cannot map zero bytes,
and there is nothing to share).

Over several machines (``mpiexec``) every machine holds a replica of each ``Data``,
under the master's segment id in its own prefix (``_runtime/arena.py``): allocation,
the copy that carries values over to a new allocation, and release travel in the
arena's journal with the next message; the values the library writes (``set_value``,
``x[i] = v``, and ``sync()`` after writes through ``x.data``) travel at once, to the
other machines' leaders alone, through the session's transport (``Session.replicate``;
the messages and their handlers live beside the several-machines transport,
``_machines/transport.py``: the bytes, broadcast between leaders straight into each
replica, or the assignment, replayed). On one machine there is no other copy
(``Session.replica_groups`` is None) and nothing is sent. A machine's
workers read its replica, and a ``DataRef`` naming the master's segment finds it there.

Pickling a ``Data`` gives a small handle (segment name, dtype, shape, allocation);
another process on the machine -- a worker, or a program started with the "spawn"
method and no session -- unpickles it into a non-owner ``Data`` that maps the same
memory, read and write. The creating program stays the owner: a non-owner never
unlinks, and cannot resize or free.
"""

from __future__ import annotations

import mmap
import numbers
import operator
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from ._core import context
from ._core.session import Session, State, require
from ._dataref import DataRef, allocate, mapping, publish
from ._runtime import epoch, shmem
from ._runtime.arena import Segment

__all__ = ["Data", "DataRef", "data", "data_for"]


_KINDS = "biufc"  # bool, signed, unsigned, float, complex: what PyTensor computes on


def _check_oversize(oversize: Any) -> float:
    if isinstance(oversize, bool) or not isinstance(oversize, numbers.Real):
        raise TypeError(f"oversize must be a number in [1, 2]; got {oversize!r}")
    value = float(oversize)
    if not 1 <= value <= 2:
        raise ValueError(f"oversize must be in [1, 2]; got {oversize!r}")
    return value


def _alloc_items(size: int, oversize: float) -> int:
    """Items to allocate for ``size`` visible items, with room to grow by ``oversize``."""
    return max(size, int(size * oversize))


def _check_shape(shape: Any, ndim: int, label: str) -> tuple[int, ...]:
    try:
        items = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
        dims = tuple(operator.index(d) for d in items)
    except TypeError:
        raise TypeError(f"a shape must be a tuple of integers; got {shape!r}") from None
    if len(dims) != ndim:
        raise ValueError(f"{label} has ndim {ndim}; got shape {dims} with {len(dims)} dimensions")
    if any(d < 0 for d in dims):
        raise ValueError(f"a shape cannot have negative dimensions; got {dims}")
    return dims


def _check_dtype(dtype: Any) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind not in _KINDS or dtype.fields is not None:
        raise TypeError(
            f"synk.data() holds numeric arrays (bool, integer, float or complex); got dtype {dtype}"
        )
    return dtype


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


class Data:
    """A numpy array in POSIX shared memory, mapped without copies by every process.

    Made by :func:`synk.data <data>` in the master; see there for the parameters.
    dtype and ndim are fixed for the life of the object; shape and memory may change.

    Attributes
    ----------
    data : numpy.ndarray
        A view of the visible items. Read it again after a call that may reallocate
        (``set_value``, ``set_shape``, ``set_length``, ``free_memory``): an older view
        keeps the old memory alive in this process only.
    dtype : numpy.dtype
    ndim : int
    shape : tuple of int
    size : int
        Number of visible items.
    alloc_size : int
        Number of items allocated (``>= size``); 0 when no memory is held.
    name : str or None
    minibatch : bool
        True marks a minibatch buffer: with ``batch``, a function call takes its first
        ``len(batch)`` rows instead of indexing it (the original Synkhronos' meaning).

    Notes
    -----
    ``len(x)``, ``x[i]``, ``x[i] = v`` and ``np.asarray(x)`` act on ``x.data``.

    Pickling gives a handle to the same memory (see the module docstring). The handle
    keeps the allocation it was pickled with: after the owner reallocates or frees, it
    no longer sees the owner's values; pickle the owner again. A handle may write, and
    ``set_value`` a value of its own shape, but not resize or free (``RuntimeError``).

    After ``synk.close()`` the values stay readable and writable in this process only;
    anything that would allocate raises ``RuntimeError``.
    """

    def __init__(
        self,
        value: Any = None,
        var: Any = None,
        dtype: Any = None,
        ndim: int | None = None,
        shape: Iterable[int] | int | None = None,
        minibatch: bool = False,
        force_cast: bool = False,
        oversize: float = 1,
        name: str | None = None,
    ):
        session = require("synk.data()")
        session.check_usable()  # the master process only, and an open session
        if name is None and var is not None:
            name = getattr(var, "name", None)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string or None; got {name!r}")
        oversize = _check_oversize(oversize)
        array = None if value is None else np.asarray(value)
        target, dims = _resolve_type(array, var, dtype, ndim, shape)
        self._dtype = target
        self._ndim = dims
        self._name = name
        self._minibatch = bool(minibatch)
        self._session: Session | None = session
        self._segment = ""
        self._owned: Segment | None = None  # the segment this owner allocated
        self._map: mmap.mmap | None = None
        self._alloc_size = 0
        self._finalizer: weakref.finalize | None = None
        self._shape: tuple[int, ...] = (0,) * dims
        self._view = np.zeros(self._shape, target)  # 0-d: replaced below, before use
        if array is not None:
            if shape is not None:
                expected = _check_shape(shape, dims, self._label)
                if array.shape != expected:
                    raise ValueError(
                        f"synk.data() got shape {expected} and a value of shape {array.shape}"
                    )
            self._write(array, not hasattr(value, "dtype"), force_cast, oversize)
        elif shape is not None or dims == 0:
            self._resize(_check_shape(() if shape is None else shape, dims, self._label), oversize)

    # -- attributes -----------------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        return self._view

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return self._ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def size(self) -> int:
        return self._view.size

    @property
    def alloc_size(self) -> int:
        return self._alloc_size

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def minibatch(self) -> bool:
        return self._minibatch

    @property
    def is_owner(self) -> bool:
        """True in the program that created this Data; False for an unpickled handle."""
        return self._session is not None

    @property
    def _label(self) -> str:
        return f"Data {self._name!r}" if self._name else "Data"

    # -- numpy behaviour ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._view)

    def __getitem__(self, key: Any) -> Any:
        return self._view[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._view[key] = value
        session = self._session
        if session is not None and session.replica_groups and session.usable():
            self._replicate_item(session, key, value)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy:
            return np.array(self._view, dtype=dtype, copy=True)
        if dtype is None or np.dtype(dtype) == self._dtype:
            return self._view
        if copy is False:
            raise ValueError(f"{self._label} holds {self._dtype}; casting to {dtype} copies")
        return self._view.astype(dtype)

    def __repr__(self) -> str:
        return (
            f"Data(name={self._name!r}, dtype={self._dtype}, shape={self._shape}, "
            f"alloc_size={self._alloc_size})"
        )

    # -- the function layer's handle ---------------------------------------------------------
    def ref(self) -> DataRef:
        """The picklable descriptor a command carries: ``(segment, dtype, shape)``.

        Any process views the data with ``ref.view(ctx)``, without copies. A ref
        stays valid until the next reallocation or ``free_memory()``.

        Raises
        ------
        RuntimeError
            The session that owns this Data was closed.
        """
        if self.is_owner:
            self._check_session("ref()")
        return DataRef(self._segment, self._dtype.str, self._shape)

    def holds(self, ref: DataRef) -> bool:
        """Whether ``ref`` still describes this Data's memory (same segment and shape).

        The function layer's check that a call prepared earlier still reads here.
        """
        return self._segment == ref.segment and self._shape == ref.shape

    def memory_key(self) -> tuple:
        """``(segment, shape, dtype)``: equal keys, the same memory viewed the same way
        (a reallocation renames the segment)."""
        return (self._segment, self._shape, self._dtype)

    def sync(self) -> None:
        """Copy the visible values to every machine's replica (several machines only).

        The library's own writes (``set_value``, ``x[i] = v``) reach every machine at
        once; call this after writing through the ``data`` view directly (``x.data[...]
        = ...``, ``np.copyto(x.data, ...)``), before a call uses the values. On one
        machine it does nothing.

        Raises
        ------
        RuntimeError
            The owner's session was closed.
        """
        session = self._session
        if session is not None and session.replica_groups:
            self._check_session("sync()")
            self._replicate_values(session)

    def _replicate_values(self, session: Session) -> None:
        """The visible values to the other machines' replicas, as bytes."""
        if self._map is not None:
            publish(session, self._segment, self._map, self._view)

    def _replicate_item(self, session: Session, key: Any, value: Any) -> None:
        """Replay ``x[key] = value`` on the other machines' replicas."""
        if self._map is None:
            return
        view, segment, sent = self._view, self._segment, [True]

        def publish(transport: Any) -> None:
            sent[0] = transport.publish_item(segment, view, key, value)

        session.replicate(publish)
        if not sent[0]:  # a key that does not travel: send the values instead
            self._replicate_values(session)

    # -- writing and resizing ----------------------------------------------------------------
    def set_value(self, value: Any, force_cast: bool = False, oversize: float = 1) -> None:
        """Write ``value``, taking its shape; reallocate only if it does not fit.

        Parameters
        ----------
        value
            An array or array-like with this Data's ndim. An array (anything with a
            ``dtype``) must have this Data's dtype or one that casts to it safely
            (uint8 into int32, float32 into float64), as function calls accept; a list
            or Python scalar is accepted when numpy can cast it within its kind (ints
            to floats, for example).
        force_cast
            Cast a value of another dtype (numpy's unsafe casting).
        oversize
            In [1, 2]: on reallocation, allocate ``oversize`` times the value's size,
            so later growth up to that size needs no new memory.

        Raises
        ------
        TypeError
            The value's dtype does not cast safely and ``force_cast`` is False.
        ValueError
            The value's ndim differs, or ``oversize`` is outside [1, 2].
        RuntimeError
            The Data is an unpickled handle and the value's shape differs from its shape
            (only the owner may resize), or the owner's session is closed and the value
            does not fit.

        A rejected call changes nothing.
        """
        oversize = _check_oversize(oversize)
        array = np.asarray(value)
        self._write(array, not hasattr(value, "dtype"), force_cast, oversize)

    def set_shape(self, shape: Iterable[int] | int, oversize: float = 1) -> None:
        """Change the visible shape, within or beyond the allocation.

        The leading items (in C order) keep their values: growing within ``alloc_size``
        reveals items whose values are unspecified; growing beyond it reallocates
        (``oversize`` as in ``set_value``), and the new items are zero.

        Raises
        ------
        TypeError, ValueError
            ``shape`` is not ``ndim`` non-negative integers, or ``oversize`` is outside
            [1, 2].
        RuntimeError
            The Data is an unpickled handle (only the owner may resize), or the owner's
            session is closed and the shape does not fit.
        """
        oversize = _check_oversize(oversize)
        self._check_owner("set_shape()")
        self._resize(_check_shape(shape, self._ndim, self._label), oversize)

    def set_length(self, length: int, oversize: float = 1) -> None:
        """Change the length of axis 0, keeping the other dimensions; see ``set_shape``."""
        if self._ndim == 0:
            raise ValueError(f"{self._label} is 0-dimensional and has no length to set")
        self.set_shape((length,) + self._shape[1:], oversize)

    def free_memory(self) -> None:
        """Release the allocation in every process; the length becomes 0.

        The shape becomes ``(0, *shape[1:])``. The object stays usable: the next
        ``set_value``, ``set_shape`` or ``set_length`` allocates again. Workers drop their
        mapping with the next command.

        Raises
        ------
        ValueError
            The Data is 0-dimensional: it always holds its one item.
        RuntimeError
            The Data is an unpickled handle: only its owner may free it.
        """
        self._check_owner("free_memory()")
        if self._ndim == 0:
            raise ValueError(
                f"{self._label} is 0-dimensional and always holds one item; there is no "
                "memory to free"
            )
        self._release()
        self._show((0,) + self._shape[1:])

    # -- internals ---------------------------------------------------------------------------
    def _write(self, array: np.ndarray, implicit: bool, force_cast: bool, oversize: float):
        """Validate ``array`` against dtype and ndim, make room, and copy it in."""
        if array.dtype != self._dtype and not force_cast:
            # A safe cast (uint8 -> int32, float32 -> float64) loses nothing: taken as a
            # call takes it. A list or scalar may also cast within its kind.
            if not (np.can_cast(array.dtype, self._dtype, "safe") or (
                implicit and np.can_cast(array.dtype, self._dtype, "same_kind")
            )):
                raise TypeError(
                    f"{self._label} holds {self._dtype}; got a value of dtype {array.dtype}, "
                    "which does not cast to it safely (pass force_cast=True to cast it)"
                )
        if array.ndim != self._ndim:
            raise ValueError(
                f"{self._label} has ndim {self._ndim}; got a value of shape {array.shape} "
                f"with ndim {array.ndim}"
            )
        if not self.is_owner and array.shape != self._shape:
            raise RuntimeError(
                f"{self._label} was unpickled from another process, which owns its memory: "
                f"it can take values of its shape {self._shape} only, not {array.shape}"
            )
        size = array.size
        if size > self._alloc_size:
            self._reallocate(_alloc_items(size, oversize), keep=0)
            self._show(array.shape)
        elif array.shape != self._shape:
            self._show(array.shape)
        np.copyto(self._view, array, casting="unsafe")
        session = self._session
        if session is not None and session.replica_groups and session.usable():
            self._replicate_values(session)

    def _resize(self, shape: tuple[int, ...], oversize: float) -> None:
        size = _size(shape)
        if size > self._alloc_size:
            kept = min(self.size, size) if self._map is not None else 0
            self._reallocate(_alloc_items(size, oversize), keep=kept)
        self._show(shape)

    def _show(self, shape: tuple[int, ...]) -> None:
        """Make ``shape`` the visible shape (it fits in the allocation)."""
        if self._map is None:
            self._view = np.empty(shape, self._dtype)
        else:
            self._view = shmem.array_view(self._map, self._dtype, shape)
        self._shape = shape
        epoch.advance()  # what was kept for replay may name the old memory or shape

    def _reallocate(self, items: int, keep: int) -> None:
        """Move to a new segment of ``items`` items, carrying over ``keep`` leading items."""
        session = self._check_session("growing the allocation")
        segment, finalizer = allocate(self, session, items * self._dtype.itemsize)
        if keep:
            assert self._owned is not None
            session.ctx.arena.copy(self._owned, segment, keep * self._dtype.itemsize)
        self._release()
        self._segment, self._map, self._alloc_size = segment.name, segment.buffer, items
        self._owned, self._finalizer = segment, finalizer

    def _release(self) -> None:
        """Drop the current allocation here and, with the next command, in the workers."""
        if self._finalizer is not None:
            self._finalizer()
        self._segment, self._map, self._alloc_size, self._finalizer = "", None, 0, None
        self._owned = None

    def _check_owner(self, what: str) -> None:
        if not self.is_owner:
            raise RuntimeError(
                f"{what} is not allowed on {self._label}: it was unpickled from another "
                "process, which owns its memory; resize or free it there"
            )

    def _check_session(self, what: str) -> Session:
        session = self._session
        if session is None:
            raise RuntimeError(
                f"{what} is not allowed on {self._label}: it was unpickled from another "
                "process, which owns its memory"
            )
        if session.state is State.CLOSED:
            raise RuntimeError(
                f"{what} is not possible: the session of {self._label} was closed by "
                "synk.close(); make a new synk.data() after synk.fork()"
            )
        return session

    # -- pickling ----------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        handle = (
            self._segment,
            self._dtype.str,
            self._shape,
            self._alloc_size,
            self._name,
            self._minibatch,
        )
        return (_attach, handle)


def _attach(
    segment: str,
    dtype: str,
    shape: tuple[int, ...],
    alloc_size: int,
    name: str | None,
    minibatch: bool,
) -> Data:
    """Unpickle a ``Data`` handle: a non-owner mapping the owner's segment by name."""
    self = Data.__new__(Data)
    self._dtype = np.dtype(dtype)
    self._ndim = len(shape)
    self._name = name
    self._minibatch = minibatch
    self._session = None
    self._segment = segment
    self._owned = None
    self._map = mapping(segment, context.current()) if segment else None
    self._alloc_size = alloc_size
    self._finalizer = None
    if self._map is not None and len(self._map) < alloc_size * self._dtype.itemsize:
        raise ValueError(
            f"segment {segment!r} holds {len(self._map)} bytes; the pickled {self._label} "
            f"needs {alloc_size * self._dtype.itemsize}"
        )
    self._show(tuple(shape))
    return self


def _resolve_type(
    array: np.ndarray | None, var: Any, dtype: Any, ndim: Any, shape: Any
) -> tuple[np.dtype, int]:
    """The dtype and ndim a new Data takes from its sources, which must agree."""
    target = None if dtype is None else _check_dtype(dtype)
    if var is not None:
        from_var = _check_dtype(var.dtype)
        if target is not None and from_var != target:
            raise TypeError(f"synk.data() got dtype {target} and a var of dtype {from_var}")
        target = from_var
    if target is None and array is not None:
        target = _check_dtype(array.dtype)
    if target is None:
        raise TypeError("synk.data() needs a dtype: pass value, var, or dtype; got none")
    sources: list[tuple[str, int]] = []
    if ndim is not None:
        if isinstance(ndim, bool) or not isinstance(ndim, numbers.Integral):
            raise TypeError(f"ndim must be an integer >= 0; got {ndim!r}")
        if ndim < 0:
            raise ValueError(f"ndim must be an integer >= 0; got {ndim}")
        sources.append(("ndim", int(ndim)))
    if var is not None:
        sources.append(("var", int(var.ndim)))
    if shape is not None:
        sources.append(("shape", 1 if isinstance(shape, numbers.Integral) else len(shape)))
    if array is not None:
        sources.append(("value", array.ndim))
    if not sources:
        raise TypeError("synk.data() needs an ndim: pass value, var, ndim or shape; got none")
    first, dims = sources[0]
    for source, other in sources[1:]:
        if other != dims:
            raise ValueError(f"synk.data() got ndim {dims} from {first} but {other} from {source}")
    return target, dims


def data(
    value: Any = None,
    var: Any = None,
    dtype: Any = None,
    ndim: int | None = None,
    shape: Iterable[int] | int | None = None,
    minibatch: bool = False,
    force_cast: bool = False,
    oversize: float = 1,
    name: str | None = None,
) -> Data:
    """A numpy array in POSIX shared memory that every process maps without copies.

    Master only; any time after ``synk.fork()``, before or after ``distribute()``. No
    worker is woken: workers map the memory when a command first uses it.

    Parameters
    ----------
    value
        Initial contents (copied in). Its dtype and ndim become the Data's unless
        ``var`` or ``dtype`` say otherwise.
    var
        A PyTensor variable whose ``dtype`` and ``ndim`` the Data takes (its ``name``
        too, when ``name`` is None).
    dtype, ndim
        Explicit type; every source given (``value``, ``var``, ``dtype``, ``ndim``,
        ``shape``) must agree.
    shape
        Without ``value``: allocate this shape, filled with zeros. With ``value``: the
        value must have this shape. Without either, the Data starts empty (all
        dimensions 0, no memory).
    minibatch
        Mark the Data as a minibatch buffer: a call with ``batch`` does not index it
        but takes its first ``len(batch)`` rows, in order (split across processes as
        the batch is). Use it for a minibatch prepared ahead of each call, beside whole
        data sets indexed by ``batch``.
    force_cast
        Cast a ``value`` whose dtype differs from ``var``'s or ``dtype``; a safe cast
        (uint8 into int32, float32 into float64) needs no flag.
    oversize
        In [1, 2]: allocate this many times the initial size, leaving room to grow.
    name
        A name for messages and ``repr``.

    Returns
    -------
    Data

    Raises
    ------
    RuntimeError
        ``synk.fork()`` was not called, or this is not the master.
    TypeError
        No dtype can be found, sources disagree on it, a value of another dtype without
        ``force_cast``, or a non-numeric dtype.
    ValueError
        Sources disagree on ndim or shape, or ``oversize`` is outside [1, 2].

    Examples
    --------
    >>> x = synk.data(np.zeros((1000, 10), dtype="float32"), oversize=1.5)
    >>> x.shape, x.alloc_size
    ((1000, 10), 15000)
    >>> x.set_length(1200)      # fits: no new memory, workers see it at their next use
    >>> x[-200:] = 1.0
    """
    return Data(value, var, dtype, ndim, shape, minibatch, force_cast, oversize, name)


def data_for(values: list, variables: list, force_cast: bool, oversize: float,
             minibatch: Any) -> tuple[Data, ...]:
    """A ``Data`` for each of a function's input ``variables`` holding its value
    (``Function.build_inputs``); ``minibatch``: one flag for all, or one per input."""
    if isinstance(minibatch, (list, tuple)):
        if len(minibatch) != len(values):
            raise ValueError(f"minibatch must be one flag or one flag per input "
                             f"({len(values)}); got {len(minibatch)} flags")
        flags = [bool(flag) for flag in minibatch]
    else:
        flags = [bool(minibatch)] * len(values)
    return tuple(
        data(value=v, var=var, force_cast=force_cast, oversize=oversize, minibatch=flag)
        for v, var, flag in zip(values, variables, flags, strict=True)
    )
