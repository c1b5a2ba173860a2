"""The collectives' backend: the interface ``fused.py`` uses, declared, and its factory.

``torch.distributed``'s process group is the model: a backend knows how to move and
combine values between ranks, and nothing about which variables a user named or how
a call was checked. Everything above it (checks, the messages, the master's steps,
the replies: ``fused.py``) is the same on every backend, and never asks which one
runs, how many machines there are, or where values live.

Two kinds of buffer, both laid out by ``FusedLayout`` (every variable of a list at its
own aligned offset in one flat buffer):

- a **group** (``Group``): one list of variables and its layout (the variables of a
  ``broadcast``, ``reduce``, ``all_reduce``; a training step's flat gradient). Made in
  the master (``resident``) and announced to the ranks in the first command that uses
  it (``GroupSpec``). Where its values live between commands is the backend's: on
  CPU the variables view their slots of a shared-memory segment, so the next
  collective copies nothing in; on a device they stay device arrays.
- **regions**: scratch in host memory, one region per rank, sizes differing
  (``gather``, ``all_gather``, ``scatter``, ``set_value``, ``get_value``), laid out
  anew for each command. Every backend has them (a device backend stages these
  commands through host memory).

The primitives on a group run on every rank inside one command and take the group's
*variables*: each loads its own values, the ranks vote that their shapes match the
master's (``ctx.meeting.agree``: all leave unchanged together if any differs), the
values are combined or copied, and each variable is bound to its result. That is what
lets a backend whose values are not host arrays (NCCL on JAX arrays) implement them.
The region primitives run after every rank wrote its region (or the master staged
its values) and move regions where they are read.

A low-precision exchange (``exchange="bf16"``/``"fp16"``: ``low_precision_all_reduce``,
``low_precision_reduce_scatter``) is a primitive of its own, beside the exact ones, so
that the exact exchange's path is not touched by it; its 16-bit buffers (a group's
**wire**, ``rounded.py``) are made by the master and named to the ranks in the first
command that uses them, as a group is (``wire``, ``map_wire``).

A backend registers itself for a device name, optionally with a condition on the
context (``register_backend``); each process makes one instance, chosen once from
its context (``BACKEND``): the first registered backend whose condition holds, else
the device's unconditional one. A backend may wrap another (the several-machines one
wraps the shared-memory one).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from .. import _pytensor
from .._core.context import RankContext, RankVar
from .._reducers import ReduceOp
from .._runtime.lowprec import Exchange
from .._scatter import split_bounds

__all__ = [
    "column",
    "even_piece_length",
    "host_value",
    "store_value",
    "ALIGN",
    "Backend",
    "BACKEND",
    "FusedLayout",
    "Group",
    "GroupSpec",
    "Targets",
    "register_backend",
]

ALIGN = 64  # every variable of a fused buffer starts on its own cache line


def column(views: Sequence[np.ndarray]) -> np.ndarray:
    """One variable's views in consecutive slots of a segment, as one view whose first
    axis is the slot: what ``combined`` reduces in one call. The slots must lie one
    stride apart, as every group lays them out."""
    addresses = [view.__array_interface__["data"][0] for view in views]
    step = addresses[1] - addresses[0] if len(views) > 1 else views[0].nbytes
    if any(b - a != step for a, b in zip(addresses, addresses[1:], strict=False)):
        raise ValueError("the slots of a column must lie one stride apart")
    first = views[0]
    return np.lib.stride_tricks.as_strided(first, (len(views), *first.shape),
                                           (step, *first.strides))


def host_value(ctx: RankContext, var: Any) -> np.ndarray:
    """A shared variable's value on the host (the value itself on CPU; from a device,
    a copy), through the session's placement."""
    return ctx.placement.to_host(_pytensor.value(var))


def store_value(ctx: RankContext, var: Any, array: Any) -> None:
    """Make host ``array`` the variable's value (itself on CPU; on a device, a device
    copy of it), through the session's placement."""
    _pytensor.bind(var, ctx.placement.to_device(array))


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


def even_piece_length(size: int, parts: int, dtype: Any) -> int:
    """The length ``L`` of ``parts`` equal pieces holding ``size`` elements of ``dtype``,
    padded: ``ceil(size / parts)`` rounded up to whole cache lines (``ALIGN`` bytes).

    ``FusedLayout.pieces(parts)`` of one vector of ``parts * L`` elements then cuts it
    exactly at ``[r * L, (r + 1) * L)``: the cuts fall on cache lines, and the lines
    divide evenly. Each part's piece has one length, what a function compiled for
    static shapes (JAX) needs.
    """
    if size < 1 or parts < 1:
        raise ValueError(f"even_piece_length needs size and parts >= 1; got {size}, {parts}")
    per_line = ALIGN // math.gcd(ALIGN, np.dtype(dtype).itemsize)  # elements per whole line
    return -(-size // (parts * per_line)) * per_line


def _element(byte: int, itemsize: int, size: int) -> int:
    """The first element at or after ``byte`` of an array, clipped to ``[0, size]``."""
    return min(size, max(0, -(-byte // itemsize)))


class Group:
    """What ``fused.py`` reads of a group; each backend's groups add their buffers.

    Attributes
    ----------
    key : int
        The group's id in every process.
    layout : FusedLayout
        Its variables' dtypes and shapes (the master's when it was made).
    variables : list
        This process's shared variables of the group.
    small : bool
        Small enough that one rank combining everything beats splitting the work.
    pair : bool
        Two ranks and small: ``all_reduce`` runs as ``Backend.pair_reduce`` (the
        worker alone combines, no meeting point). False unless a backend says so.
    steps : dict
        The master's built steps on this group, kept for repeated calls (``fused.py``).
    """

    def __init__(self, key: int, layout: FusedLayout, variables: list) -> None:
        self.key, self.layout, self.variables = key, layout, variables
        self.small = True
        self.pair = False
        self.steps: dict[Any, Any] = {}


G = TypeVar("G", bound=Group)


class Backend(abc.ABC, Generic[G]):
    """One kind of exchange's buffers and primitives (see the module docstring).

    Master-side methods run before or after a command; rank-side methods run inside
    one, on every rank (the master included), and may trust what the master checked.
    A rank-side primitive on a group returns False, on every rank alike and having
    changed nothing, when some rank's shapes differ from the group's.
    """

    device: str = ""

    # -- master: buffers and staging ---------------------------------------------------
    @abc.abstractmethod
    def resident(self, ctx: RankContext, targets: Targets,
                 shapes: tuple[tuple[int, ...], ...]) -> tuple[G, GroupSpec | None]:
        """Master: the group of ``targets`` laid out for ``shapes`` (made if new), and
        its spec when the ranks have not seen it yet."""

    def current(self, ctx: RankContext, targets: Targets) -> G | None:
        """Master: the group of ``targets`` if the master's values already are where
        the group keeps them (nothing to load, no new layout), else None."""
        return None

    @abc.abstractmethod
    def regions(self, ctx: RankContext, nbytes: int) -> tuple[Any, str | None]:
        """Master: host scratch of at least ``nbytes``, and its name when it is new."""

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

    @abc.abstractmethod
    def stage_broadcast(self, ctx: RankContext, group: G, values: list | None) -> None:
        """Master, before a ``broadcast``: ``values`` (host arrays; None: the master's
        own) become its variables' values and what the ranks receive."""

    reduce_through_scratch: bool = False
    """Whether an in-place ``reduce`` also goes through the scratch (one not in place
    always does: the master reads its result there)."""

    def pair_copies(self, ctx: RankContext, group: G,
                    resident: bool) -> list[tuple[Any, Any]]:
        """Master, building a ``pair`` all-reduce: stage its values where the worker
        reads them (unless ``resident``); the ``(target, source)`` arrays to copy after
        each such command. Only for groups whose ``pair`` is true."""
        raise NotImplementedError

    @abc.abstractmethod
    def wire(self, ctx: RankContext, group: G) -> str | None:
        """Master, building a low-precision exchange on ``group``: its 16-bit buffers
        (made the first time), and their name when the ranks have not seen them yet."""

    def setup(self, ctx: RankContext) -> Any:
        """Master, building an ``all_reduce`` or a ``broadcast``: what every rank needs
        before it, once (sent in that command and given to ``accept`` there); None when
        nothing."""
        return None

    # -- every process -------------------------------------------------------------------
    @abc.abstractmethod
    def group(self, ctx: RankContext, key: int, spec: GroupSpec | None) -> G:
        """Rank: the group ``key``, mapped from ``spec`` the first time."""

    @abc.abstractmethod
    def scratch(self, ctx: RankContext, name: str) -> Any:
        """Rank: the scratch a command names (a writable host buffer)."""

    @abc.abstractmethod
    def map_wire(self, ctx: RankContext, group: G, name: str) -> None:
        """Rank: the 16-bit buffers a command introduces for ``group`` (``wire``)."""

    def accept(self, ctx: RankContext, setup: Any) -> None:  # noqa: B027 (optional)
        """Rank: take what ``setup`` made in the master (inside that command)."""

    # -- primitives on a group (rank side): load, vote, combine or copy, bind --------------
    @abc.abstractmethod
    def all_reduce(self, ctx: RankContext, group: G, op: ReduceOp) -> bool:
        """Every rank's values combined by ``op``, bound to every rank's variables."""

    def pair_reduce(self, ctx: RankContext, group: G, op: ReduceOp) -> tuple | None:
        """The worker of a two-rank ``all_reduce`` without a meeting point (groups whose
        ``pair`` is true); its shapes if they differ from the master's, else None."""
        raise NotImplementedError

    @abc.abstractmethod
    def low_precision_all_reduce(self, ctx: RankContext, group: G, op: ReduceOp,
                                 exchange: Exchange) -> bool:
        """``all_reduce`` of float32 values by ``sum`` or ``avg``, each rank's values
        rounded to ``exchange``'s 16 bits before they leave it, the rounded values
        summed in float32 in rank order (``_runtime/lowprec.py``)."""

    @abc.abstractmethod
    def low_precision_reduce_scatter(self, ctx: RankContext, group: G, op: ReduceOp,
                                     exchange: Exchange) -> bool:
        """``reduce_scatter`` with the values rounded as ``low_precision_all_reduce``
        rounds them: this rank's piece of that result in its variables."""

    @abc.abstractmethod
    def reduce(self, ctx: RankContext, group: G, op: ReduceOp, in_place: bool,
               scratch: Any) -> bool:
        """Every rank's values combined by ``op``: into the master's variables
        (``in_place``), and into ``scratch`` (the layout at its start) when the
        command names one (not ``in_place``, or ``reduce_through_scratch``); no other
        value changes."""

    @abc.abstractmethod
    def reduce_scatter(self, ctx: RankContext, group: G, op: ReduceOp) -> bool:
        """This rank's piece (``FusedLayout.pieces``) of the combined values in its
        variables; the rest of their elements are left undefined."""

    @abc.abstractmethod
    def all_gather(self, ctx: RankContext, group: G) -> None:
        """Every rank's piece (of its variables) into every rank's variables."""

    def all_gather_common(self, ctx: RankContext, group: G) -> None:
        """``all_gather``, leaving every rank's variables views of one buffer where the
        values can share one (one machine's host memory); here, where they cannot, the
        copies of ``all_gather``."""
        self.all_gather(ctx, group)

    @abc.abstractmethod
    def broadcast(self, ctx: RankContext, group: G) -> None:
        """The master's values (``stage_broadcast``) into every rank's variables."""

    # -- primitives on regions (rank side) ---------------------------------------------
    @abc.abstractmethod
    def spread_staged(self, ctx: RankContext, message: Any, buffer: Any) -> None:
        """``scatter``/``set_value``: the values the master staged in ``buffer``, where
        the ranks that take them read them."""

    @abc.abstractmethod
    def share_regions(self, ctx: RankContext, message: Any, buffer: Any,
                      dtypes: list) -> None:
        """``gather`` (``message.everyone`` false: to the master) or ``all_gather``
        (to every rank): every rank wrote its region of ``buffer``; make them readable
        there."""

    @abc.abstractmethod
    def collect_region(self, ctx: RankContext, message: Any, buffer: Any) -> None:
        """``get_value``: rank ``message.rank`` wrote its region; make it readable in
        the master."""


_BACKENDS: dict[str, list[tuple[Callable[[RankContext], bool] | None,
                                Callable[[], Backend[Any]]]]] = {}


def register_backend(device: str, when: Callable[[RankContext], bool] | None = None
                     ) -> Callable[[type[Backend[Any]]], type[Backend[Any]]]:
    """Class decorator: make ``cls`` the collectives backend of sessions on ``device``
    (only of those whose context satisfies ``when``, if given)."""

    def decorate(cls: type[Backend[Any]]) -> type[Backend[Any]]:
        cls.device = device
        _BACKENDS.setdefault(device, []).append((when, cls))
        return cls

    return decorate


def _new_backend(ctx: RankContext) -> Backend[Any]:
    candidates = _BACKENDS.get(ctx.device, [])
    for when, factory in candidates:
        if when is not None and when(ctx):
            return factory()
    for when, factory in candidates:
        if when is None:
            return factory()
    raise RuntimeError(
        f"collectives are not implemented for device {ctx.device!r} yet "
        f"(available: {', '.join(sorted(_BACKENDS))})"
    )


BACKEND: RankVar[Backend[Any]] = RankVar("collectives backend", _new_backend)
