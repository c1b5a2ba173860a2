"""NCCL on device arrays: the one place synkhronos calls NCCL (through CuPy).

A ``Communicator`` joins the processes of a ``device="gpu"`` session when each has a
GPU of its own (NCCL refuses two ranks on one device). NCCL's set-up is collective:

1. the master makes a unique id (``unique_id``: 128 bytes, no CUDA context needed);
2. the id travels to every process inside one command, and every process builds its
   ``Communicator(size, rank, uid)`` in that same command;
3. each collective then runs on every process at once, inside one command.

The values are JAX arrays on the process's GPU. They are shared with CuPy through
DLPack (no host copy), copied into one fused device buffer per dtype, reduced or
broadcast in place there by NCCL, and handed back as new JAX arrays viewing pieces of
that buffer (JAX arrays never change in place, and the buffer is not used again).
JAX computes on its own stream and NCCL on CuPy's: the inputs are waited for before
NCCL starts, and NCCL's stream is synchronised before JAX may read the results.

``"avg"`` is NCCL's sum divided by the number of processes on the device (NCCL's own
average exists from 2.10 only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Communicator", "unique_id", "available", "supports"]

_OPS = {"sum": "NCCL_SUM", "avg": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX",
        "min": "NCCL_MIN"}
_DTYPES = {
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
}


def _nccl() -> Any:
    from cupy.cuda import nccl

    return nccl


def available() -> str | None:
    """None if NCCL can run in this process, else why not (CUDA is not initialised:
    only whether CuPy and its NCCL module import)."""
    try:
        _nccl()
    except Exception as exc:  # ImportError, or CuPy built without NCCL
        return f"NCCL through CuPy is not available: {exc}"
    return None


def supports(dtype: Any) -> bool:
    """Whether NCCL reduces and broadcasts arrays of ``dtype``."""
    return np.dtype(dtype).name in _DTYPES


def unique_id() -> tuple[int, ...]:
    """A new communicator's id, made by the master and sent to every process: 128
    integers (CuPy 14 makes the id as ``bytes``, earlier versions as a tuple of signed
    chars; a tuple of ints pickles and prints as JSON either way)."""
    return tuple(_nccl().get_unique_id())


def _communicator(nccl: Any, size: int, uid: Sequence[int], rank: int) -> Any:
    """CuPy's ``NcclCommunicator``, given the id in the form this CuPy takes."""
    try:
        return nccl.NcclCommunicator(size, tuple(uid), rank)
    except TypeError:  # CuPy 14 takes bytes ("expected bytes, got tuple")
        return nccl.NcclCommunicator(size, bytes(v & 0xFF for v in uid), rank)


class Communicator:
    """This process's place in an NCCL communicator (see the module docstring).

    Parameters
    ----------
    size, rank
        Processes in the session, and this one's rank.
    uid
        ``unique_id()``, made once by the master.
    """

    def __init__(self, size: int, rank: int, uid: Sequence[int]) -> None:
        import cupy

        self._cupy = cupy
        self._nccl = _nccl()
        self.size, self.rank = size, rank
        self._comm = _communicator(self._nccl, size, uid, rank)

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()

    # -- fused buffers ---------------------------------------------------------------------
    def _fuse(self, arrays: Sequence[Any]) -> list[tuple[Any, list[int]]]:
        """One device buffer per dtype holding those arrays' elements, with the
        indices of the arrays it holds."""
        import jax

        jax.block_until_ready(list(arrays))  # JAX's stream has written them
        cupy = self._cupy
        by_dtype: dict[str, list[int]] = {}
        for i, array in enumerate(arrays):
            by_dtype.setdefault(np.dtype(array.dtype).name, []).append(i)
        fused = []
        for name, indices in by_dtype.items():
            if name not in _DTYPES:
                raise TypeError(f"NCCL has no dtype {name}")
            parts = [cupy.from_dlpack(arrays[i]).ravel() for i in indices]
            fused.append((cupy.concatenate(parts), indices))
        return fused

    def _split(self, arrays: Sequence[Any], fused: list[tuple[Any, list[int]]]) -> list[Any]:
        """New JAX arrays viewing ``fused``, shaped as ``arrays``."""
        import jax.dlpack

        self._cupy.cuda.get_current_stream().synchronize()  # NCCL finished writing
        results: list[Any] = [None] * len(arrays)
        for buffer, indices in fused:
            start = 0
            for i in indices:
                size = int(np.prod(arrays[i].shape, dtype=np.int64))
                piece = buffer[start:start + size].reshape(arrays[i].shape)
                results[i] = jax.dlpack.from_dlpack(piece)
                start += size
        return results

    def _args(self, buffer: Any) -> tuple[int, int, int, int]:
        dtype = getattr(self._nccl, _DTYPES[buffer.dtype.name])
        stream = self._cupy.cuda.get_current_stream().ptr
        return buffer.data.ptr, buffer.size, dtype, stream

    # -- collectives ----------------------------------------------------------------------
    def all_reduce(self, arrays: Sequence[Any], op: str) -> list[Any]:
        """Every process's ``arrays`` combined by ``op`` (``"avg"``, ``"sum"``,
        ``"prod"``, ``"max"``, ``"min"``); the results, as new JAX arrays."""
        if op not in _OPS:
            raise ValueError(f"op must be one of {', '.join(_OPS)}; got {op!r}")
        if op == "avg":  # the sum is divided in place, in the buffer's own dtype
            for array in arrays:
                if np.dtype(array.dtype).kind not in "fc":
                    raise TypeError(f"'avg' needs floating-point values; got {array.dtype}")
        code = getattr(self._nccl, _OPS[op])
        fused = self._fuse(arrays)
        for buffer, _ in fused:
            ptr, count, dtype, stream = self._args(buffer)
            self._comm.allReduce(ptr, ptr, count, dtype, code, stream)
            if op == "avg":
                buffer /= self.size
        return self._split(arrays, fused)

    def broadcast(self, arrays: Sequence[Any], root: int) -> list[Any]:
        """``root``'s ``arrays`` in every process (the others' give the shapes)."""
        fused = self._fuse(arrays)
        for buffer, _ in fused:
            ptr, count, dtype, stream = self._args(buffer)
            self._comm.bcast(ptr, count, dtype, root, stream)
        return self._split(arrays, fused)
