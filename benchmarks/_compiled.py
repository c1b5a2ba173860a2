"""Compiled peers for the small-work benchmarks: what a command path compiled by Numba
could cost, measured beside synkhronos's own (which is Python).

- ``spin_pair``: a flag in shared memory and back between two spinning processes,
  the least any round trip can cost (``command_roundtrip.py``);
- ``lane``: a tiny call's round with the graph run inside compiled code on both sides
  (the master posts, runs its rows, waits and adds the other process's output; the
  other process waits, runs its rows, writes its output and flags it), the least a
  repeated tiny call could cost if the whole command path were compiled
  (``call_overhead.py``).

Neither is the library. Flags are read and written as atomics (acquire, release): a
plain load in a compiled loop may be hoisted out of it, and the loop would never see
the other process. Everything is compiled before any fork, so no child compiles.
Every builder returns None where Numba does not import.
"""

from __future__ import annotations

import functools
import mmap
import os
import time
from typing import Any

import numpy as np

__all__ = ["spin_pair", "lane", "run_pair"]


@functools.cache
def _atomics() -> tuple[Any, Any] | None:
    """``(load_acquire(array, index), store_release(array, index, value))`` on int64
    arrays, as Numba intrinsics; None without Numba."""
    try:
        import numba
        from numba.core import cgutils
        from numba.extending import intrinsic
    except ImportError:
        return None

    def pointer(context, builder, signature, args):
        items = context.make_array(signature.args[0])(context, builder, args[0])
        return cgutils.get_item_pointer(context, builder, signature.args[0], items,
                                        [args[1]])

    @intrinsic
    def load_acquire(typingctx, array, index):  # pragma: no cover (compiled)
        def codegen(context, builder, signature, args):
            return builder.load_atomic(pointer(context, builder, signature, args),
                                       "acquire", 8)

        return numba.types.int64(array, index), codegen

    @intrinsic
    def store_release(typingctx, array, index, value):  # pragma: no cover (compiled)
        def codegen(context, builder, signature, args):
            builder.store_atomic(args[2], pointer(context, builder, signature, args),
                                 "release", 8)
            return context.get_dummy_value()

        return numba.types.void(array, index, value), codegen

    return load_acquire, store_release


@functools.cache
def spin_pair() -> tuple[Any, Any] | None:
    """``(post(flags, k), serve(flags, total))`` compiled: ``post`` sets word 0 to ``k``
    and spins until word 8 says ``k``; ``serve`` answers ``k = 1 .. total``."""
    atomics = _atomics()
    if atomics is None:
        return None
    import numba

    load_acquire, store_release = atomics

    @numba.njit
    def post(flags, k):  # pragma: no cover (compiled)
        store_release(flags, 0, k)
        while load_acquire(flags, 8) != k:
            pass

    @numba.njit
    def serve(flags, total):  # pragma: no cover (compiled)
        for k in range(1, total + 1):
            while load_acquire(flags, 0) != k:
                pass
            store_release(flags, 8, k)

    scratch = np.zeros(16, dtype=np.int64)
    scratch[8] = 1
    post(scratch, 1)  # compiled now
    serve(np.zeros(16, dtype=np.int64), 0)
    return post, serve


def lane(graph: Any, mine: np.ndarray, theirs: np.ndarray) -> tuple[Any, Any] | None:
    """``(call(flags, reply, rows, k), serve(flags, reply, rows, total))`` compiled around
    ``graph``, a Numba-compiled PyTensor graph (``pytensor.function(...).vm.jit_fn`` on
    PyTensor's Numba backend) whose first output is a float64 vector summed over the
    processes; ``mine`` and ``theirs`` are each side's rows, to compile for. None
    without Numba."""
    atomics = _atomics()
    if atomics is None:
        return None
    import numba

    load_acquire, store_release = atomics

    @numba.njit
    def call(flags, reply, rows, k):  # pragma: no cover (compiled)
        store_release(flags, 0, k)
        own = graph(rows)[0]
        while load_acquire(flags, 8) != k:
            pass
        return own + reply

    @numba.njit
    def serve(flags, reply, rows, total):  # pragma: no cover (compiled)
        for k in range(1, total + 1):
            while load_acquire(flags, 0) != k:
                pass
            reply[:] = graph(rows)[0]
            store_release(flags, 8, k)

    scratch = np.zeros(16, dtype=np.int64)
    scratch[8] = 1
    width = len(graph(mine)[0])
    call(scratch, np.zeros(width), mine, 1)  # compiled now
    serve(np.zeros(16, dtype=np.int64), np.zeros(width), theirs, 0)
    return call, serve


def run_pair(post: Any, serve: Any, rounds: int, warmup: int, width: int = 0,
             mine: Any = None, theirs: Any = None, between: Any = None
             ) -> tuple[list[float], Any]:
    """Time ``rounds`` round trips of a pair (``spin_pair``'s, ``lane``'s with ``width``
    floats of reply and each side's rows, or any two such functions): a child runs
    ``serve`` for
    every round; the master times each ``post``. ``between()``, if given, runs after
    each timed round (a peer timed in turn). Returns the seconds and the last result."""
    memory = mmap.mmap(-1, mmap.PAGESIZE)
    flags = np.frombuffer(memory, dtype=np.int64, count=16)
    reply = np.frombuffer(memory, dtype=np.float64, count=width, offset=256)
    extra = (reply, theirs) if mine is not None else ()
    total = rounds + warmup
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            serve(flags, *extra, total)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    mine_args = (reply, mine) if mine is not None else ()
    result = None
    try:
        for k in range(1, warmup + 1):
            post(flags, *mine_args, k)
        clock = time.perf_counter
        times = []
        for k in range(warmup + 1, total + 1):
            start = clock()
            result = post(flags, *mine_args, k)
            times.append(clock() - start)
            if between is not None:
                between()
    finally:
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"the peer's child failed (wait status {status})")
    return times, result
