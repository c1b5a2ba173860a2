"""The ``device="gpu"`` backend on NCCL, for sessions where each process has its own GPU.

Chosen by the backends' factory (``backend.BACKEND``) when the session's placement
gives every process a GPU of its own (``Placement.shares_gpus`` false: NCCL refuses
two ranks on one device) and NCCL loads (``_runtime.nccl.available``); otherwise a
``device="gpu"`` session takes the staged backend (``staged.py``).

``all_reduce`` and ``broadcast`` run on NCCL (``_runtime.nccl.Communicator``): the
variables' values are JAX arrays on each process's GPU, given to NCCL as they are (one
fused device buffer per dtype there), and each variable is bound to its result, a new
JAX array; no byte crosses to the host. Every other collective (``reduce``,
``reduce_scatter`` and ``all_gather`` of pieces, the region commands) is the staged
exchange this backend inherits, as is an ``all_reduce`` of a list holding a dtype NCCL
has no type for (bool, complex, int16, ...).

The communicator is made once per session, inside the first ``all_reduce`` or
``broadcast``: the master makes NCCL's unique id (``setup``), the command carries it,
and every process builds its ``Communicator`` from it in that command (``accept``;
NCCL's set-up is collective). Communicator and id are parameters, so that a unit test
can run the plumbing on a stand-in without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _pytensor
from .._core import faults
from .._core.context import RankContext
from .._reducers import ReduceOp
from .._runtime import nccl
from .backend import register_backend, store_value
from .cpu import Group
from .staged import StagedBackend

__all__ = ["NcclBackend"]


def _own_gpus(ctx: RankContext) -> bool:
    """Every process has a GPU of its own, and NCCL loads."""
    return not ctx.placement.shares_gpus and nccl.available() is None


@register_backend("gpu", when=_own_gpus)
class NcclBackend(StagedBackend):
    """``all_reduce`` and ``broadcast`` on NCCL; the rest staged through host memory.

    Parameters
    ----------
    communicator
        Makes this process's communicator: ``communicator(size, rank, uid)``.
    unique_id
        Makes the communicator's id in the master.
    """

    def __init__(self, communicator: Callable[[int, int, Sequence[int]], Any] = nccl.Communicator,
                 unique_id: Callable[[], Sequence[int]] = nccl.unique_id) -> None:
        super().__init__()
        self._communicator = communicator
        self._unique_id = unique_id
        self._sent = False  # master: the id went out with a command
        self.comm: Any = None  # every process: its communicator, once accepted
        self._native: dict[int, bool] = {}  # group key -> every dtype has an NCCL type

    # -- the communicator, once ------------------------------------------------------------
    def setup(self, ctx: RankContext) -> Any:
        if self._sent:
            return None
        self._sent = True
        return tuple(self._unique_id())

    def accept(self, ctx: RankContext, setup: Any) -> None:
        self.comm = self._communicator(ctx.size, ctx.rank, setup)

    # -- primitives --------------------------------------------------------------------------
    def _on_nccl(self, group: Group) -> bool:
        native = self._native.get(group.key)
        if native is None:
            native = self._native[group.key] = all(
                nccl.supports(dtype) for dtype in group.layout.dtypes)
        return native

    def stage_broadcast(self, ctx: RankContext, group: Group, values: list | None) -> None:
        """The master's variables take ``values``; they are what NCCL sends."""
        if not self._on_nccl(group):
            super().stage_broadcast(ctx, group, values)
        elif values is not None:
            for var, value in zip(group.variables, values, strict=True):
                store_value(ctx, var, value)

    def all_reduce(self, ctx: RankContext, group: Group, op: ReduceOp) -> bool:
        if not self._on_nccl(group):
            return super().all_reduce(ctx, group, op)
        # a value set from the host (set_value with a numpy array) goes to the device first
        to_device = ctx.placement.to_device
        values = [to_device(_pytensor.value(var)) for var in group.variables]
        ok = all(tuple(value.shape) == shape
                 for value, shape in zip(values, group.layout.shapes, strict=True))
        if not ctx.meeting.agree(ctx, ok):
            return False
        if faults.ARMED:
            faults.hit("exchange")
        results = self.comm.all_reduce(values, op.value)
        for var, result in zip(group.variables, results, strict=True):
            _pytensor.bind(var, result)
        return True

    def broadcast(self, ctx: RankContext, group: Group) -> None:
        if not self._on_nccl(group):
            super().broadcast(ctx, group)
            return
        root, layout = ctx.master_rank, group.layout
        if ctx.rank == root:
            sent = [ctx.placement.to_device(_pytensor.value(var)) for var in group.variables]
            self.comm.broadcast(sent, root)
            return  # its variables hold the values sent
        room = [ctx.placement.to_device(np.empty(shape, dtype))  # the shapes NCCL fills
                for dtype, shape in zip(layout.dtypes, layout.shapes, strict=True)]
        for var, result in zip(group.variables, self.comm.broadcast(room, root), strict=True):
            _pytensor.bind(var, result)
