"""Index math for scattering rows across processes and selecting batches.

This module owns the one splitting rule used everywhere in synkhronos: ``L`` rows
over ``n`` parts are cut into contiguous blocks, in order, as even as possible, and
the first ``L % n`` parts get one extra row (parts may hold zero rows when
``L < n``); and its weighted form, asked for by ``shares`` (each part's rows in
proportion to its share, still contiguous and in order: ``weighted_counts``). It also
owns the validation of the user's ``batch``, ``batch_s`` and ``shares`` arguments,
turning the first two into :class:`Batch` objects: either a contiguous row range or a
read-only array of non-negative row indices.

Pure Python and numpy; nothing here touches processes or shared memory.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Batch",
    "block",
    "normalize_batch",
    "normalize_batch_s",
    "normalize_shares",
    "offsets",
    "split_batch_s",
    "select_batch_s",
    "part_bounds",
    "select_rows",
    "split_bounds",
    "split_counts",
    "weighted_counts",
]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_int(value: Any, name: str, minimum: int) -> int:
    """Return ``value`` as an int >= ``minimum``, or raise TypeError / ValueError."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an integer >= {minimum}; got {type(value).__name__}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value}")
    return value


def split_counts(length: int, parts: int) -> list[int]:
    """Row count of each part when ``length`` rows (>= 0) go over ``parts`` (>= 1).

    The counts sum to ``length``; the first ``length % parts`` are one larger.
    """
    length = _check_int(length, "length", 0)
    parts = _check_int(parts, "parts", 1)
    base, extra = divmod(length, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def normalize_shares(shares: Any, parts: int) -> tuple[float, ...] | None:
    """Validate ``shares``: None, or one finite positive number per part.

    Parameters
    ----------
    shares : None or sequence of real
        Each part's relative share of the rows (a measured speed, rows per second,
        or explicit row counts); only the proportions matter.
    parts : int
        Number of parts (processes), >= 1.

    Returns
    -------
    tuple of float or None
        The shares as floats; None stays None (the even split).

    Raises
    ------
    TypeError
        If ``shares`` is not a 1-d sequence of real numbers.
    ValueError
        If it holds other than ``parts`` numbers, or one is not finite and positive.
    """
    parts = _check_int(parts, "parts", 1)
    if shares is None:
        return None
    if isinstance(shares, (str, bytes)) or not hasattr(shares, "__len__"):
        raise TypeError(f"shares must be a sequence of {parts} positive numbers, one per "
                        f"process; got {type(shares).__name__}")
    values = np.asarray(shares)
    if values.ndim != 1 or values.dtype.kind not in "iuf":
        raise TypeError(f"shares must be a 1-d sequence of real numbers, one per process; "
                        f"got {values.dtype} of shape {values.shape}")
    if len(values) != parts:
        raise ValueError(f"shares has {len(values)} numbers but there are {parts} processes")
    values = values.astype(np.float64)
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(f"shares must be finite and positive; got {float(values[first])!r} for "
                         f"process {first}")
    return tuple(float(v) for v in values)


def weighted_counts(length: int, shares: tuple[float, ...]) -> list[int]:
    """Row count of each process when ``shares`` split ``length`` rows.

    Largest remainders: each process gets the floor of its exact part, ``length *
    share / sum(shares)``, and the rows left over go one each to the largest
    fractions (the lower rank first on a tie, so equal shares give the even split).
    With at least as many rows as processes, each gets at least one row (taken from
    the largest). Row counts given as shares come back unchanged.

    Parameters
    ----------
    length : int
        Number of rows, >= 0.
    shares : sequence of float
        One positive share per process, in rank order.

    Returns
    -------
    list of int
        The rows of each process, in rank order; they sum to ``length``. Process
        ``r`` takes the contiguous block after the rows of ranks ``0 .. r-1``.
    """
    length = _check_int(length, "length", 0)
    parts = len(shares)
    total = math.fsum(shares)
    exact = [length * share / total for share in shares]
    counts = [min(length, int(math.floor(value))) for value in exact]
    left = length - sum(counts)
    if left > 0:
        order = sorted(range(parts), key=lambda i: (counts[i] - exact[i], i))
        for i in order[:left]:
            counts[i] += 1
    elif left < 0:  # rounding of huge lengths: take back from the largest
        for _ in range(-left):
            counts[counts.index(max(counts))] -= 1
    if length >= parts:
        for i in range(parts):
            if counts[i] == 0:
                counts[counts.index(max(counts))] -= 1
                counts[i] = 1
    return counts


def offsets(counts: list[int]) -> tuple[int, ...]:
    """The first row of each part, then the end: ``parts + 1`` cumulative offsets."""
    return (0, *itertools.accumulate(counts))


def split_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each part; the parts tile ``[0, length)`` in order."""
    bounds = []
    start = 0
    for count in split_counts(length, parts):
        bounds.append((start, start + count))
        start += count
    return bounds


def part_bounds(length: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, stop)`` of part ``index`` alone, in O(1).

    Parameters
    ----------
    length : int
        Number of rows, >= 0.
    parts : int
        Number of parts, >= 1.
    index : int
        Which part, ``0 <= index < parts``.

    Returns
    -------
    tuple of int
        ``split_bounds(length, parts)[index]``, computed without the list.
    """
    length = _check_int(length, "length", 0)
    parts = _check_int(parts, "parts", 1)
    index = _check_int(index, "index", 0)
    if index >= parts:
        raise ValueError(f"index must be in 0..{parts - 1} for {parts} parts; got {index}")
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def block(length: int, parts: int, index: int) -> tuple[int, int]:
    """``part_bounds`` without validation, for per-rank code that trusts its input."""
    base, extra = divmod(length, parts)
    start = index * base + (index if index < extra else extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass(frozen=True, eq=False)
class Batch:
    """A normalized row selection: a range ``[start, stop)`` or an index array.

    When ``indices`` is None the selection is the contiguous range; otherwise it is
    ``indices`` (1-d, C-contiguous, read-only ``np.int64``, all non-negative) and
    ``start`` / ``stop`` are unused (0).
    """

    start: int = 0
    stop: int = 0
    indices: np.ndarray | None = None

    @property
    def is_range(self) -> bool:
        """True when the selection is a contiguous range."""
        return self.indices is None

    @property
    def length(self) -> int:
        """Number of selected rows."""
        if self.indices is None:
            return self.stop - self.start
        return int(self.indices.shape[0])

    def part(self, parts: int, index: int) -> Batch:
        """Part ``index`` of ``parts`` of this selection, by the even splitting rule.

        Parameters
        ----------
        parts : int
            Number of parts, >= 1.
        index : int
            Which part, ``0 <= index < parts``.

        Returns
        -------
        Batch
            A sub-range, or a view of a contiguous block of ``indices`` (no copy).
        """
        lo, hi = part_bounds(self.length, parts, index)
        if self.indices is None:
            return Batch(self.start + lo, self.start + hi)
        return Batch(indices=self.indices[lo:hi])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        if self.indices is None or other.indices is None:
            same_range = (self.start, self.stop) == (other.start, other.stop)
            return self.indices is other.indices and same_range
        return bool(np.array_equal(self.indices, other.indices))


def select_rows(array: np.ndarray, batch: Batch | None) -> np.ndarray:
    """The rows of ``array`` that ``batch`` selects: all if None, a view for a range."""
    if batch is None:
        return array
    if batch.indices is None:
        return array[batch.start : batch.stop]
    return array[batch.indices]


def _range_text(length: int) -> str:
    return f"valid: {-length}..{length - 1}" if length else "no rows to index"


def _check_slice(batch: slice, what: str) -> slice:
    """A slice whose step is None or 1 and whose ends are ints or None."""
    step = batch.step
    if step is not None and not (_is_int(step) and step == 1):
        raise ValueError(f"{what} slice step must be None or 1 (only step 1 is "
                         f"supported); got {step!r}")
    for end in (batch.start, batch.stop):
        if end is not None and not _is_int(end):
            raise TypeError(f"{what} slice start and stop must be integers or None; "
                            f"got {type(end).__name__}")
    return batch


def _normalize(batch: Any, length: int, what: str) -> Batch:
    """Body of :func:`normalize_batch`; ``what`` starts every error message."""
    if batch is None:
        return Batch(0, length)
    if _is_int(batch):
        count = int(batch)
        if not 0 <= count <= length:
            raise ValueError(f"{what} row count {count} is out of range for {length} rows "
                             f"(valid: 0..{length})")
        return Batch(0, count)
    if isinstance(batch, slice):
        batch = _check_slice(batch, what)
        start, stop, _ = slice(batch.start, batch.stop).indices(length)
        return Batch(start, max(start, stop))
    if isinstance(batch, (list, tuple, np.ndarray)):
        return Batch(indices=_in_range(_index_array(batch, what), length, what))
    raise TypeError(f"{what} must be None, an int, a slice or a 1-d sequence of integer "
                    f"indices; got {type(batch).__name__}")


def _index_array(batch: list | tuple | np.ndarray, what: str) -> np.ndarray:
    """The indices as a 1-d integer array (not yet checked against a length)."""
    if isinstance(batch, np.ndarray) and batch.ndim == 1 and batch.dtype.kind in "iu":
        return batch
    if isinstance(batch, (list, tuple)) and len(batch) == 0:
        return np.empty(0, dtype=np.int64)
    try:
        arr = np.asarray(batch)
    except ValueError:
        raise ValueError(f"{what} index list must be 1-d; got a ragged nested "
                         f"sequence") from None
    if arr.ndim != 1:
        raise ValueError(f"{what} index array must be 1-d; got {arr.ndim}-d with shape "
                         f"{arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} index array must hold integers; got dtype {arr.dtype}")
    return arr


def _in_range(arr: np.ndarray, length: int, what: str) -> np.ndarray:
    """``arr`` checked against ``length`` rows, as non-negative read-only int64 (a copy)."""
    if arr.size:
        bad = arr >= length if arr.dtype.kind == "u" else (arr < -length) | (arr >= length)
        if bad.any():
            first = int(arr[np.argmax(bad)])
            raise ValueError(f"{what} index {first} is out of range for {length} rows "
                             f"({_range_text(length)})")
    idx = np.array(arr, dtype=np.int64, order="C", copy=True)
    np.add(idx, length, out=idx, where=idx < 0)
    idx.flags.writeable = False
    return idx


def normalize_batch(batch: Any, length: int) -> Batch:
    """Validate the user's ``batch`` argument against ``length`` rows.

    Parameters
    ----------
    batch : None, int, slice, or 1-d sequence of int
        None selects all rows; an int ``n`` the first ``n`` rows; a slice (step None
        or 1) a range, with Python's clipping and negative-end rules; a 1-d list,
        tuple or integer array explicit row indices (negative ones count from the end).
    length : int
        Number of rows in the data, >= 0.

    Returns
    -------
    Batch
        The selection; index arrays are copied, made non-negative and read-only.

    Raises
    ------
    TypeError
        For an unsupported type, non-integer slice ends, or non-integer indices.
    ValueError
        For a count or index out of range, a slice step other than 1, or ndim != 1.
    """
    length = _check_int(length, "length", 0)
    return _normalize(batch, length, "batch")


def split_batch_s(batch_s: Any, parts: int) -> tuple | None:
    """Check the form of ``batch_s`` and give one raw selection per process.

    The master's half of :func:`normalize_batch_s`: everything that does not need the
    processes' row counts. Each item is None (all rows), a slice, or a read-only 1-d
    ``int64`` array (not yet checked against any length); a selection shared by every
    process is the same object in every entry (it pickles once).

    Raises
    ------
    TypeError
        For an unsupported type, integers mixed with per-process selections, or
        indices that are not integers.
    ValueError
        For a wrong number of selections, an index array that is not 1-d, or a
        slice step other than 1.
    """
    parts = _check_int(parts, "parts", 1)
    if batch_s is None:
        return None
    shared: list[Any]
    if isinstance(batch_s, (slice, np.ndarray)):
        shared = [batch_s] * parts
    elif isinstance(batch_s, (list, tuple)):
        int_items = [_is_int(item) or isinstance(item, (bool, np.bool_)) for item in batch_s]
        if all(int_items):
            shared = [batch_s] * parts
        elif any(int_items):
            raise TypeError("batch_s must be either a flat list of integer indices or a "
                            "list of per-process selections; got a mix of both")
        elif len(batch_s) != parts:
            raise ValueError(f"batch_s has {len(batch_s)} selections but there are "
                             f"{parts} processes")
        else:
            shared = list(batch_s)
    else:
        raise TypeError("batch_s must be None, a slice, a 1-d index list or a list of "
                        f"per-process selections; got {type(batch_s).__name__}")
    raw: list[Any] = []
    done: dict[int, Any] = {}  # id(item) -> its raw form: a shared item is made once
    for rank, item in enumerate(shared):
        key = id(item)
        if key in done:
            raw.append(done[key])
            continue
        what = f"batch_s for rank {rank}:"
        form: Any
        if item is None:
            form = None
        elif isinstance(item, slice):
            form = _check_slice(item, what)
        elif isinstance(item, (list, tuple, np.ndarray)):
            form = _index_array(item, what)
        else:
            raise TypeError(f"{what} expected a slice, a 1-d index list or None; "
                            f"got {type(item).__name__}")
        done[key] = form
        raw.append(form)
    return tuple(raw)


def select_batch_s(raw: Any, length: int, rank: int) -> Batch | None:
    """The rank's half: its raw selection (from :func:`split_batch_s`) checked against
    its own ``length`` rows. Raises ValueError for a count or index out of range."""
    if raw is None:
        return None
    return _normalize(raw, length, f"batch_s for rank {rank}:")


def normalize_batch_s(batch_s: Any, parts: int, lengths: list[int]) -> list[Batch | None]:
    """Validate ``batch_s``, a selection of rows of each process's scattered data.

    Parameters
    ----------
    batch_s : None, slice, 1-d sequence of int, or sequence of selections
        None uses all rows everywhere. One slice or one flat 1-d index list/array is
        applied to every process. A list or tuple whose items are slices, 1-d index
        lists/arrays or None (all rows) gives one selection per process.
    parts : int
        Number of processes, >= 1.
    lengths : list of int
        ``lengths[i]`` is the number of rows process ``i`` holds.

    Returns
    -------
    list of Batch or None
        One entry per process; None means all of its rows.

    Raises
    ------
    TypeError
        For an unsupported type, or integers mixed with per-process selections.
    ValueError
        For a wrong number of selections or a selection invalid for some rank.
    """
    parts = _check_int(parts, "parts", 1)
    if len(lengths) != parts:
        raise ValueError(f"lengths must have one entry per process ({parts}); "
                         f"got {len(lengths)}")
    lengths = [_check_int(n, f"lengths[{i}]", 0) for i, n in enumerate(lengths)]
    raw = split_batch_s(batch_s, parts)
    if raw is None:
        return [None] * parts
    return [select_batch_s(item, length, rank)
            for rank, (item, length) in enumerate(zip(raw, lengths, strict=True))]
