"""Data between the node leaders: objects, arrays and reductions, as collectives.

This module owns what travels between the machines and in which form; the waits it
ends in, the failures and the end of the job are ``leaders.py``'s. It is the base class
:class:`Exchange` of the leaders' communicator (:class:`~.leaders.Leaders`), written
against a small interface that the communicator provides (its MPI module, two of its
communicators, ``check_usable`` and ``wait``; see :class:`Exchange`). Every collective

1. checks that the leaders are usable (not closed, not broken),
2. posts nonblocking requests on the collectives' communicator (or, for the exact
   all-reduce's pieces, the point-to-point one),
3. waits for them with ``wait``, naming what it does and the buffers to keep alive
   should the wait fail.

Objects (a command, replies) travel pickled. A broadcast one goes in a fixed buffer of
``_INLINE`` bytes whose first 8 hold the pickle's length: a short command needs one
broadcast, a longer one a second for the rest. Arrays may differ in dtype, shape and
size between leaders: each is described by an int64 header (``_describe``: byte count,
shape, dtype code), the headers are exchanged first, then the bytes in one variable-count
collective, and the receivers view their part of one buffer with the sender's dtype and
shape.

Two modes of :meth:`Exchange.all_reduce`:

- ``"exact"``: the *chunk-owner scheme*. The elements are split into one chunk per
  leader (:func:`chunk_bounds`); leader ``j`` receives every machine's pieces of chunk
  ``j`` (point to point) and folds them in global rank order (``acc = p0; acc = op(acc,
  p1); ...``, with the ufuncs of ``_runtime/reducers.py``, as one machine's
  ``combine_into`` does), then an all-gather spreads the chunks. With every local
  process's piece passed (:meth:`Exchange.all_reduce_pieces`) the result is
  bit-identical to one machine folding all processes in rank order.
- ``"fast"``: the MPI library's ``Iallreduce`` below ``fast_chunked_from`` bytes (1 MiB;
  its summation order is the library's choice and differed from a rank-order fold by
  rounding at 4 ranks), the chunk-owner scheme from there on, where it was the faster
  of the two here.
"""

from __future__ import annotations

import abc
import functools
import pickle
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ..._runtime.reducers import ReduceOp, ufunc_of

__all__ = ["Exchange", "chunk_bounds"]

_INLINE = 1024  # bytes of a command that travel in the first broadcast (4 KiB was
# slower between two leaders on one host with Open MPI: 100-200 us vs 20-30 us a round)
_HEADER = 40  # int64 slots describing one array: nbytes, ndim, 32 dims, 6 for dtype
_MAX_NDIM = 32
_DTYPE_SLOTS = 6
_TAG_EXACT = 21  # exact all-reduce: pieces of a chunk sent to its owner
_OPS = ("sum", "prod", "max", "min")  # "avg" is the caller's sum, then divide


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` blocks of ``n`` items over ``parts``, the first ones longer.

    The same rule splits rows across processes (SPEC section 3).
    """
    base, extra = divmod(n, parts)
    bounds, lo = [], 0
    for part in range(parts):
        hi = lo + base + (1 if part < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _op_name(op: Any) -> str:
    name = str(getattr(op, "value", op)).lower()
    if name not in _OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, _OPS))} between machines "
                         f"('avg' is 'sum' divided by the caller); got {op!r}")
    return name


def _as_bytes(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array (zero copy)."""
    return array.reshape(-1).view(np.uint8)


def _describe(array: np.ndarray) -> np.ndarray:
    """The int64 header that lets a receiver rebuild ``array``'s dtype and shape."""
    header = np.zeros(_HEADER, np.int64)
    if array.ndim > _MAX_NDIM:
        raise ValueError(f"arrays sent between machines have at most {_MAX_NDIM} dimensions; "
                         f"got {array.ndim}")
    code = array.dtype.str.encode("ascii")
    if array.dtype.hasobject or len(code) > 8 * _DTYPE_SLOTS or array.dtype.fields:
        raise TypeError(f"arrays sent between machines need a plain numeric dtype; "
                        f"got {array.dtype}")
    header[0] = array.nbytes
    header[1] = array.ndim
    header[2:2 + array.ndim] = array.shape
    header[2 + _MAX_NDIM:] = np.frombuffer(code.ljust(8 * _DTYPE_SLOTS, b"\0"), np.int64)
    return header


def _dtype_shape(header: np.ndarray) -> tuple[np.dtype, tuple[int, ...]]:
    code = header[2 + _MAX_NDIM:].tobytes().rstrip(b"\0").decode("ascii")
    ndim = int(header[1])
    return np.dtype(code), tuple(int(d) for d in header[2:2 + ndim])


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` view exactly the same elements."""
    return (a.shape == b.shape and a.dtype == b.dtype and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _check_contiguous(array: np.ndarray, name: str) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array; got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (np.ascontiguousarray); it is not")


class Exchange(abc.ABC):
    """The collectives between leaders; :class:`~.leaders.Leaders` is the one subclass.

    Every leader calls each collective, in the same order. The collectives use the
    communicator through the interface below (attributes and two abstract methods),
    and through nothing else.

    Attributes
    ----------
    rank, size : int
        This leader's index (machine index; the master is 0) and the number of leaders.
    fast_chunked_from : int
        Bytes from which ``all_reduce(mode="fast")`` uses the chunk-owner scheme
        instead of the MPI library's all-reduce.
    MPI : module
        mpi4py's ``MPI`` module (datatypes, operations, ``IN_PLACE``).
    comm, p2p
        The communicators for the collectives and for the exact all-reduce's sends
        (duplicates of ``COMM_WORLD``: no other traffic mixes with theirs).
    """

    # ---- the interface the communicator provides -----------------------------------

    rank: int
    size: int
    fast_chunked_from: int
    MPI: Any
    comm: Any
    p2p: Any

    @abc.abstractmethod
    def check_usable(self) -> None:
        """Raise if no operation between machines is possible (closed, or broken)."""

    @abc.abstractmethod
    def wait(self, requests: list, what: str, *, timeout: float | None = None,
             spin: float | None = None, keep: Sequence[Any] = (),
             interruptible: bool = False) -> None:
        """Return once ``requests`` are complete; raise if they cannot be.

        ``what`` names the operation in errors; ``timeout`` and ``spin`` override the
        communicator's defaults; ``keep`` holds the buffers the requests use, kept
        alive if the wait fails (MPI may still write into them); ``interruptible``:
        a ``KeyboardInterrupt`` leaves the requests posted, for the caller to wait for
        them again later.
        """

    @functools.cached_property
    def _inline(self) -> np.ndarray:
        """The first broadcast of every command: its length, then its first bytes."""
        return np.zeros(_INLINE, np.uint8)

    # ---- objects -------------------------------------------------------------------

    def broadcast_object(self, obj: Any = None, *, timeout: float | None = None,
                         spin: float | None = None) -> Any:
        """The master's ``obj`` on every leader (pickled; e.g. a command).

        Collective over leaders: every leader calls it; only the master's ``obj`` is
        used. Short pickles travel in one broadcast, longer ones in two. ``spin``
        overrides the default for this wait (a leader idling between commands may
        prefer a short spin).
        """
        self.check_usable()
        inline = self._inline
        payload = b""
        master = self.rank == 0  # the root of both broadcasts
        if master:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            inline[:8] = np.frombuffer(np.int64(len(payload)).tobytes(), np.uint8)
            head = min(len(payload), _INLINE - 8)
            inline[8:8 + head] = np.frombuffer(payload, np.uint8, head)
        request = self.comm.Ibcast([inline, self.MPI.BYTE], 0)
        self.wait([request], "broadcasting a command to the machines", timeout=timeout,
                  spin=spin, keep=[inline])
        length = int(inline[:8].view(np.int64)[0])
        if length <= _INLINE - 8:
            data = inline[8:8 + length].tobytes()
            return obj if master else pickle.loads(data)
        rest = (np.frombuffer(payload, np.uint8)[_INLINE - 8:].copy() if master
                else np.empty(length - (_INLINE - 8), np.uint8))
        request = self.comm.Ibcast([rest, self.MPI.BYTE], 0)
        self.wait([request], "broadcasting a long command to the machines",
                  timeout=timeout, keep=[rest])
        if master:
            return obj
        return pickle.loads(inline[8:].tobytes() + rest.tobytes())

    def gather_objects(self, obj: Any, *, timeout: float | None = None) -> list | None:
        """Every leader's ``obj`` (pickled) in a list on the master; None elsewhere.

        Collective over leaders (e.g. replies to a command).
        """
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        parts = self.gather(data, timeout=timeout)
        if parts is None:
            return None
        return [pickle.loads(part.tobytes()) for part in parts]

    def all_gather_fixed(self, record: np.ndarray, *,
                         timeout: float | None = None) -> np.ndarray:
        """Every leader's ``record`` on every leader, stacked by leader rank, in one
        collective (no header exchange: every leader passes the same dtype and shape).
        """
        request, every = self.post_all_gather_fixed(record)
        self.wait([request], "exchanging status between machines", timeout=timeout,
                  keep=[record, every])
        return every

    def post_all_gather_fixed(self, record: np.ndarray) -> tuple[Any, np.ndarray]:
        """``all_gather_fixed`` posted and not waited for: ``(request, every)``. The
        caller waits for ``request`` (``wait``), perhaps in several tries
        (``interruptible``), and leaves ``record`` unchanged until it is complete."""
        self.check_usable()
        _check_contiguous(record, "record")
        every = np.empty((self.size,) + record.shape, record.dtype)
        return self.comm.Iallgather(record, every), every

    def all_gather_objects(self, obj: Any, *, timeout: float | None = None) -> list:
        """Every leader's ``obj`` (pickled) in a list on every leader. Collective."""
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        return [pickle.loads(part.tobytes()) for part in self.all_gather(data, timeout=timeout)]

    # ---- arrays --------------------------------------------------------------------

    def broadcast(self, buffer: np.ndarray, *, root: int = 0,
                  timeout: float | None = None) -> np.ndarray:
        """Overwrite ``buffer`` on every leader with ``root``'s, in place. Collective.

        Every leader passes a C-contiguous array of the same number of bytes.
        """
        self.check_usable()
        _check_contiguous(buffer, "buffer")
        request = self.comm.Ibcast([_as_bytes(buffer), self.MPI.BYTE], root)
        self.wait([request], f"broadcasting {buffer.nbytes} bytes from machine {root}",
                  timeout=timeout, keep=[buffer])
        return buffer

    def _headers(self, array: np.ndarray, root: int | None, what: str,
                 timeout: float | None) -> np.ndarray | None:
        """Every leader's array header, on ``root`` (None: on every leader)."""
        mine = _describe(array)
        every = np.empty((self.size, _HEADER), np.int64)
        if root is None:
            request = self.comm.Iallgather(mine, every)
        else:
            request = self.comm.Igather(mine, every if self.rank == root else None, root)
        self.wait([request], what, timeout=timeout, keep=[mine, every])
        return every if root is None or self.rank == root else None

    def _split(self, headers: np.ndarray, flat: np.ndarray) -> list[np.ndarray]:
        parts, start = [], 0
        for header in headers:
            dtype, shape = _dtype_shape(header)
            stop = start + int(header[0])
            parts.append(flat[start:stop].view(dtype).reshape(shape))
            start = stop
        return parts

    def gather(self, array: np.ndarray, *, root: int = 0,
               timeout: float | None = None) -> list[np.ndarray] | None:
        """Every leader's array, on ``root``: a list indexed by leader rank.

        Collective. Arrays may differ in dtype, shape and size; each comes back with
        its own (as views of one received buffer). Other leaders get None.
        """
        self.check_usable()
        array = np.ascontiguousarray(array)
        what = f"gathering arrays on machine {root}"
        headers = self._headers(array, root, what, timeout)
        flat = counts = None
        if headers is not None:
            counts = headers[:, 0].astype(np.int64)
            flat = np.empty(int(counts.sum()), np.uint8)
            displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
            receive = [flat, (counts, displacements), self.MPI.BYTE]
        else:
            receive = None
        request = self.comm.Igatherv([_as_bytes(array), self.MPI.BYTE], receive, root)
        self.wait([request], what, timeout=timeout, keep=[array, flat, counts])
        if headers is None or flat is None:
            return None
        return self._split(headers, flat)

    def all_gather(self, array: np.ndarray, *,
                   timeout: float | None = None) -> list[np.ndarray]:
        """Every leader's array on every leader: a list indexed by leader rank.

        Collective. Arrays may differ in dtype, shape and size.
        """
        self.check_usable()
        array = np.ascontiguousarray(array)
        what = "all-gathering arrays between machines"
        headers = self._headers(array, None, what, timeout)
        assert headers is not None
        counts = headers[:, 0].astype(np.int64)
        flat = np.empty(int(counts.sum()), np.uint8)
        displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
        request = self.comm.Iallgatherv([_as_bytes(array), self.MPI.BYTE],
                                         [flat, (counts, displacements), self.MPI.BYTE])
        self.wait([request], what, timeout=timeout, keep=[array, flat, counts])
        return self._split(headers, flat)

    def scatter(self, arrays: Sequence[np.ndarray] | None, *, root: int = 0,
                timeout: float | None = None) -> np.ndarray:
        """``root``'s ``arrays[m]`` on leader ``m``. Collective.

        ``root`` passes one array per leader (they may differ in dtype, shape, size:
        e.g. each machine's rows of an input); the others pass None.
        """
        self.check_usable()
        what = f"scattering arrays from machine {root}"
        if self.rank == root:
            if arrays is None or len(arrays) != self.size:
                got = "None" if arrays is None else f"{len(arrays)}"
                raise ValueError(f"scatter needs one array per machine ({self.size}) on "
                                 f"the root; got {got}")
            arrays = [np.ascontiguousarray(a) for a in arrays]
            headers = np.stack([_describe(a) for a in arrays])
            flat = (np.concatenate([_as_bytes(a) for a in arrays]) if arrays
                    else np.empty(0, np.uint8))
        else:
            headers, flat = None, None
        mine = np.empty(_HEADER, np.int64)
        request = self.comm.Iscatter(headers, mine, root)
        self.wait([request], what, timeout=timeout, keep=[headers, mine])
        dtype, shape = _dtype_shape(mine)
        out = np.empty(shape, dtype)
        if self.rank == root:
            assert headers is not None
            counts = headers[:, 0].astype(np.int64)
            displacements = np.concatenate(([0], np.cumsum(counts)[:-1]))
            send = [flat, (counts, displacements), self.MPI.BYTE]
        else:
            send, counts = None, None
        request = self.comm.Iscatterv(send, [_as_bytes(out), self.MPI.BYTE], root)
        self.wait([request], what, timeout=timeout, keep=[flat, out, counts])
        return out

    def barrier(self, *, timeout: float | None = None) -> None:
        """Return when every leader has called it. Collective."""
        self.check_usable()
        self.wait([self.comm.Ibarrier()], "a barrier between machines", timeout=timeout)

    # ---- reductions ----------------------------------------------------------------

    def all_reduce(self, buffer: np.ndarray, op: Any = "sum", *,
                   mode: Literal["fast", "exact"] = "fast",
                   timeout: float | None = None) -> np.ndarray:
        """Reduce ``buffer`` elementwise across machines, in place on every leader.

        Collective. ``op`` is ``"sum"``, ``"prod"``, ``"max"`` or ``"min"`` (or an
        enum whose value is one of these); ``"avg"`` is the caller's sum then divide.
        ``mode="exact"`` folds the machines' buffers in rank order with the
        chunk-owner scheme (bit-identical wherever it runs). ``mode="fast"`` uses the
        MPI library's all-reduce below ``fast_chunked_from`` bytes and the chunk-owner
        scheme from there on: the MPI libraries' nonblocking all-reduce was the slower
        of the two on large buffers here (64 MiB between 2 ranks: Open MPI 5's
        ``Iallreduce`` 270-360 ms, the chunk-owner scheme 80-100 ms; MPICH 5 97 vs 82
        ms). A dtype MPI cannot reduce (float16, bool, non-native byte order, complex
        max/min) takes the chunk-owner scheme in both modes.

        Returns
        -------
        np.ndarray
            ``buffer``, now holding the result.
        """
        name = _op_name(op)
        if mode not in ("fast", "exact"):
            raise ValueError(f"mode must be 'fast' or 'exact'; got {mode!r}")
        self.check_usable()
        _check_contiguous(buffer, "buffer")
        if (mode == "exact" or buffer.nbytes >= self.fast_chunked_from
                or not self._mpi_can_reduce(buffer.dtype, name)):
            return self.all_reduce_pieces(buffer.reshape((1,) + buffer.shape), name,
                                          out=buffer, counts=(1,) * self.size,
                                          timeout=timeout)
        MPI = self.MPI
        mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[name]
        flat = buffer.reshape(-1)
        request = self.comm.Iallreduce(MPI.IN_PLACE, flat, mpi_op)
        self.wait([request], f"all-reducing {buffer.nbytes} bytes ({name}) between machines",
                  timeout=timeout, keep=[buffer])
        return buffer

    def _mpi_can_reduce(self, dtype: np.dtype, name: str) -> bool:
        if not dtype.isnative or dtype.kind not in "iufc":
            return False
        if dtype.kind == "c" and name in ("max", "min"):
            return False
        if dtype == np.float16:
            return False
        try:
            self.MPI.Datatype.fromcode(dtype.char)
        except (KeyError, ValueError):
            return False
        return True

    def all_reduce_pieces(self, pieces: np.ndarray, op: Any = "sum", *,
                          out: np.ndarray | None = None,
                          counts: Sequence[int] | None = None,
                          timeout: float | None = None) -> np.ndarray:
        """Fold every machine's pieces elementwise in global order; result everywhere.

        Collective. ``pieces`` has shape ``(k, *shape)``: this machine's ``k`` values in
        its local rank order (``k`` may differ between machines, even be 0 on some).
        Every leader gets ``op`` folded over machine 0's pieces, then machine 1's, and
        so on, left to right: with each local process's value as a piece this is
        bit-identical to one machine folding all processes in rank order. A machine
        may pass its first pieces pre-folded only if it is machine 0 (a prefix of the
        fold). Traffic grows with ``k``: each piece crosses the network once.

        Parameters
        ----------
        pieces : np.ndarray
            Shape ``(k, *shape)``, the same ``shape`` and dtype on every machine.
        op : str or enum
            ``"sum"``, ``"prod"``, ``"max"`` or ``"min"``.
        out : np.ndarray, optional
            C-contiguous, ``shape`` and dtype of a piece; may be ``pieces[0]``.
            Allocated if None.
        counts : sequence of int, optional
            Every machine's ``k``, when the caller knows them (e.g.
            ``leaders.local_sizes``): saves one exchange. Wrong counts hang or
            corrupt the result; left out, the leaders exchange them (and check that
            every machine has the same number of elements).

        Returns
        -------
        np.ndarray
            ``out``.
        """
        name = _op_name(op)
        self.check_usable()
        pieces = np.asarray(pieces)
        if pieces.ndim < 1:
            raise ValueError("pieces must have a leading axis of pieces; got a 0-d array")
        shape = pieces.shape[1:]
        if out is None:
            out = np.empty(shape, pieces.dtype)
        _check_contiguous(out, "out")
        if out.shape != shape or out.dtype != pieces.dtype:
            raise ValueError(f"out must have one piece's shape {shape} and dtype "
                             f"{pieces.dtype}; got {out.shape} and {out.dtype}")
        MPI = self.MPI
        what = f"exact all-reduce ({name}) of {out.nbytes} bytes between machines"
        n = int(np.prod(shape, dtype=np.int64))
        flat = pieces.reshape(pieces.shape[0], n)
        # out may be this machine's first piece (in place): then that piece is folded
        # straight into it, and no other piece may overlap it
        in_place = bool(flat.shape[0]) and np.may_share_memory(out, pieces)
        if in_place and not (_same_memory(out.reshape(-1), flat[0])
                             and not np.may_share_memory(out, pieces[1:])):
            raise ValueError("out may be pieces[0] itself but must not overlap any other "
                             "piece")
        if counts is None:
            # each machine's piece count, and a check that every machine has the same n
            mine = np.array([flat.shape[0], n], np.int64)
            every = np.empty((self.size, 2), np.int64)
            self.wait([self.comm.Iallgather(mine, every)], what, timeout=timeout,
                      keep=[mine, every])
            if (every[:, 1] != n).any():
                raise ValueError(f"exact all-reduce needs the same number of elements on "
                                 f"every machine; got {every[:, 1].tolist()}")
        else:
            if len(counts) != self.size or counts[self.rank] != flat.shape[0]:
                raise ValueError(f"counts must give every machine's piece count "
                                 f"({self.size} values, this machine's {flat.shape[0]}); "
                                 f"got {list(counts)}")
            every = np.array([[k, n] for k in counts], np.int64)
        bounds = chunk_bounds(n, self.size)
        lo, hi = bounds[self.rank]
        sends, sent = [], []
        for dest, (dlo, dhi) in enumerate(bounds):
            if dest != self.rank and flat.shape[0] and dhi > dlo:
                block = np.ascontiguousarray(flat[:, dlo:dhi])
                sent.append(block)
                sends.append(self.p2p.Isend(block, dest, _TAG_EXACT))
        received: dict[int, np.ndarray] = {}
        receives: dict[int, Any] = {}
        for source in range(self.size):
            k = int(every[source, 0])
            if source != self.rank and k and hi > lo:
                received[source] = np.empty((k, hi - lo), flat.dtype)
                receives[source] = self.p2p.Irecv(received[source], source, _TAG_EXACT)
        keep = [flat, sent, received]
        ufunc = ufunc_of(ReduceOp(name))[0]
        mine = out.reshape(-1)[lo:hi]  # where this leader's chunk of the result goes
        acc = None  # the running fold: a received buffer (ours to change), or mine
        for source in range(self.size):
            if source == self.rank:
                block = flat[:, lo:hi]
            elif source in receives:
                self.wait([receives[source]], what, timeout=timeout, keep=keep)
                block = received[source]
            else:
                continue
            for index, piece in enumerate(block):
                own_first = source == self.rank and index == 0 and in_place
                if acc is None:
                    acc = mine if own_first else (piece if source != self.rank else None)
                    if acc is None:
                        acc = mine
                        np.copyto(mine, piece)
                elif own_first:
                    ufunc(acc, piece, out=mine)  # piece is mine: same elements, safe
                    acc = mine
                else:
                    ufunc(acc, piece, out=acc)
        if acc is None and hi > lo:
            raise ValueError("exact all-reduce needs at least one piece on some machine; "
                             "every machine passed 0")
        if acc is not None and acc is not mine:
            np.copyto(mine, acc)
        self.wait(sends, what, timeout=timeout, keep=keep)
        target = _as_bytes(out)
        item = out.dtype.itemsize
        byte_counts = np.array([(b - a) * item for a, b in bounds], np.int64)
        displacements = np.array([a * item for a, _ in bounds], np.int64)
        request = self.comm.Iallgatherv(MPI.IN_PLACE,
                                         [target, (byte_counts, displacements), MPI.BYTE])
        self.wait([request], what, timeout=timeout, keep=[out, byte_counts, displacements])
        return out
