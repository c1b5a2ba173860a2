"""Each process's compute threads: BLAS, OpenMP and Numba held to one thread.

One process per core only pays off if each process computes on one thread: a BLAS
pool per process would oversubscribe the cores many times over. Environment variables
are read when a library loads, which in a forked worker happened before the fork, so
the pools already loaded are limited here, after it (``fork()`` runs this in every
process): BLAS/OpenMP through ``threadpoolctl``, Numba through its own switch.

It lives outside ``_runtime`` because it reaches into third-party libraries (the
runtime is the standard library, numpy and posix_ipc only).
"""

from __future__ import annotations

import logging
from typing import Any

from ._runtime import signals

__all__ = ["ThreadLimit", "limit_threads"]

log = logging.getLogger("synkhronos")


class ThreadLimit:
    """This process's BLAS/OpenMP pools and Numba's threading layer held to one thread.

    BLAS/OpenMP through threadpoolctl. Numba launches its thread pool lazily, at the
    first parallel kernel (PyTensor's Numba backend compiles none by default): if it
    has not launched, the pool it will launch is made one thread (its module-level
    count); if it has, ``numba.set_num_threads(1)`` masks the others. ``restore``
    puts back what can be put back (the BLAS limits; Numba's count if its pool still
    has not launched).
    """

    def __init__(self) -> None:
        self._blas: Any = None
        self._numba_count: int | None = None
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - a declared dependency
            pass
        else:
            self._blas = signals.blocked(lambda: threadpool_limits(limits=1))
        self._limit_numba()

    def _limit_numba(self) -> None:
        try:
            import numba
            from numba.np.ufunc import parallel
        except ImportError:  # numba is PyTensor's, but not ours to require
            return
        try:
            if getattr(parallel, "_is_initialized", False):
                numba.set_num_threads(1)
            elif isinstance(getattr(parallel, "NUM_THREADS", None), int):
                self._numba_count = parallel.NUM_THREADS
                parallel.NUM_THREADS = 1
        except Exception as exc:  # pragma: no cover - a Numba without these internals
            log.debug("could not limit Numba's threads: %s", exc)

    def restore(self) -> None:
        if self._blas is not None:
            signals.blocked(self._blas.restore_original_limits)
        if self._numba_count is not None:
            from numba.np.ufunc import parallel

            if not parallel._is_initialized:
                parallel.NUM_THREADS = self._numba_count
            self._numba_count = None


def limit_threads() -> ThreadLimit:
    """Limit BLAS/OpenMP pools and Numba's threads in this process to one thread."""
    return ThreadLimit()
