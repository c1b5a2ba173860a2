"""The NCCL collectives backend's plumbing, on a stand-in communicator (never forks).

Real NCCL needs a GPU per process; here two ranks are two threads of this process,
each with its own context, backend and shared variables, and the communicator is a
stand-in that meets the other rank's at a barrier and combines numpy arrays as NCCL
combines device arrays. What is checked: which backend the factory picks, the
communicator's id made once by the master and carried by the first command that needs
it, every rank building its communicator inside that command, the vote on shapes
before NCCL is called, each variable bound to its result, and the dtypes NCCL lacks
taking the staged exchange. NCCL itself on device arrays: ``tests/unit/test_nccl.py``
(one rank, where CUDA is present).
"""

from __future__ import annotations

import threading

import numpy as np
import pytensor
import pytest

from synkhronos._core.context import RankContext
from synkhronos._reducers import ReduceOp
from synkhronos._runtime import nccl as nccl_runtime
from synkhronos._runtime.placement import JaxPlacement
from synkhronos.collectives import backend, fused
from synkhronos.collectives.nccl import NcclBackend
from synkhronos.collectives.ranks import HANDLERS
from synkhronos.collectives.staged import StagedBackend

UID = (7, 1, 2)


class World:
    """What the stand-in communicators of one session share."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.meeting = threading.Barrier(size, timeout=10)
        self.posted: list = [None] * size
        self.made: list[tuple[int, int, tuple]] = []
        self.calls: list[str] = []

    def communicator(self, size: int, rank: int, uid) -> StandIn:
        self.made.append((size, rank, tuple(uid)))
        return StandIn(self, rank)


class StandIn:
    """``_runtime.nccl.Communicator``'s interface on numpy arrays, across threads."""

    def __init__(self, world: World, rank: int) -> None:
        self.world, self.rank = world, rank

    def _exchange(self, arrays):
        world = self.world
        world.posted[self.rank] = [np.array(a) for a in arrays]
        world.meeting.wait()
        every = list(world.posted)
        world.meeting.wait()
        return every

    def all_reduce(self, arrays, op):
        self.world.calls.append(f"all_reduce {op}")
        every = self._exchange(arrays)
        ufunc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
                 "prod": np.multiply}[op]
        results = []
        for i in range(len(arrays)):
            out = every[0][i].copy()
            for other in every[1:]:
                ufunc(out, other[i], out=out)
            results.append(out / self.world.size if op == "avg" else out)
        return results

    def broadcast(self, arrays, root):
        self.world.calls.append("broadcast")
        every = self._exchange(arrays)
        return [value.copy() for value in every[root]]


def _context(rank: int, size: int = 2) -> RankContext:
    return RankContext(rank=rank, size=size, master_rank=0, prefix="synk_test_",
                       arena=None, control=None, master_pid=0, device="gpu")


def _ranks(world: World, values_of, key: int = 3):
    """Per rank: its context, a backend on the stand-in, and a group of new shared
    variables holding ``values_of(rank)`` (the backend's group ``key``)."""
    ranks = []
    for rank in range(world.size):
        ctx = _context(rank, world.size)
        nccl = NcclBackend(communicator=world.communicator, unique_id=lambda: UID)
        ctx._vars[backend.BACKEND] = nccl  # this process's backend, as if chosen
        variables = [pytensor.shared(value) for value in values_of(rank)]
        group = backend.Group(key, backend.FusedLayout(
            [v.dtype for v in values_of(0)], [v.shape for v in values_of(0)]), variables)
        nccl._by_key[key] = group  # type: ignore[assignment]
        ranks.append((ctx, nccl, variables))
    return ranks


def _on_every_rank(ranks, message):
    replies: list = [None] * len(ranks)
    errors: list = []

    def run(index, ctx):
        try:
            replies[index] = HANDLERS[type(message)](ctx, message)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, ctx)) for i, (ctx, _, _) in
               enumerate(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not errors, errors
    return replies


def test_factory_picks_nccl_only_with_a_gpu_each(monkeypatch):
    monkeypatch.setattr(nccl_runtime, "available", lambda: None)
    own = _context(0)
    own.placement = JaxPlacement(("0", "1"))
    assert type(backend.BACKEND.get(own)) is NcclBackend
    shared = _context(0)
    shared.placement = JaxPlacement(("0", "0"))
    assert type(backend.BACKEND.get(shared)) is StagedBackend
    stand_in = _context(0)
    stand_in.placement = JaxPlacement(())  # JAX's CPU platform
    assert type(backend.BACKEND.get(stand_in)) is StagedBackend
    monkeypatch.setattr(nccl_runtime, "available", lambda: "no CuPy")
    missing = _context(0)
    missing.placement = JaxPlacement(("0", "1"))
    assert type(backend.BACKEND.get(missing)) is StagedBackend


def test_master_sends_the_id_once():
    world = World(2)
    master = NcclBackend(communicator=world.communicator, unique_id=lambda: UID)
    ctx = _context(0)
    assert master.setup(ctx) == UID
    assert master.setup(ctx) is None
    assert world.made == []  # made in the command, not when the id is


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX])
def test_all_reduce_builds_communicators_in_the_command_and_binds_results(op):
    world = World(2)

    def values_of(rank):
        return [np.arange(5, dtype=np.float32) * (rank + 1),
                np.full((2, 3), rank + 2.0, dtype=np.float64)]

    ranks = _ranks(world, values_of)
    replies = _on_every_rank(ranks, fused.AllReduce(3, None, op, False, UID))
    assert replies == [None, None]
    assert sorted(world.made) == [(2, 0, UID), (2, 1, UID)]
    ufunc = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.MAX: np.maximum}[op]
    for i in range(2):
        expected = ufunc(values_of(0)[i], values_of(1)[i])
        if op is ReduceOp.AVG:
            expected = expected / 2
        for _, _, variables in ranks:
            np.testing.assert_array_equal(variables[i].get_value(), expected)
    # the next command carries no id: the communicators are kept
    again = _on_every_rank(ranks, fused.AllReduce(3, None, ReduceOp.SUM, False))
    assert again == [None, None] and len(world.made) == 2


def test_shapes_differing_are_voted_before_nccl():
    world = World(2)
    ranks = _ranks(world, lambda rank: [np.zeros(4 + rank, np.float32)])
    for _, nccl, _ in ranks:
        nccl.comm = world.communicator(2, 0, UID)
    # control is None in these contexts: each rank's vote is its own, as a
    # one-process context's is; the rank whose shapes differ refuses
    replies = _on_every_rank(ranks[1:], fused.AllReduce(3, None, ReduceOp.SUM, False))
    assert isinstance(replies[0], fused.Mismatch) and replies[0].shapes == ((5,),)
    assert world.calls == []


def test_broadcast_gives_every_rank_the_masters_values():
    world = World(2)
    ranks = _ranks(world, lambda rank: [np.full(3, rank + 1.0), np.arange(4, dtype=np.int64)
                                        * (rank + 1)])
    master_ctx, master, master_vars = ranks[0]
    new = [np.array([9.0, 8.0, 7.0]), np.array([1, 2, 3, 4], dtype=np.int64)]
    group = master._by_key[3]
    master.stage_broadcast(master_ctx, group, new)  # type: ignore[arg-type]
    _on_every_rank(ranks, fused.Broadcast(3, None, UID))
    assert world.calls == ["broadcast", "broadcast"]
    for _, _, variables in ranks:
        for var, value in zip(variables, new, strict=True):
            np.testing.assert_array_equal(var.get_value(), value)


def test_dtypes_nccl_lacks_take_the_staged_exchange():
    world = World(2)
    nccl = NcclBackend(communicator=world.communicator, unique_id=lambda: UID)
    native = backend.Group(1, backend.FusedLayout(["float32", "int64"], [(2,), ()]), [])
    lacking = backend.Group(2, backend.FusedLayout(["float32", "complex64"], [(2,), ()]),
                            [])
    assert nccl._on_nccl(native)  # type: ignore[arg-type]
    assert not nccl._on_nccl(lacking)  # type: ignore[arg-type]
    assert nccl_runtime.supports("float16") and not nccl_runtime.supports("bool")



class _CupyNccl:
    """CuPy's ``cupy.cuda.nccl`` as far as building a communicator goes: CuPy 14 takes
    the id as ``bytes`` (a tuple is a TypeError), earlier versions as a tuple."""

    def __init__(self, takes: type) -> None:
        self.takes, self.built = takes, []

    def NcclCommunicator(self, size, comm_id, rank):  # noqa: N802 (CuPy's name)
        if not isinstance(comm_id, self.takes):
            raise TypeError(f"Argument 'commId' has incorrect type (expected "
                            f"{self.takes.__name__}, got {type(comm_id).__name__})")
        self.built.append((size, comm_id, rank))
        return object()


@pytest.mark.parametrize("takes", [tuple, bytes])
def test_communicator_id_in_the_form_each_cupy_takes(takes):
    made = bytes(range(120, 248))  # CuPy 14's get_unique_id(): 128 bytes
    uid = tuple(made)  # what unique_id() sends to every process
    module = _CupyNccl(takes)
    nccl_runtime._communicator(module, 2, uid, 1)
    ((size, comm_id, rank),) = module.built
    assert (size, rank) == (2, 1)
    # the same 128 bytes in either form (a tuple of signed chars before CuPy 14)
    assert bytes(v & 0xFF for v in comm_id) == made
