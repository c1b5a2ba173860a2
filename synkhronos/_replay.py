"""Replay: a call run again from what its first run kept, nothing checked or built again.

The general path of a call (``Function.prepare``: bind, validate, stage, build the
message; then the command) ends by keeping a ``Record`` of it (``keep``), under its
key (``_call.repeat_key``: the same ``Data``, or arrays of the same dtype and shape,
nothing else asked) in its variant's ``PreparedCall.records``: the ``Call`` message,
the staging buffers its numpy arguments were copied into (``_staging.py``) and the
ops that reduce its replies. A record holds the epoch it was made under
(``_runtime/epoch.py``); while the epoch stands nothing it relies on has moved, and a
call with its key replays it (``Function.replay`` -> ``run``): the arrays copied where
the first call's went, the kept message posted again. A stale record is never
repaired: the call takes the general path, which keeps a new one.

One record, three ways to find it:

- ``Function.__call__``: a plain call looks its key up in its variant's records;
- ``Bound``: calls whose first arguments are always the same ``Data`` (the rows of
  ``synkhronos.pymc``'s likelihood) hold the record of their last call, and check only
  the epoch and their arrays' dtypes and shapes; with one process in all they then
  call the compiled function on the rows where they are, with no command
  (``_Direct``);
- with one process in all (CPU cores or a GPU) a record of big numpy arguments is run
  on the caller's arrays where they are (nobody else reads a copy:
  ``_shard.on_arrays``, the master's share of the command).

The workers keep their side of a repeated command the same way, under their own
process's epoch: a kept plan (``_shard.py``) and the lanes of a command posted again
(``Executor.lanes``).

``SYNK_REPLAY=0`` in the environment (``epoch.REPLAY``, read at import) keeps nothing:
every call, step and collective takes the general path, on every process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from . import _shard
from ._call import Call, PreparedCall, combine, repeat_key
from ._core.session import Session
from ._reducers import Accumulator, ReduceOp
from ._runtime import epoch
from ._scatter import split_bounds
from ._staging import Buffer

__all__ = ["Record", "Bound", "keep", "run"]

_KEPT = 16  # records kept per variant (train, validate, ... on the same function)
# One process in all: numpy inputs of at least this many bytes are read in place rather
# than copied (below it the copy costs less than arranging to skip it, about 2 us here)
_IN_PLACE_BYTES = 32 << 10


class Replays(Protocol):
    """What ``Bound`` asks of the function it binds (``function.Function``)."""

    @property
    def session(self) -> Session: ...

    def __call__(self, *args: Any, num_slices: int = 1) -> Any: ...

    def record(self, key: tuple, num_slices: int = 1) -> Record | None: ...

    def replay(self, record: Record, args: tuple) -> Any: ...

    def as_returned(self, results: list) -> Any: ...

    def direct_call(self) -> Callable[..., list] | None: ...

    @property
    def inputs(self) -> list: ...

    @property
    def bcast_inputs(self) -> list: ...


@dataclass(eq=False)
class Record:
    """What a call's general path kept for the calls that repeat it."""

    call: Call  # its message (registered: without the static part)
    ops: tuple[ReduceOp, ...]  # its outputs' reductions
    positions: tuple[int, ...]  # the positions of its numpy arguments
    buffers: tuple[Buffer, ...]  # where each is copied (the variant's staging)
    shapes: tuple[tuple[int, ...], ...]  # viewed with each argument's shape
    in_place: bool  # one process in all: try the caller's arrays where they are
    rows: tuple | None  # several machines: the rows each takes of each (or None: all)
    epoch: int  # valid while ``epoch.current`` is this


def slot_of(num_slices: int, chunks: int | None) -> Any:
    """The first half of a record's key: ``num_slices``, or with rows in chunks
    ``(num_slices, chunks)`` (a chunked call is kept apart from the same call on
    blocks: its message differs)."""
    return (num_slices, chunks) if chunks else num_slices


def keep(prepared: PreparedCall, key: tuple, call: Call) -> None:
    """After a plain call ran (the caller holds the session): keep its record."""
    if not epoch.REPLAY:
        return
    records = prepared.records
    if len(records) >= _KEPT:
        records.clear()
    if call.prepared is not None:  # it has been registered by running
        call = replace(call, prepared=None)
    positions = tuple(i for i, item in enumerate(key) if item[0] is None)
    refs = call.scattered + call.bcast
    found = prepared.staging.destinations(refs, positions)
    if found is None:  # (staged as a later call of its command: not where it reads)
        return
    in_place = (prepared.reads_in_place and call.num_slices == 1 and not call.timings
                and not call.chunks) and (
        sum(np.dtype(refs[i].dtype).itemsize * int(np.prod(refs[i].shape))
            for i in positions) >= _IN_PLACE_BYTES)
    buffers, rows = found
    records[(slot_of(call.num_slices, call.chunks), key)] = Record(
        call, prepared.prepared.output_ops, positions, buffers,
        tuple(refs[i].shape for i in positions), in_place, rows, epoch.current)


def run(session: Session, record: Record, args: tuple) -> list:
    """The replies of ``record``'s call run again on ``args`` (their numpy arrays at
    ``record.positions``, of the dtypes and shapes it had). The caller holds the
    session and has checked that the record is current."""
    call = record.call
    if record.in_place:
        handler = _shard.on_arrays(session.ctx, call, record.positions, args)
        if handler is not None:
            return session.run_held(call, True, handler)
    buffers, shapes = record.buffers, record.shapes
    i = 0
    for position in record.positions:
        # setitem casts as copyto(casting="unsafe"), at a third of its cost
        buffers[i].view(shapes[i])[...] = args[position]
        i += 1
    if record.rows is not None:  # several machines: the values to every replica
        for buffer, shape, rows in zip(buffers, shapes, record.rows, strict=True):
            buffer.publish(buffer.view(shape), rows)
    return session.run_held(call, repeats=True)


class Bound:
    """Calls of a ``Function`` whose first arguments are always the same ``Data`` and
    whose others are numpy arrays of one dtype and shape call after call: the rows and
    the point of ``synkhronos.pymc``'s likelihood, tens of thousands of calls a
    sampling (``Function.bind``), at any number of processes.

    Once a call has kept its record, the next checks only that the epoch stands and
    that its arrays have the dtypes and shapes they had, then replays it, without the
    repeat key and its lookup; with one process in all, without a command either
    (``_Direct``). Anything else runs as ``fn(*fixed, *arrays, num_slices=...)``, and
    its record is taken anew.
    """

    def __init__(self, fn: Replays, fixed: tuple, num_slices: int):
        self._fn = fn
        self._fixed = fixed
        self._num_slices = num_slices
        self._record: Record | None = None
        self._direct: _Direct | None = None  # one process in all: the record run in place
        self._kinds: tuple = ()  # the arrays' (shape, dtype), as the record had them

    def __call__(self, *arrays: Any) -> Any:
        fn = self._fn
        record = self._record
        if record is not None:
            session = fn.session
            took = session.enter()
            try:
                if record.epoch == epoch.current and len(arrays) == len(self._kinds):
                    i = 0
                    for array in arrays:
                        shape, dtype = self._kinds[i]
                        if type(array) is not np.ndarray or array.shape != shape or (
                                array.dtype is not dtype and array.dtype != dtype):
                            break
                        i += 1
                    else:
                        direct = self._direct
                        if direct is not None and session.instrument is None:
                            results = direct(arrays)
                            if results is not None:
                                return fn.as_returned(results)
                        return fn.replay(record, self._fixed + arrays)
            finally:
                session.leave(took)
        result = fn(*self._fixed, *arrays, num_slices=self._num_slices)
        self._keep(arrays)
        return result

    def _keep(self, arrays: tuple) -> None:
        """After a call through ``Function.__call__``: hold its record, if it kept one
        whose numpy arguments are exactly the arrays."""
        self._record = self._direct = None
        key = repeat_key((*self._fixed, *arrays))
        record = None if key is None else self._fn.record(key, self._num_slices)
        first = len(self._fixed)
        if record is None or record.positions != tuple(range(first, first + len(arrays))):
            return
        self._record = record
        self._kinds = tuple((array.shape, array.dtype) for array in arrays)
        if self._fn.session.n == 1:
            self._direct = _Direct.of(self._fn, self._fixed, self._num_slices, record.ops)


class _Direct:
    """One process in all: a bound call run by calling the compiled function itself.

    A replayed call is still a command (the message posted, the master's share run
    through the handler table, the values staged in shared memory): 30-50 us, as much as
    PyMC's whole evaluation at 10^3 rows. With nobody to send the values to, a bound
    call calls the master's compiled function on trusted inputs
    (``Function.direct_call``: the first call checked the ``Data``, and ``Bound``
    checks each call's arrays' dtypes and shapes) with the ``Data``'s arrays where they
    are and the caller's, its slices accumulated by each output's op as every process
    accumulates its own (``_shard``), and the outputs returned as a call returns them.
    An error is raised as PyTensor's call raises it (there is no command to fail).
    """

    def __init__(self, call: Callable[..., list], fixed: tuple, scattered: int, slices: int,
                 ops: tuple[ReduceOp, ...]):
        self.call = call
        self.fixed = fixed
        self.scattered = scattered  # the first ones, sliced; the others whole
        self.slices = slices
        self.ops = ops
        # every output summed over the slices: added in place, slice after slice, as
        # an ``Accumulator`` adds them (a likelihood's slices: its cost per slice)
        self.sums = all(op is ReduceOp.SUM for op in ops)
        self._bounds: tuple[int, list] = (-1, [])  # (rows, its slices' bounds), the last

    @classmethod
    def of(cls, fn: Replays, fixed: tuple, num_slices: int,
           ops: tuple[ReduceOp, ...]) -> _Direct | None:
        """The direct form of ``fn`` bound to ``fixed``, its outputs reduced by ``ops``;
        None where its call is more than the compiled function on its arguments
        (``Function.direct_call``) or a ``Data`` is not exactly its input's (another
        dtype, which a call casts; a minibatch buffer)."""
        call = fn.direct_call()
        if call is None:
            return None
        for item, var in zip(fixed, fn.inputs + fn.bcast_inputs, strict=False):
            if item.dtype != var.type.dtype or item.ndim != var.ndim or item.minibatch:
                return None
        return cls(call, fixed, len(fn.inputs), num_slices, ops)

    def __call__(self, arrays: tuple) -> list | None:
        """The outputs, reduced as a command's replies would have been (this process's
        alone: new arrays); None where there are no rows to cut into slices (the
        command decides what runs)."""
        args = [*[item.data for item in self.fixed], *arrays]
        scattered = self.scattered
        weight = len(args[0]) if scattered else 1
        if self.slices == 1:  # (combine copies the outputs)
            return combine(self.ops, [(weight, self.call(*args))], 0)
        if weight == 0:
            return None
        rows, bounds = self._bounds
        if rows != weight:
            self._bounds = weight, (bounds := split_bounds(weight, self.slices))
        call, sliced, whole = self.call, args[:scattered], args[scattered:]
        if self.sums:
            totals: list | None = None
            for start, stop in bounds:
                if stop == start:
                    continue
                outputs = call(*[a[start:stop] for a in sliced], *whole)
                if totals is None:  # (copies: a VM may write its next outputs there)
                    totals = [out.copy() for out in outputs]
                else:
                    for i, out in enumerate(outputs):
                        totals[i] += out
            return totals  # (new arrays: as combine would give them, without its copy)
        accumulators = [Accumulator(op) for op in self.ops]
        for start, stop in bounds:
            if stop == start:
                continue
            for acc, value in zip(accumulators, call(
                    *[a[start:stop] for a in sliced], *whole), strict=True):
                acc.add(value, stop - start)
        return combine(self.ops, [(weight, [acc.result() for acc in accumulators])], 0)
