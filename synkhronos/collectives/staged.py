"""The ``device="gpu"`` collectives backend staged through host shared memory.

Used when processes share a GPU (NCCL refuses two ranks on one device) and on JAX's
CPU platform standing in for GPUs (and, with NCCL, for every command NCCL does not
run: ``nccl.py``). It is the CPU backend's exchange, with the values crossing between
device and host at its two ends: ``cpu.load`` reads each variable's value through the
session's placement (device -> host, into this rank's slot) and ``cpu.rebind`` binds
each result through it (host -> a new device array), so a variable never views an
exchange slot, as it does on CPU. Two consequences, both declared here:

- no group is ever *resident* (the master's values never live in its slot), so every
  collective copies its values in;
- the two-process ``pair`` path is off: it lets the worker rebind the master's slot in
  place, which only host values allow;
- a large in-place ``reduce`` waits for every rank's piece (a barrier) before the root
  copies its slot to the device: on CPU the root's variables view the slot, which the
  other ranks finish filling before the command returns.
"""

from __future__ import annotations

from typing import Any

from .._core.context import RankContext
from .backend import GroupSpec, Targets, register_backend
from .cpu import CpuBackend, Group

__all__ = ["StagedBackend"]


@register_backend("gpu")
class StagedBackend(CpuBackend):
    """Collectives on device values, exchanged through host shared memory."""

    def resident(self, ctx: RankContext, targets: Targets,
                 shapes: tuple[tuple[int, ...], ...]) -> tuple[Group, GroupSpec | None]:
        group, spec = super().resident(ctx, targets, shapes)
        group.pair = False
        return group, spec

    def current(self, ctx: RankContext, targets: Targets) -> Group | None:
        return None  # device values never live in a host slot

    def pieces_written(self, ctx: RankContext) -> None:
        ctx.meeting.barrier(ctx)  # the root copies its slot to the device: every piece must be in

    def group(self, ctx: RankContext, key: int, spec: GroupSpec | None) -> Any:
        group = super().group(ctx, key, spec)
        group.pair = False
        return group
