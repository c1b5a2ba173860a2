"""The device backend of the collectives: a few primitives over fused buffers.

``torch.distributed``'s process group is the model: a backend knows how to move and
combine bytes between ranks, and nothing about shared variables. Everything above it
(which variables, checks, fusing a list into one buffer, pointing each variable at its
result: ``fused.py``) is the same on every device.

Two kinds of buffer, both laid out by ``FusedLayout`` (every variable of a list at its
own aligned offset in one flat buffer):

- a **group**: one copy of one layout per rank (the variables of a ``broadcast``,
  ``reduce``, ``all_reduce``; a training step's flat gradient). Made in the master
  (``resident``) and announced to the ranks in the first command that uses it
  (``GroupSpec``); the variables live in it between commands, so the next collective
  copies nothing in.
- **regions**: one layout per rank, sizes differing (``gather``, ``all_gather``,
  ``scatter``, ``set_value``, ``get_value``): the backend's scratch, laid out anew for
  each command.

The primitives, run by every rank inside one command (rank side):

- on a group: ``all_reduce``, ``reduce`` (to a root), ``reduce_scatter`` (each rank its
  piece, ``FusedLayout.pieces``), ``all_gather`` (each piece from its owner),
  ``broadcast``;
- on regions: ``write_region``/``read_regions`` (the data of gather-like commands);
- ``barrier`` and the vote ``agree`` are the session's (``RankContext``).

A backend registers itself for a device name (``register_backend``); each process
makes one instance of its session's backend (``BACKEND``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.context import RankContext, RankVar
from .._reducers import ReduceOp
from .._scatter import split_bounds

__all__ = [
    "ALIGN",
    "Backend",
    "BACKEND",
    "FusedLayout",
    "GroupSpec",
    "Targets",
    "register_backend",
]

ALIGN = 64  # every variable of a fused buffer starts on its own cache line


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


@dataclass(frozen=True)
class GroupSpec:
    """What a rank needs to map a new group: sent with the first command that uses it."""

    key: int
    name: str  # where the backend keeps it (a segment name on CPU)
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    uids: tuple[int, ...]
    evicted: tuple[int, ...] = ()  # keys of groups the ranks may forget now


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
    """One device kind's buffers and primitives (see the module docstring).

    Master-side methods make buffers before a command; rank-side methods run inside
    one, on every rank, and may trust what the master checked.
    """

    device: str = ""

    # -- buffers ----------------------------------------------------------------------------
    @abc.abstractmethod
    def resident(self, ctx: RankContext, targets: Targets,
                 shapes: tuple[tuple[int, ...], ...]) -> tuple[Any, GroupSpec | None]:
        """Master: the group of ``targets`` laid out for ``shapes`` (made if new), and
        its spec when the ranks have not seen it yet."""

    @abc.abstractmethod
    def group(self, ctx: RankContext, key: int, spec: GroupSpec | None) -> Any:
        """Rank: the group ``key``, mapped from ``spec`` the first time."""

    @abc.abstractmethod
    def regions(self, ctx: RankContext, nbytes: int) -> tuple[Any, str | None]:
        """Master: scratch of at least ``nbytes``, and its name when it is new."""

    @abc.abstractmethod
    def scratch(self, ctx: RankContext, name: str) -> Any:
        """Rank: the scratch a command names."""

    @property
    @abc.abstractmethod
    def scratch_name(self) -> str:
        """Master: the name of the current scratch (what a command names)."""

    @abc.abstractmethod
    def settle(self, ctx: RankContext, new: Sequence[str]) -> None:
        """Master, after a command: the buffers it introduced are mapped everywhere."""

    @abc.abstractmethod
    def discard(self, ctx: RankContext, new: Sequence[str]) -> None:
        """Master, after a failed command: forget buffers some rank may not have."""

    # -- primitives on a group (rank side) ----------------------------------------------
    @abc.abstractmethod
    def all_reduce(self, ctx: RankContext, group: Any, op: ReduceOp,
                   values: list[np.ndarray]) -> list[np.ndarray]:
        """Every rank's values combined by ``op``; returns this rank's result arrays.

        ``values``: this rank's value of each variable, flat (its storage or its slot).
        """

    @abc.abstractmethod
    def reduce(self, ctx: RankContext, group: Any, op: ReduceOp, values: list[np.ndarray],
               out: list[np.ndarray] | None) -> None:
        """Every rank's values combined into ``out`` (flat; default: the root's slot)."""

    @abc.abstractmethod
    def reduce_scatter(self, ctx: RankContext, group: Any, op: ReduceOp,
                       values: list[np.ndarray]) -> None:
        """This rank's piece of the combined values, into its own slot."""

    @abc.abstractmethod
    def all_gather(self, ctx: RankContext, group: Any) -> None:
        """Every rank's piece (of its own slot) into every slot."""

    @abc.abstractmethod
    def broadcast(self, ctx: RankContext, group: Any, root: int) -> None:
        """The root's slot into every slot."""

    def pair_reduce(self, ctx: RankContext, group: Any, op: ReduceOp) -> tuple | None:
        """The worker of a two-rank ``all_reduce`` without a barrier (only for groups
        whose ``pair`` is true; a backend that never sets it need not implement it)."""
        raise NotImplementedError


_BACKENDS: dict[str, Callable[[], Backend]] = {}


def register_backend(device: str) -> Callable[[type[Backend]], type[Backend]]:
    """Class decorator: make ``cls`` the collectives backend of sessions on ``device``."""

    def decorate(cls: type[Backend]) -> type[Backend]:
        cls.device = device
        _BACKENDS[device] = cls
        return cls

    return decorate


def _new_backend(ctx: RankContext) -> Backend:
    factory = _BACKENDS.get(ctx.device)
    if factory is None:
        raise RuntimeError(
            f"collectives are not implemented for device {ctx.device!r} yet "
            f"(available: {', '.join(sorted(_BACKENDS))})"
        )
    return factory()


BACKEND: RankVar[Backend] = RankVar("collectives backend", _new_backend)
