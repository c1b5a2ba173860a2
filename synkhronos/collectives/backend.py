"""The collectives' backend protocol, its registry, and the fused-buffer layout.

Who does what in one collective (``api.py`` -> a ``Backend`` -> every process)::

    api.py (master)        validate; resolve the shared variables into ``Targets``;
                           filter the user's values with each variable's type
    Backend (master side)  stage what the workers need, run ONE ``Opcode.COLLECTIVE``
                           command (after a small shape query where sizes must be
                           known first), read the result back
    Backend.execute        this rank's part of that command, in every process (the
                           master included); reached through the one handler below

A backend is chosen by the session's device (``"cpu"`` today: POSIX shared memory;
``"gpu"`` later: NCCL). Nothing above this module knows which one runs.

``FusedLayout`` is device-independent: where each variable of a list sits in one
fused buffer, and which contiguous piece of it each rank reduces, so that a list of
variables travels as one exchange, not one per variable.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._scatter import Batch, split_bounds
from ..session import Opcode, Session, register

__all__ = [
    "Backend",
    "Step",
    "Targets",
    "FusedLayout",
    "register_backend",
    "backend_for",
]

ALIGN = 64  # every variable of a fused buffer starts on its own cache line


class Step(enum.IntEnum):
    """Which collective a ``COLLECTIVE`` command runs (the first item of its payload)."""

    SHAPES = 0
    BROADCAST = 1
    SCATTER = 2
    GATHER = 3
    ALL_GATHER = 4
    REDUCE = 5
    ALL_REDUCE = 6
    SET_VALUE = 7
    GET_VALUE = 8


@dataclass(frozen=True, eq=False)
class Targets:
    """The shared variables of one collective, validated in the master."""

    variables: tuple[Any, ...]  # the master's SharedVariable objects
    uids: tuple[int, ...]  # the same variables' ids in every process
    labels: tuple[str, ...]  # how error messages name them
    dtypes: tuple[np.dtype, ...]
    ndims: tuple[int, ...]
    inexact: bool  # every dtype floating or complex (what op "avg" needs)
    by_name: bool = False  # some variable was given by name: resolved again every call


def _aligned(nbytes: int, alignment: int = ALIGN) -> int:
    return -(-nbytes // alignment) * alignment


class FusedLayout:
    """Where each array of a list sits in one fused buffer (offsets in bytes).

    Parameters
    ----------
    dtypes : sequence of dtype-like
        One per array.
    shapes : sequence of tuple of int
        One per array.
    """

    def __init__(self, dtypes: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> None:
        self.dtypes = tuple(np.dtype(d) for d in dtypes)
        self.shapes = tuple(tuple(int(s) for s in shape) for shape in shapes)
        self.sizes = tuple(int(np.prod(s, dtype=np.int64)) for s in self.shapes)
        self.nbytes = tuple(n * d.itemsize for n, d in zip(self.sizes, self.dtypes, strict=True))
        offsets, end = [], 0
        for nbytes in self.nbytes:
            offsets.append(end)
            end = _aligned(end + nbytes)
        self.offsets = tuple(offsets)
        self.total = end  # bytes the fused buffer needs
        self.data_bytes = sum(self.nbytes)

    def views(self, buffer: Any, base: int = 0) -> list[np.ndarray]:
        """Writable numpy views of every array in ``buffer``, the layout at ``base``."""
        return [
            np.frombuffer(buffer, dtype=dtype, count=size, offset=base + offset).reshape(shape)
            for dtype, size, offset, shape in zip(
                self.dtypes, self.sizes, self.offsets, self.shapes, strict=True
            )
        ]

    def pieces(self, parts: int) -> list[list[tuple[int, int, int]]]:
        """Split the data into ``parts`` contiguous pieces of about equal bytes.

        Returns, per part, ``(array index, first element, stop element)`` triples.
        The pieces of all parts tile every array exactly once; cuts fall on
        cache-line multiples of the concatenated data, so at most ``parts - 1``
        arrays are cut and no two parts write the same cache line of an array
        larger than a line.
        """
        lines = -(-self.data_bytes // ALIGN)
        cuts = [(min(lo * ALIGN, self.data_bytes), min(hi * ALIGN, self.data_bytes))
                for lo, hi in split_bounds(lines, parts)]
        result: list[list[tuple[int, int, int]]] = []
        for lo, hi in cuts:
            mine, start = [], 0
            for index, (nbytes, dtype, size) in enumerate(
                zip(self.nbytes, self.dtypes, self.sizes, strict=True)
            ):
                first = _element(lo - start, dtype.itemsize, size)
                stop = _element(hi - start, dtype.itemsize, size)
                if stop > first:
                    mine.append((index, first, stop))
                start += nbytes
            result.append(mine)
        return result


def _element(byte: int, itemsize: int, size: int) -> int:
    """The first element at or after ``byte`` of an array, clipped to ``[0, size]``."""
    return min(size, max(0, -(-byte // itemsize)))


class Backend(abc.ABC):
    """One device kind's collectives: master-side entry points and per-rank work.

    The master-side methods receive arguments ``api.py`` has already validated;
    they run exactly one ``Opcode.COLLECTIVE`` command (``shapes``) or at most one
    ``shapes`` query plus one command, so every process stays in step. ``execute``
    is this rank's part of a command and may trust its payload.
    """

    device: str = ""

    @abc.abstractmethod
    def shapes(self, session: Session, targets: Targets) -> list[list[tuple[int, ...]]]:
        """Every rank's shapes of ``targets``: ``result[rank][variable]``."""

    @abc.abstractmethod
    def broadcast(self, session: Session, targets: Targets, values: list | None) -> None:
        """The master's values (or ``values``) into every process's variables."""

    @abc.abstractmethod
    def scatter(self, session: Session, targets: Targets, values: list,
                batches: tuple[Batch, ...]) -> None:
        """Rank ``r`` gets its block of each value's selected rows (one ``Batch`` each)."""

    @abc.abstractmethod
    def gather(self, session: Session, targets: Targets,
               shapes: list[list[tuple[int, ...]]]) -> list[list[np.ndarray]]:
        """Every rank's values in the master, ``result[variable][rank]``: read-only use,
        valid until the next command (the caller stacks or concatenates them)."""

    @abc.abstractmethod
    def all_gather(self, session: Session, targets: Targets,
                   shapes: list[list[tuple[int, ...]]]) -> None:
        """Every process's variables become the concatenation over ranks (axis 0)."""

    @abc.abstractmethod
    def reduce(self, session: Session, targets: Targets, op: Any,
               in_place: bool) -> list[np.ndarray] | None:
        """Reduce into the master's variables, or return new arrays."""

    @abc.abstractmethod
    def all_reduce(self, session: Session, targets: Targets, op: Any) -> None:
        """Reduce into every process's variables."""

    @abc.abstractmethod
    def set_value(self, session: Session, rank: int, targets: Targets, values: list,
                  batch: Batch | None) -> None:
        """The ``batch`` rows of each value (all if None) into rank ``rank``'s variables."""

    @abc.abstractmethod
    def get_value(self, session: Session, rank: int, targets: Targets) -> list[np.ndarray]:
        """Copies of rank ``rank``'s values."""

    @abc.abstractmethod
    def execute(self, session: Session, payload: tuple) -> Any:
        """This rank's part of one ``COLLECTIVE`` command; the reply goes to the master."""


_BACKENDS: dict[str, Callable[[], Backend]] = {}


def register_backend(device: str) -> Callable[[type[Backend]], type[Backend]]:
    """Class decorator: make ``cls`` the collectives backend of sessions on ``device``."""

    def decorate(cls: type[Backend]) -> type[Backend]:
        cls.device = device
        _BACKENDS[device] = cls
        return cls

    return decorate


def backend_for(session: Session) -> Backend:
    """This process's backend for ``session.device`` (one instance per process)."""
    backend = session.local_or_none("collectives")  # the hot path: no closure to build
    if backend is None:
        backend = session.local("collectives", lambda: _new_backend(session.device))
    return backend


def _new_backend(device: str) -> Backend:
    factory = _BACKENDS.get(device)
    if factory is None:
        raise RuntimeError(
            f"collectives are not implemented for device {device!r} yet "
            f"(available: {', '.join(sorted(_BACKENDS))})"
        )
    return factory()


@register(Opcode.COLLECTIVE)
def _collective(session: Session, payload: tuple) -> Any:
    """Every process: run this rank's part of a collective on its own backend."""
    return backend_for(session).execute(session, payload)
