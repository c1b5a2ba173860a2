"""synk.function() and Function: serial PyTensor functions that run on every process.

This module builds; ``_call.py`` runs. One call, in the master::

    f(*args, batch=..., batch_s=..., num_slices=..., output_subset=...)
      1. bind      args/kwargs -> one value per input (inputs + bcast_inputs)
      2. validate  count, ndim, dtype (cast only where PyTensor casts), lengths,
                   batch, the form of batch_s, num_slices, output_subset, shares
                   (_validate.py, _scatter.py), a batch size the graph hard-codes
                   while the rows are split (_fixed_batch.py): every error here,
                   before any worker moves
      3. prepare   the variant's PreparedCall (_call.py): numpy inputs and batch
                   indices staged in its shared memory; a Call message with the
                   variant's id and what varies
      4. run       one command; every process runs its share (_shard.py) on its own
                   rows, each checking its own batch_s (all or nothing)
      5. collect   per-rank (rows, outputs) reduced by each output's op, avg
                   weighted by rows; returned in PyTensor's conventions

A call that repeats an earlier plain call (the same Data, or arrays of the same dtype
and shape, nothing else asked) replays it (``_replay.py``): it skips 1-3, its arrays
copied where the earlier call's went, while nothing it relies on has moved.

The compiled functions are built here, in the master: the one the user asked for
(scattered inputs, broadcast inputs, then one input per sliceable shared variable,
which replaces that variable through ``givens`` so each process can pass its
selected rows; givens that slice a minibatch out of shared variables, the Theano
tutorials' pattern, get such inputs too: ``_givens.py``), and lazily its variants:
an ``output_subset`` (PyTensor 3 has no call-time subset) and the sliced form, which
returns the update values as outputs instead of applying them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from pytensor.graph.basic import Variable

from . import _fixed_batch, _pytensor, _replay, _rows, _validate
from ._call import Call, combine, repeat_key
from ._core.session import Session, require
from ._reducers import ReduceOp
from ._runtime import epoch
from ._scatter import normalize_shares, offsets, weighted_counts
from ._signature import (
    check_chunked,
    check_sliceable_outputs,
    check_used,
    parse_outputs,
    parse_updates,
    row_inputs,
    sliceable,
    variables,
)
from ._variants import Variants
from .data import data_for

__all__ = ["function", "Function"]


class Function:
    """A PyTensor function that runs on every process; built by ``synk.function``.

    Attributes
    ----------
    name : str or None
        The name given to ``synk.function``.
    inputs : list of Variable
        Inputs scattered across processes, along axis 0 or their ``in_axes``.
    bcast_inputs : list of Variable
        Inputs every process uses whole (with givens that slice shared variables,
        the scalar ``inputs`` come first here).
    sliceable_shareds : list of SharedVariable
        Shared variables holding data rows, subject to ``batch_s`` and slicing (an
        elementwise view given there, such as a cast, is listed as its variable).
    output_modes : list of str or None
        The reduction of each output: ``"avg"``, ``"sum"``, ``"prod"``, ``"max"``,
        ``"min"``, ``"gather"``, or None (the master's own result); an output with one
        entry per row and the default op is ``"gather"``.
    update_modes : list of str
        How each update is accumulated across slices.
    """

    def __init__(self, inputs, outputs, bcast_inputs, updates, givens, sliceable_shareds,
                 name, in_axes, kwargs):
        session = require("synk.function()")
        session.check_usable()
        self.name = name
        self.inputs = variables(inputs, "inputs")
        self.bcast_inputs = variables(bcast_inputs, "bcast_inputs")
        axes, axes_given = _rows.in_axes(in_axes, self.inputs)
        self._outputs, self._output_ops, self._single, ops_given = parse_outputs(outputs)
        self._updates, self._update_ops = parse_updates(updates)
        self.sliceable_shareds = sliceable(sliceable_shareds)
        given = list(givens.items()) if isinstance(givens, dict) else list(givens or [])
        check_used(self.sliceable_shareds, self._outputs, self._updates, given)
        moved = _rows.move(self.inputs, axes)
        if moved.replace:  # the graph reads each such input through its moved one
            self._outputs, self._updates, given = _moved_graph(
                moved.replace, self._outputs, self._updates, given)
        rows = row_inputs(moved.inputs, self.bcast_inputs, self.sliceable_shareds, given,
                          self._outputs + [value for _, value in self._updates],
                          session.ctx.placement.compile_kwargs(dict(kwargs)))
        if rows.slices is None:  # (the slice pattern's scalar inputs become broadcast)
            self._axes = axes if moved.replace else None
        else:
            self.inputs, self._axes = rows.inputs, None
        self.bcast_inputs, self._kwargs = rows.bcast_inputs, rows.kwargs
        self._slices = rows.slices
        self._row_shareds, self._slice_inputs = rows.shareds, rows.stand_ins
        self._signature = self.inputs + self.bcast_inputs  # as the caller passes values
        compiled = rows.inputs + rows.bcast_inputs + rows.stand_ins  # rows first
        self._labels = [_validate.label(var, i) for i, var in enumerate(self._signature)]
        row_vars = rows.inputs + rows.stand_ins
        per_row = _checked_rows(self._outputs, self._output_ops, ops_given, self._updates,
                                rows.givens, row_vars, self._labels[:len(rows.inputs)] + [
                                    f"sliceable shared {var.name!r}" for var in rows.shareds],
                                axes_given if rows.slices is None else ())
        self._outputs, self._output_ops, self._out_axes = (
            per_row.outputs, per_row.ops, per_row.axes)
        self._fixed_batch = self._find_fixed_batch(rows.slices, rows.inputs)
        first = rows.slices.first_rows() if self._fixed_batch and rows.slices else None
        if first:  # the tutorials' batch size, known now: refuse before compiling
            _fixed_batch.check(self._fixed_batch, first, session.n, None, 1,
                               f"the whole minibatch of {first} rows that the givens "
                               "slice (with every scalar input 0)")
        self._binder = _validate.Binder(self._signature, len(self.inputs))
        self._session: Session = session
        self._untrusted = threading.Lock()  # as_pytensor's checked calls, one at a time
        self._trusted = _validate.trustable(compiled, len(self.inputs),
                                            len(self.bcast_inputs))
        self._variants = Variants(
            session, name, compiled, rows.givens, self._kwargs,
            self._trusted, self._outputs, self._output_ops, self._updates, self._update_ops,
            self._row_shareds, len(self.inputs), self._labels, self._axes,
            self.sliceable_shareds)
        self._local = self._variants.local

    def _find_fixed_batch(self, slices: Any, inputs: list
                          ) -> tuple[_fixed_batch.FixedBatch, ...]:
        """The ops that hard-code the whole batch's row count (``_fixed_batch.py``):
        in the graph the user wrote, on the scattered inputs (``inputs``: their rows
        first) or the variables the slice pattern gives rows."""
        rows = list(inputs)
        labels = self._labels[:len(rows)]
        if slices is not None:
            for key, _, shared in slices.entries:
                rows.append(key)
                name = f"{key.name!r}, " if key.name else ""
                source = repr(shared.name) if shared.name else "a shared variable"
                labels.append(f"{name}the givens' slice of {source}")
        roots = self._outputs + [value for _, value in self._updates]
        return _fixed_batch.find(roots, rows, labels)

    @property
    def output_modes(self) -> list[str | None]:
        """The reduction of each output, as strings (None: not reduced)."""
        return [None if op is ReduceOp.NONE else op.value for op in self._output_ops]

    @property
    def update_modes(self) -> list[str]:
        """How each update accumulates across slices, as strings."""
        return [op.value for op in self._update_ops]

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, *args, output_subset=None, batch=None, batch_s=None, num_slices=1,
                 shares=None, chunks=None, **kwargs):
        """Run on every process; return what the PyTensor function would return.

        Collective: every process takes part; returns when all have finished.

        Parameters
        ----------
        *args, **kwargs
            One value per input, in the order ``inputs + bcast_inputs`` or by the
            variable's name: ``synk.Data`` objects (used in place, no copy) or numpy
            arrays and array-likes (copied once into shared memory; with one process
            in all, on CPU cores or a GPU, a repeated call reads numpy inputs of 32 KiB
            or more where they are, since nobody else needs the copy). dtypes are cast
            only where PyTensor would cast.
        output_subset : list of int, optional
            Indices of the outputs to compute and return (compiled on first use).
        batch : int, slice or 1-d array of int, optional
            Rows of the scattered inputs to use, selected before scattering: the first
            ``n`` rows, a slice with step 1, or row indices (e.g. a shuffled minibatch;
            each process gathers its own share of them). A minibatch ``Data`` is not
            indexed: it supplies its first ``len(batch)`` rows.
        batch_s : slice, index array, or a list of them (one per process), optional
            Rows of each process's ``sliceable_shareds`` to use; each process checks
            its selection against its own rows, and if any refuses, none runs.
        num_slices : int, default 1
            Each process runs its rows in this many consecutive slices, accumulating
            outputs and updates; updates are applied once, computed from the original
            values. Results equal the unsliced call.
        shares : sequence of float, optional
            Each process's share of the selected rows (one positive number per process,
            in rank order: a measured speed, or row counts): the rows are cut in
            proportion, still contiguous and in rank order, every process getting at
            least one when there are as many rows as processes. Default: the even
            split. Results equal the even split's (``"avg"`` is weighted by the rows
            each process ran) up to floating-point rounding. Splits the rows of the
            scattered inputs, or the slice of givens that slice shared variables; not
            ``batch_s``.
        chunks : int, optional
            Cut the selected rows into this many consecutive chunks, and let every
            process take the next chunk not yet taken until none is left, instead of
            each running its own block: a process slowed by another program takes fewer
            chunks, and the others do not wait for it. The function runs once per
            chunk taken and its updates are applied after each, so every update must add
            into its variable (``grad_shared + g``: a gradient accumulated; the process's
            variable holds the sum over the chunks it ran); outputs are reductions
            weighted by rows (not ``"gather"`` or None). Results equal the call without
            chunks up to floating-point rounding (which process adds which chunk varies
            from call to call). Not with ``num_slices``, ``shares``, ``batch_s``,
            sliceable shared variables, or a session over several machines.

        Returns
        -------
        numpy.ndarray or list of numpy.ndarray
            A single value for a single output, else a list; ``"avg"`` outputs are
            weighted by rows, ``"gather"`` outputs are in the order of the rows.

        Raises
        ------
        TypeError, ValueError
            For any invalid argument, before any process changes anything.
        synkhronos.WorkerError
            An exception inside some process (the session stays usable).
        synkhronos.WorkerDiedError, synkhronos.WorkerTimeoutError
            A process died or did not finish in time (the session is broken).
        """
        session = self._session
        took = session.enter()  # staging and the command: one thread at a time
        try:
            variants = self._variants
            plain = variants.plain if num_slices == 1 else (
                variants.sliced if type(num_slices) is int else None)
            if (plain is not None and not kwargs and batch is None and batch_s is None
                    and output_subset is None and self._slices is None and shares is None
                    and (chunks is None or (type(chunks) is int and chunks > 0))):
                # Inputs like an earlier call's and nothing else asked: replay it (rows
                # in chunks too: the same message, the counter's tag is the command's)
                key = repeat_key(args)
                record = (plain.records.get((_replay.slot_of(num_slices, chunks), key))
                          if key is not None else None)
                if record is not None and record.epoch == epoch.current:
                    if session.instrument is None:  # (``replay`` inline: every
                        # repeated call comes here)
                        return self._returned(_replay.run(session, record, args),
                                              record.ops, None)
                    return self.replay(record, args)
            if session.instrument is not None:
                return session.instrument.call(self._general, args, kwargs, output_subset,
                                               batch, batch_s, num_slices, shares, chunks)
            return self._general(args, kwargs, output_subset, batch, batch_s, num_slices,
                                 shares, chunks)
        finally:
            session.leave(took)

    def _general(self, *arguments: Any) -> Any:
        """A call's general path (``prepare``, then its command), the session held."""
        call, finish = self.prepare(*arguments)
        return finish(self._session.run_held(call, repeats=call.batch_s is None))

    def prepare(self, args: tuple, kwargs: dict, output_subset: Any = None, batch: Any = None,
                batch_s: Any = None, num_slices: Any = 1, shares: Any = None,
                chunks: Any = None, timings: bool = False
                ) -> tuple[Call, Callable[[list], Any]]:
        """Validate and stage a call without running it: its message, and what turns the
        ranks' replies into the call's return value.

        For composite commands (a training step runs several calls in one round trip).
        The caller holds the session (``Session.enter``) until the message has run.
        ``timings``: every rank's reply carries its seconds (gathering its rows, running
        the function) as its third item, as under an instrument (``synk.profile()``).
        """
        session = self._session
        asked = timings  # by the caller (rows balanced by measured speed)
        timings = asked or session.instrument is not None
        values = self._binder.bind(args, kwargs)
        subset = _validate.check_subset(output_subset, len(self._outputs))
        num_slices = _validate.check_num_slices(num_slices)
        shares = normalize_shares(shares, session.n)
        if shares is not None and not self.inputs and self._slices is None:
            raise ValueError("shares split the rows of scattered inputs (or the slice of "
                             "givens that slice shared variables), but this function has "
                             "none; batch_s chooses each process's rows of sliceable_shareds")
        checked = _validate.check_inputs(
            self._signature, len(self.inputs), values, batch,
            self._kwargs.get("allow_input_downcast"), self._axes,
        )
        if num_slices > 1:
            check_sliceable_outputs(self._output_ops, subset)
        chunks = check_chunked(chunks, self._output_ops, subset, self._updates)
        if chunks:
            self._check_chunks_apply(session, num_slices, shares, batch_s)
            if checked.total_rows == 0:
                chunks = 0  # no rows to share out: the master runs alone, as always
        selections = _validate.check_batch_s(self.sliceable_shareds, batch_s, session.n)
        rows, empty, cuts = None, False, None
        length = checked.total_rows
        if self._slices is not None:  # the givens' slice, divided: its bounds vary per call
            rows, length = self._slices.rows(checked.values, session.n, shares)
            empty = length == 0
        elif shares is not None:
            cuts = offsets(weighted_counts(checked.total_rows, shares))
        if self._fixed_batch:
            _fixed_batch.check(self._fixed_batch, length, session.n, shares, num_slices)
        prepared = self._variants.prepared(subset, num_slices > 1)  # (may distribute)
        call = prepared.message(checked, selections, num_slices, timings,
                                session.commands, rows, empty, cuts, chunks)
        # (a plain call is kept for replay; under an instrument too, with its timings)
        key = repeat_key(args) if (
            not kwargs and batch is None and batch_s is None
            and subset is None and self._slices is None
            and shares is None
            and (not asked or session.instrument is not None)) else None
        ops = prepared.prepared.output_ops

        def finish(replies: list) -> Any:
            prepared.registered = True
            if key is not None:
                _replay.keep(prepared, key, call)
            return self._returned(replies, ops, subset)

        return call, finish

    def _check_chunks_apply(self, session: Session, num_slices: int, shares: Any,
                            batch_s: Any) -> None:
        """``ValueError`` where rows in chunks cannot replace each process's block."""
        other = ("num_slices" if num_slices > 1 else "shares" if shares is not None
                 else "batch_s" if batch_s is not None else None)
        if other is not None:
            raise ValueError(f"chunks share the rows out as the processes come free; "
                             f"{other} fixes them: give one or the other")
        if not self.inputs or self._slices is not None or self.sliceable_shareds:
            raise ValueError("chunks share out the rows of scattered inputs; this function "
                             "takes its rows from shared variables")
        if session.replica_groups is not None:
            raise ValueError("chunks share rows out among the processes of one machine; "
                             "this session spans several machines")
        if self._fixed_batch:
            raise ValueError("chunks give each run of the function a chunk's rows, but "
                             "this function was built for a fixed number of rows per "
                             "process")

    # -- replay (``_replay.py``) ---------------------------------------------------------
    def record(self, key: tuple, num_slices: int = 1) -> _replay.Record | None:
        """The current record a plain call with ``key`` in ``num_slices`` slices kept,
        or None."""
        plain = self._variants.plain if num_slices == 1 else self._variants.sliced
        record = None if plain is None else plain.records.get((num_slices, key))
        return record if record is not None and record.epoch == epoch.current else None

    def replay(self, record: _replay.Record, args: tuple) -> Any:
        """Run ``record`` again on ``args`` (the caller holds the session and checked
        the record); the call's result, as ``__call__`` returns it."""
        instrument = self._session.instrument
        if instrument is not None:
            return instrument.call(self._replayed, record, args)
        return self._replayed(record, args)

    def _replayed(self, record: _replay.Record, args: tuple) -> Any:
        return self._returned(_replay.run(self._session, record, args), record.ops, None)

    def _returned(self, replies: list, ops, subset: tuple[int, ...] | None):
        """The replies reduced by ``ops``, in PyTensor's return conventions."""
        return self.as_returned(combine(ops, replies, self._session.ctx.master_rank), subset)

    def as_returned(self, results: list, subset: tuple[int, ...] | None = None):
        """Reduced outputs in PyTensor's return conventions (rows put back along their
        axis, a single output alone): an in-package seam, for ``_replay.Bound``'s calls
        that run without a command."""
        if self._out_axes is not None:
            results = _rows.put_back(results, self._out_axes, subset)
        if self._single and (subset is None or len(subset) == 1):
            return results[0]
        return results

    @property
    def session(self) -> Session:
        """The session this function runs in (an in-package seam: ``_replay.Bound``
        holds it around calls that run without a command)."""
        return self._session

    def direct_call(self) -> Callable[..., list] | None:
        """This process's compiled function called directly on trusted inputs (rows,
        then broadcast values; ``_pytensor.trusted_call``); None where PyTensor must
        check the inputs, or a call is more than that function on its arguments, run
        in slices as a process runs its own (updates, sliceable shared variables, rows
        along another axis).

        For ``_replay.Bound`` with one process in all, which calls it with no command
        (holding ``session`` around each call)."""
        if not self._trusted or self._updates or self.sliceable_shareds or self._axes:
            return None
        call = _pytensor.trusted_call(self._local)
        return None if call is self._local else call

    def bind(self, fixed: tuple, num_slices: int = 1) -> _replay.Bound:
        """Calls whose first arguments are always the ``Data`` in ``fixed``, in
        ``num_slices`` slices (``_replay.Bound``): an in-package seam, for
        ``synkhronos.pymc``'s likelihood (its rows fixed, the point varying), replayed
        under a fixed key."""
        return _replay.Bound(self, fixed, num_slices)

    def as_pytensor(self, *args, output_subset=None, **kwargs):
        """Run the plain PyTensor function in the master alone, on the whole inputs.

        Shared variables (updates included) change in the master only: this is the
        serial program the parallel calls must match. ``output_subset`` selects
        outputs as in a parallel call (and in PyTensor 2's call keyword; PyTensor 3
        dropped it, so the subset is taken from the full outputs here).
        """
        subset = _validate.check_subset(output_subset, len(self._outputs))
        values = self._binder.bind(args, kwargs)
        values = [v.data if hasattr(v, "ref") else v for v in values]
        if self._axes is not None:  # the compiled function takes the rows first
            values = [np.moveaxis(np.asarray(v), axis, 0) if axis else v
                      for v, axis in zip(values, self._axes + (0,) * len(values),
                                         strict=False)]
        whole = [var.get_value(borrow=True) for var in self.sliceable_shareds]
        if self._slices is not None:  # the serial function's own slice of each
            spans = self._slices.whole(values)
            whole += [var.get_value(borrow=True)[lo:hi]
                      for var, (lo, hi) in zip(self._slices.shareds, spans, strict=True)]
        with self._untrusted:  # these values are the caller's: let PyTensor check them
            self._local.trust_input = False
            try:
                outputs = self._local(*values, *whole)
            finally:
                self._local.trust_input = self._trusted
        if self._out_axes is not None:
            outputs = _rows.put_back(list(outputs), self._out_axes, None)
        if subset is not None:
            outputs = [outputs[i] for i in subset]
            return outputs[0] if self._single and len(subset) == 1 else outputs
        return outputs[0] if self._single else outputs

    as_theano = as_pytensor

    def build_inputs(self, *args, force_cast=False, oversize=1, minibatch=False, **kwargs):
        """``synk.Data`` objects holding the values for this function's inputs.

        Parameters
        ----------
        *args, **kwargs
            One value per input (``inputs + bcast_inputs``), positionally or by the
            input variable's name.
        force_cast : bool, default False
            Cast values whose dtype differs from the input's (a safe cast needs no flag).
        oversize : float in [1, 2], default 1
            Room to grow, as a multiple of each value's size.
        minibatch : bool or sequence of bool, default False
            Mark the Data as minibatch buffers (see :func:`synk.data <synkhronos.data>`):
            one flag for all, or one per input.

        Returns
        -------
        synkhronos.Data or tuple of synkhronos.Data
            One Data for a function of one input, else a tuple in input order.

        Raises
        ------
        TypeError, ValueError
            A missing or unknown input, a ``minibatch`` list of the wrong length, or a
            value that does not fit its input (as ``synk.data`` raises).
        """
        built = data_for(self._binder.bind(args, kwargs), self._signature, force_cast,
                         oversize, minibatch)
        return built[0] if len(built) == 1 else built

    def __repr__(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        return f"<synk.Function{name}, {len(self._outputs)} outputs>"


def function(inputs, outputs=None, bcast_inputs=None, updates=None, givens=None,
             sliceable_shareds=None, name=None, in_axes=None, **kwargs) -> Function:
    """Build a function that runs on every process, like ``pytensor.function``.

    Parameters
    ----------
    inputs : list of Variable
        Scattered across processes along axis 0 (or ``in_axes``); scalars only where
        ``givens`` slice shared variables (below), which makes them broadcast.
    outputs : Variable, (Variable, op) or list of these
        ``op`` is ``"avg"`` (default, weighted by rows), ``"sum"``, ``"prod"``,
        ``"max"``, ``"min"``, ``"gather"`` (concatenate in row order), or ``None``: no
        reduction, the master returns its own result and the workers send nothing.
        ``"c_avg"``, ``"c_sum"``, ... (the original's host-side ops) are aliases. An
        output with one entry per row (along any axis, by PyTensor's shape
        inference) is gathered along that axis under the default op; an explicit
        reduction of it is refused.
    bcast_inputs : list of Variable
        Used whole by every process.
    updates : dict or list of (shared, new_value[, op])
        Applied locally in every process; ``op`` accumulates across slices.
    givens : dict or list of pairs
        As in ``pytensor.function``. A given whose value is a slice along axis 0 of a
        shared variable (or of a cast of one), with bounds computed from scalar inputs
        (the Theano tutorials' ``givens={x: data_x[index * bs:(index + 1) * bs]}``),
        runs each process on its block of the slice's rows, as scattered rows are
        divided; every process holds the whole data, and the scalar inputs are
        broadcast.
    sliceable_shareds : list of SharedVariable
        Shared variables holding data rows, subject to ``batch_s`` and slicing; a
        cast or other elementwise view of one counts as the variable.
    name : str
    in_axes : int or list of int, optional
        The axis of each scattered input that holds its rows, as JAX's ``in_axes``:
        one int for all inputs or one per input (default 0). Time-major sequence
        data ``(time, batch)`` takes 1. A scattered input whose rows a ``scan``
        iterates over is refused unless its axis is given here.
    **kwargs
        Passed to ``pytensor.function`` untouched.

    Returns
    -------
    Function
        Call it like the PyTensor function; it runs on every process.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()`` or after ``synk.close()``.
    TypeError, ValueError
        An output, update or op that is not valid (the message names it); a scalar
        among ``inputs`` that no given slicing a shared variable makes broadcast; an
        invalid ``in_axes``; a scan over the scattered rows; a reduction of an output
        with one entry per row.

    Examples
    --------
    >>> n = synk.fork()                                            # doctest: +SKIP
    >>> x = pt.dmatrix("x")                                        # doctest: +SKIP
    >>> f = synk.function([x], [x.mean(axis=0), (x.sum(), "sum")])  # doctest: +SKIP
    >>> synk.distribute()                                          # doctest: +SKIP
    >>> means, total = f(np.ones((1000, 3)))                       # doctest: +SKIP
    """
    return Function(inputs, outputs, bcast_inputs, updates, givens, sliceable_shareds,
                    name, in_axes, kwargs)


def _moved_graph(replace: dict, outputs: list, updates: list, givens: list
                 ) -> tuple[list, list, list]:
    """Outputs, update values and givens' values reading the moved inputs (``_rows``),
    cloned together so that what they share stays shared."""
    given_at = [i for i, (_, value) in enumerate(givens) if isinstance(value, Variable)]
    roots = outputs + [value for _, value in updates] + [givens[i][1] for i in given_at]
    new = _pytensor.substitute_all(roots, replace)
    n_out, n_up = len(outputs), len(updates)
    givens = list(givens)
    for i, value in zip(given_at, new[n_out + n_up:], strict=True):
        givens[i] = (givens[i][0], value)
    return (new[:n_out], [(var, value) for (var, _), value in
                          zip(updates, new[n_out:n_out + n_up], strict=True)], givens)


def _checked_rows(outputs: list, ops: list, ops_given: tuple, updates: list, givens: list,
                  rows: list, labels: list[str], axes_given: tuple) -> _rows.PerRow:
    """The per-row outputs gathered (or refused) and the scans over rows refused, on the
    graph as each process computes it (``_rows``); only graphs with an output of one
    or more dimensions, or a scan, are looked at."""
    if not rows:
        return _rows.PerRow(list(ops), None, list(outputs))
    shaped = any(op is not ReduceOp.NONE and getattr(out.type, "ndim", 0) > 0
                 for out, op in zip(outputs, ops, strict=True))
    steps = _pytensor.scan_steps(outputs + [value for _, value in updates])
    if not shaped and not steps:
        return _rows.PerRow(list(ops), None, list(outputs))
    replace = {var: value for var, value in givens if isinstance(value, Variable)}
    analysed = outputs + steps  # (the scans' steps read as each process reads them)
    if replace:
        analysed = _pytensor.substitute_all(analysed, replace)
    _rows.check_scans(analysed[len(outputs):], rows, labels, axes_given)
    return _rows.per_row_outputs(outputs, ops, ops_given, analysed[:len(outputs)], rows)
