"""distribute(): ship every PyTensor function built so far to the workers, in one pickle.

Why one pickle: PyTensor keeps two functions' shared variables shared only when both
are unpickled from the same ``pickle.dumps`` call. Why by reference on later calls:
a variable distributed earlier lives on in every worker, possibly with a different
value per rank (scattered data, local updates); re-pickling it would duplicate it.

So each process keeps a ``Registry`` (the ``REGISTRY`` rank variable):

- ``functions``: id -> compiled ``pytensor`` function (the same ids everywhere);
- ``shared``: uid -> ``SharedVariable``; the master also maps ``id(var)`` -> uid.

``distribute()`` (master):

1. pickles ``(functions, new shared variables)`` with a pickler that writes every
   already-distributed variable, its storage cell and its current value as a
   reference (its uid);
2. runs one ``Distribute`` command: each worker unpickles, resolving references to its
   own objects, and registers the new functions and variables under the master's ids;
   a new random generator gets the worker's own stream (``_streams``) unless the
   program asked for identical streams.

Nothing is compiled then: a function is compiled when it is first called
(``Registry.first_call``: the master first, Numba's explicit compile for the exact
signature calls use, so that the on-disk cache is warm and the workers load rather
than compile), so a program that builds functions it never calls (the tutorials'
LSTM: ``f_cost``, ``f_grad``) does not compile them.

Over several machines the same pickle goes to every machine; there the leader first
unpickles and compiles it (``prepare``, before its workers see the command), so that
each machine compiles once and its workers load from its on-disk cache.
"""

from __future__ import annotations

import io
import logging
import pickle
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _pytensor
from ._core import faults
from ._core.context import RankContext, RankVar
from ._core.protocol import Message
from ._core.session import require
from ._streams import Streams, check_streams, reseed

__all__ = ["distribute", "Distribute", "Registry", "REGISTRY", "receive", "prepare"]

log = logging.getLogger("synkhronos")


class Registry:
    """One process's distributed functions and shared variables."""

    def __init__(self) -> None:
        self.functions: dict[int, Any] = {}
        self.runners: dict[int, Any] = {}  # fn id -> the function as calls run it
        self.shared: dict[int, Any] = {}
        self.uid_of: dict[int, int] = {}  # id(shared variable) -> uid, master only
        self.pending: dict[int, Any] = {}  # built in the master, not yet distributed
        self.retry: dict[int, Any] = {}  # distribution failed: retried on its own call
        self.extras: dict[int, list[Any]] = {}  # variables a function needs shipped too
        self.next_function = 0
        self.next_shared = 0
        self.unpickle_seconds: list[float] = []  # each worker's, for the last distribute
        self.compile_seconds = 0.0  # the master's, of functions first called since the
        # last distribute that shipped something
        self.compiled: set[int] = set()  # ids of the functions compiled (master)
        self.distributed_once = False
        self.prepared: Distribute | None = None  # another machine's leader: unpickled
        self.prepared_seconds: float | None = None
        self.random_streams: Streams = "independent"  # for generators shipped next, master
        self.row_holders: set[int] = set()  # id() of sliceable_shareds, master
        self.fresh: Any = None  # the master's ``collectives.fresh.Fresh`` (with workers)

    def add_function(self, fn: Any, extra_shared: Sequence[Any] = ()) -> int:
        """Register a master-built function for the next distribution; return its id."""
        fn_id = self.next_function
        self.next_function += 1
        self.functions[fn_id] = fn
        self.pending[fn_id] = fn
        self.extras[fn_id] = list(extra_shared)
        return fn_id

    def first_call(self, fn_id: int) -> None:
        """Compile function ``fn_id`` in the master before its first call reaches the
        workers, which then load it from the on-disk cache (Numba)."""
        if fn_id in self.compiled:
            return
        start = time.perf_counter()
        _pytensor.precompile(self.functions[fn_id])
        self.compile_seconds += time.perf_counter() - start
        self.compiled.add(fn_id)

    def is_distributed(self, fn_id: int) -> bool:
        """True once the workers have it (a failed one is queued again: False)."""
        if fn_id in self.retry:
            self.pending[fn_id] = self.retry.pop(fn_id)
        return fn_id not in self.pending

    def runner(self, ctx: RankContext, fn_id: int) -> Any:
        """Function ``fn_id`` as this process's calls run it (outputs on the host)."""
        run = self.runners.get(fn_id)
        if run is None:
            run = self.runners[fn_id] = ctx.placement.runner(
                _pytensor.trusted_call(self.functions[fn_id]))
        return run

    def uid(self, var: Any) -> int | None:
        """The uid of a distributed shared variable, or None."""
        return self.uid_of.get(id(var))


REGISTRY: RankVar[Registry] = RankVar("registry", lambda ctx: Registry())


@dataclass(frozen=True)
class Distribute(Message):
    """The pickle of new functions and shared variables, for every worker."""

    payload: bytes
    independent_streams: bool = True  # workers reseed the new random generators


_DEEP_RECURSION = 200_000  # pickle recurses once per level of a graph
_DEEP_STACK = 1 << 30  # bytes of (lazily committed) stack for that recursion


def _deep(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with room for a deep graph's pickling: in a thread of a large stack,
    with a high recursion limit for the time of the call (a ResNet's functions nest
    far deeper than Python's default 1000; the original Synkhronos raised the limit for
    the whole program when imported). Python 3.12 also caps C recursion at a fixed
    depth, so ``distribute`` pickles graph nodes in order first (``graph_nodes``);
    this covers whatever else nests deeply."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # raised again in the calling thread
            outcome["error"] = exc

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _DEEP_RECURSION))
    try:
        size = threading.stack_size(_DEEP_STACK)
        try:
            thread = threading.Thread(target=run, name="synkhronos-pickle")
            thread.start()
        finally:
            threading.stack_size(size)
        thread.join()
    finally:
        sys.setrecursionlimit(limit)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# Values that may be shared (interned) objects: never pickled by reference.
_BY_VALUE = (int, float, complex, bool, str, bytes, type(None), np.generic)


class _ReferencePickler(pickle.Pickler):
    def __init__(self, file, known: dict[int, tuple[str, int]]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._known = known

    def persistent_id(self, obj):
        return self._known.get(id(obj))

    def reducer_override(self, obj):
        return _pytensor.reduce_for_pickle(obj)  # what PyTensor itself cannot pickle


class _ReferenceUnpickler(pickle.Unpickler):
    def __init__(self, file, reg: Registry):
        super().__init__(file)
        self._reg = reg

    def persistent_load(self, pid):
        kind, uid = pid
        var = self._reg.shared[uid]
        if kind == "var":
            return var
        if kind == "storage":
            return _pytensor.storage(var)
        return _pytensor.value(var)


def distribute(random_streams: Streams | None = None) -> None:
    """Ship every function built since the last call to every worker.

    Compiles each new function in the master first, then pickles them all together
    so that shared variables used by several functions stay shared in each worker.
    Variables distributed earlier are sent by reference, never duplicated. Calling a
    function that was built after the last ``distribute()`` distributes it first.

    Collective: every process takes part; returns when all have finished.

    Parameters
    ----------
    random_streams : {"independent", "identical"}, optional
        What the random generators shipped now (``RandomStream``'s, shared
        generators) draw in the workers. ``"independent"`` (the default): each
        worker's generator is reseeded from a child of the master generator's
        ``SeedSequence`` keyed by its rank, so every process's rows get their own
        draws (dropout masks, corruption noise); the master keeps its generator, so
        one process draws what the serial program draws. ``"identical"``: every
        process draws what the master draws. The choice holds for later calls
        (and for functions distributed at their first call) until given again.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    ValueError
        ``random_streams`` is not one of the two choices.
    """
    session = require("synk.distribute()")
    session.check_usable()
    reg = REGISTRY.get(session.ctx)
    chosen = check_streams(random_streams)
    if chosen is not None:
        reg.random_streams = chosen
    reg.distributed_once = True
    if not reg.pending:
        return
    functions = dict(reg.pending)
    reg.compile_seconds = 0.0
    new_shared: dict[int, Any] = {}
    extras = [v for fn_id in functions for v in reg.extras.get(fn_id, ())]
    for var in [v for fn in functions.values() for v in _pytensor.shared_inputs(fn)] + extras:
        if id(var) not in reg.uid_of and all(var is not v for v in new_shared.values()):
            new_shared[reg.next_shared] = var
            reg.next_shared += 1
    if session.n > 1:
        known: dict[int, tuple[str, int]] = {}
        for uid, var in reg.shared.items():
            known[id(var)] = ("var", uid)
            known[id(_pytensor.storage(var))] = ("storage", uid)
            value = _pytensor.value(var)
            if not isinstance(value, _BY_VALUE):
                # PyTensor's unpickler checks a shared input's pickled value against
                # the container's; a worker's own value may differ from the master's.
                # (numpy arrays, and JAX arrays once a JAX-mode update has run.)
                known[id(value)] = ("value", uid)
        try:
            buffer = io.BytesIO()
            nodes = [n for fn in functions.values() for n in _pytensor.graph_nodes(fn)]
            _deep(_ReferencePickler(buffer, known).dump, (nodes, functions, new_shared))
            replies = session.run(Distribute(buffer.getvalue(),
                                             reg.random_streams == "independent"))
        except Exception:
            # These functions did not reach the workers. They leave the queue, so that
            # functions built later still distribute, and are retried alone when next
            # called; their variables' ids are handed out again then.
            reg.next_shared -= len(new_shared)
            for fn_id in functions:
                reg.retry[fn_id] = reg.pending.pop(fn_id)
            raise
        reg.unpickle_seconds = [r for r in replies if r is not None]
    for uid, var in new_shared.items():
        reg.shared[uid] = var
        reg.uid_of[id(var)] = uid
    session.ctx.placement.place(new_shared.values())
    if reg.fresh is not None:  # the master's set_value reaches them from now on
        reg.fresh.watch(new_shared.values(), session)
    reg.pending.clear()


def _load(ctx: RankContext, message: Distribute) -> tuple[dict[int, Any], float]:
    """Unpickle and register the functions of ``message`` in this process."""
    if faults.ARMED:
        faults.hit("unpickle")
    reg = REGISTRY.get(ctx)
    start = time.perf_counter()
    _, functions, new_shared = _deep(_ReferenceUnpickler(io.BytesIO(message.payload), reg).load)
    for uid, var in new_shared.items():
        reg.shared[uid] = var
    if message.independent_streams:
        reseed(new_shared.values(), ctx.rank)
    ctx.placement.place(new_shared.values())
    reg.functions.update(functions)
    return functions, time.perf_counter() - start


def receive(ctx: RankContext, message: Distribute) -> float | None:
    """Every rank: a worker unpickles and registers the functions; replies with the
    seconds it took (the master has them already)."""
    if ctx.is_master:
        return None
    reg = REGISTRY.get(ctx)
    if reg.prepared is message:  # another machine's leader did it before posting
        reg.prepared = None
        return reg.prepared_seconds
    return _load(ctx, message)[1]


def prepare(ctx: RankContext, message: Distribute) -> None:
    """Another machine's leader, before posting ``message`` to its workers: unpickle,
    register and compile the functions (the workers then load the compiled code from
    this machine's on-disk cache instead of each compiling it)."""
    reg = REGISTRY.get(ctx)
    reg.prepared = None
    functions, seconds = _load(ctx, message)
    start = time.perf_counter()
    for fn in functions.values():
        _pytensor.precompile(fn)
    reg.prepared = message
    reg.prepared_seconds = seconds + time.perf_counter() - start
