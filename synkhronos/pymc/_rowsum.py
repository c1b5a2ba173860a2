"""The Op PyMC's compiled function calls: the divided log-likelihood, evaluated.

This module owns what happens at every evaluation (``_likelihood`` builds the pieces
once: the row graph of every divided likelihood joined in one ``synk.function``, the
rows in shared memory, the check). One evaluation, as PyMC's graph asks for it::

    RowSum.evaluate(theta)        theta: the value variables end to end (``Values``)
      part.evaluate(theta)        ONE parallel call, whatever the number of observed
                                  variables and of their lengths: every process runs
                                  its share of every group's rows in its slices, in
                                  one compiled function, reduced once with op "sum";
                                  the call replayed (``bound``; with no workers, the
                                  master's compiled function on the rows in place),
                                  or, where an evaluation is long, its rows balanced
                                  by measured speed (``balancer``)
      (exact mode: every chunk's sums gathered, added in chunk order: ``total_of``)
      -> unpack
    <- (log-likelihood, flat gradient)

The gradient PyTensor asks of the Op (``pullback``) is that flat gradient, times the
log-likelihood's cotangent: the same node, so one call computes both.

Its interface, for ``_likelihood``: ``Values`` (the flat vector's layout), ``Part``
(the compiled likelihood over its rows, made by ``Part.of``), ``unpack`` (its one
output taken apart) and the Op, ``RowSum``. The function is reached through
``Function``'s in-package seam ``bind`` (``_replay.Bound``), and ``steps``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from .. import Data, Function, steps
from . import _pymc_compat as compat

__all__ = ["Values", "Part", "unpack", "RowSum", "joined", "linker_of", "register_backends"]

# Rows balanced by measured speed where one evaluation takes at least this long: a
# balanced call takes the general path (its shares vary), about 30-60 us more than a
# replayed one, under 5% from here. While the shares are even, one evaluation in
# _MEASURE_EVERY is timed and the others replay.
_BALANCE_FROM_S = 1e-3
_MEASURE_EVERY = 4


@dataclasses.dataclass(frozen=True)
class Values:
    """The value variables the likelihood reads, laid end to end in one flat vector of
    ``dtype`` (their upcast): the Op's one input and its gradient's layout."""

    vars: list
    shapes: list[tuple[int, ...]]
    offsets: list[int]  # where each starts in the vector, then its length
    dtype: str

    @classmethod
    def of(cls, vars: list, point: dict) -> Values:
        """The layout of ``vars`` as they are at ``point`` (value variable name -> value)."""
        shapes = [tuple(np.shape(point[v.name])) for v in vars]
        offsets = np.cumsum([0] + [int(np.prod(s, dtype=int)) for s in shapes]).tolist()
        return cls(vars, shapes, offsets, pytensor.scalar.upcast(*[v.dtype for v in vars]))

    def flat(self, point: dict) -> np.ndarray:
        """The vector of a point (value variable name -> value)."""
        return np.concatenate([np.asarray(point[v.name], dtype=self.dtype).ravel()
                               for v in self.vars])


def joined(vars: list, dtype: str):
    """``vars`` laid end to end in one vector of ``dtype``, in a PyTensor graph."""
    return pt.concatenate([(v if v.dtype == dtype else pt.cast(v, dtype)).ravel()
                           for v in vars])


@dataclasses.dataclass
class Part:
    """The compiled likelihood of every divided group: ``fn(*row_data, theta)`` over
    its rows, in ``slices`` blocks a process, gives the log-likelihood and its flat
    gradient in one vector (``unpack``).

    ``row_data``: its inputs' ``Data`` in call order, the first ``scattered`` of them
    divided by rows, the others whole: one group's rows scattered, or, for several
    lengths, the ``positions`` scattered and every group's rows whole, each process
    taking its share of each (``_likelihood._join``). ``lengths``: each group's rows.
    """

    fn: Function
    row_data: list[Data]
    scattered: int
    slices: int
    dtype: str  # of its one output (the log-likelihood, then the flat gradient)
    lengths: tuple[int, ...]
    # ``fn`` bound to its rows in its slices: ``bound(theta)`` is ``fn(*row_data, theta,
    # num_slices=slices)``, run again without its repeat's lookups once it repeats, and
    # without a command where there are no workers (``Function.bind``)
    bound: Callable[[np.ndarray], np.ndarray]
    # With workers, where an evaluation is long enough (``balance``): the processes'
    # shares of the scattered rows (for several lengths, of the positions: the same
    # share of every group's rows), from their measured seconds (``steps.Balancer``).
    balancer: steps.Balancer | None = None
    # Exact mode: the fixed chunks of the rows, one a slice, each one's sums gathered
    # and added here in chunk order (``total_of``); None: summed over the processes.
    chunks: int | None = None
    _calls: int = 0

    @classmethod
    def of(cls, fn: Function, row_data: list[Data], scattered: int, slices: int,
           dtype: str, lengths: tuple[int, ...], chunks: int | None = None) -> Part:
        """The part of ``fn`` (its inputs, then ``theta``; one output of ``dtype``) over
        ``row_data`` (the first ``scattered`` divided by rows) in ``slices`` blocks a
        process; ``chunks``: exact mode's."""
        return cls(fn, row_data, scattered, slices, dtype, lengths,
                   fn.bind(tuple(row_data), slices), chunks=chunks)

    @staticmethod
    def total_of(out: np.ndarray, chunks: int | None) -> np.ndarray:
        """A call's output as one vector (``unpack``): as it is where the processes
        summed it; in exact mode the chunks' gathered vectors, end to end in chunk order
        (every process's slices in order, the processes in rank order), added one after
        another, as one process adds its slices: the same additions whatever process
        evaluated which chunk."""
        if chunks is None:
            return out
        rows = out.reshape(chunks, -1)
        total = rows[0].copy()
        for row in rows[1:]:
            total += row
        return total

    def balance(self, theta: np.ndarray, size: int) -> None:
        """Balance its rows by measured speed where an evaluation at ``theta`` takes
        at least ``_BALANCE_FROM_S`` on ``size`` processes (``size`` > 1)."""
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            self.bound(theta)
            seconds.append(time.perf_counter() - start)
        if sorted(seconds)[1] >= _BALANCE_FROM_S:
            self.balancer = steps.Balancer(size)

    def evaluate(self, theta: np.ndarray) -> np.ndarray:
        """One parallel call at ``theta``: the log-likelihood and flat gradient of every
        process's rows, summed (``unpack``)."""
        balancer = self.balancer
        if balancer is None:
            return self.total_of(self.bound(theta), self.chunks)
        shares = balancer.shares()
        self._calls += 1
        if shares is None and self._calls % _MEASURE_EVERY:
            # the even split, replayed, between measurements
            return self.total_of(self.bound(theta), self.chunks)
        step = steps.call(self.fn, *self.row_data, theta, num_slices=self.slices,
                          shares=shares, timings=balancer.record)
        return self.total_of(steps.run([step])[0], self.chunks)

    def release(self) -> None:
        """Free its rows' shared memory now (otherwise when they are collected)."""
        for item in self.row_data:
            item.free_memory()


def unpack(both: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The log-likelihood (0-d) and the flat gradient, views of a part's one output."""
    return both[:1].reshape(()), both[1:]


class RowSum(Op):
    """The divided observed log-likelihood and its gradient.

    The value variables, flat in one vector (``Values``) -> (log-likelihood, flat
    gradient), summed over the processes: one parallel call an evaluation, whatever
    the number of observed variables and of their lengths (``Part``). One vector in: on
    Numba, one array for PyTensor's object mode to hand the Op, and one for a call to
    stage and send. It holds handles to the session's function and the rows' shared
    memory: it is never copied or pickled.
    """

    def __init__(self, part: Part | None, sources: list, values: Values,
                 dtype: str, connect: Callable[[], Part] | None = None,
                 local: Callable[[], Callable[[np.ndarray], np.ndarray]] | None = None):
        self.part = part
        self._connect = connect  # builds the part where it is None
        # Deferred (``connect``): the process that built the Op forks no session; the
        # few evaluations PyMC makes here before its chain processes fork (start-value
        # checks, jitter) run the whole rows in a plain function (``local()`` compiles
        # it, once); each chain process connects at its first evaluation.
        self._local = local
        self._whole: Callable[[np.ndarray], np.ndarray] | None = None
        self._builder = os.getpid()
        self.lock = threading.Lock()  # one evaluation at a time
        # (a shared variable's name, the cell holding its value, the value copied into
        # the rows): a cell that holds another value is a pm.set_data since
        self.sources = [(var.name, compat.value_cell(var), value) for var, value in sources]
        self.total = values.offsets[-1]
        self.input_type = pt.vector(dtype=values.dtype, shape=(self.total,)).type
        self.dtype = dtype
        self.released = False
        self.failures: list = []  # evaluations' errors, which a sampler may report as its own


    @property
    def num_slices(self) -> int | None:
        """Each process's blocks of rows (grainsize); None until the part is built."""
        return None if self.part is None else self.part.slices

    def make_node(self, theta):
        theta = self.input_type.filter_variable(theta)
        outputs = [pt.scalar(dtype=self.dtype), pt.vector(dtype=self.dtype, shape=(self.total,))]
        return Apply(self, [theta], outputs)

    def perform(self, node, inputs, output_storage):
        output_storage[0][0], output_storage[1][0] = self.evaluate(inputs[0])

    def evaluate(self, theta: Any) -> tuple[np.ndarray, np.ndarray]:
        """The log-likelihood and its flat gradient at the flat values ``theta``: the
        Op's outputs (new arrays; on Numba called straight from the compiled graph,
        ``compat.numba_object_call``)."""
        with self.lock:  # (nutpie and JAX samplers call from their own threads)
            try:
                return self._evaluate(theta)
            except Exception as exc:  # (kept: a sampler may report it as its own error)
                self.failures.append(exc)
                raise

    def _evaluate(self, theta: Any) -> tuple[np.ndarray, np.ndarray]:
        # (A process forked from the master, such as a PyMC chain process with
        # cores > 1, gets the session's RuntimeError from this call.)
        if self.released:
            raise RuntimeError("this synkhronos likelihood was released (its rows' shared "
                               "memory is freed); build a new one")
        for name, cell, value in self.sources:
            if cell[0] is not value:
                raise RuntimeError(
                    f"the model's data {name!r} changed (pm.set_data) after synkhronos.pymc "
                    "copied its rows (for logp_dlogp_function, sample or find_MAP); build a "
                    "new one"
                )
        part = self.part
        if part is None:  # deferred
            if self._local is not None and os.getpid() == self._builder:
                if self._whole is None:
                    self._whole = self._local()
                return unpack(self._whole(theta))
            assert self._connect is not None  # a chain process: its first evaluation
            part = self.part = self._connect()
        # (the call's reduced output is a new array: its views are kept)
        return unpack(part.evaluate(theta))

    def pullback(self, inputs, outputs, cotangents):
        """The gradient: the reduced gradient, times the log-likelihood's cotangent."""
        g_loglik, g_flat = cotangents
        if not isinstance(g_flat.type, DisconnectedType) or isinstance(
            g_loglik.type, DisconnectedType
        ):
            return [grad_not_implemented(self, 0, inputs[0], "second derivatives of a "
                                         "synkhronos likelihood are not available")]
        # (outputs[1]: the same node as the value, one call computes both)
        grad = g_loglik * outputs[1]
        return [grad if grad.dtype == inputs[0].dtype else pt.cast(grad, inputs[0].dtype)]

    L_op = pullback  # PyTensor < 3.3 asks for the same thing under this name

    def infer_shape(self, *args):  # (fgraph, node, shapes) before PyTensor 3.3
        return [(), (self.total,)]

    def __deepcopy__(self, memo):
        return self  # holds handles to processes and shared memory, never copies

    def __reduce__(self):
        # PyMC catches this and samples its chains in the master instead of spawned
        # processes (which could not reach the session).
        raise pickle.PicklingError("a synkhronos likelihood cannot be pickled: it is "
                                   "evaluated by the session of this master process")

    def release(self) -> None:
        """Free the rows' shared memory now (otherwise when the Op is collected), after
        any evaluation a sampler's thread is running."""
        with self.lock:
            self.released = True
            if self.part is not None:
                self.part.release()



def linker_of(compile_mode: Any = None) -> str:
    """The name of the linker ``compile_mode`` (a mode, its name, or None: PyTensor's
    default) compiles with: "NumbaLinker", "JAXLinker", "VMLinker", ..."""
    from pytensor.compile.mode import get_mode

    return type(get_mode(compile_mode).linker).__name__


def register_backends(compile_mode: Any = None) -> None:
    """Make ``RowSum`` compile on the backend of ``compile_mode`` (a mode or its name;
    None: PyTensor's default): on Numba an object-mode call (``compat``), on JAX a host
    callback (``_jax_callback``); the C backend calls ``perform``. Once a backend."""
    linker = linker_of(compile_mode)
    if linker == "NumbaLinker":  # (nutpie's too, whatever PyTensor's default mode)
        compat.numba_object_call(RowSum, RowSum.evaluate)
    elif linker == "JAXLinker" and not _jax_registered:
        from pytensor.link.jax.dispatch import jax_funcify

        jax_funcify.register(RowSum)(_jax_callback)
        _jax_registered.append(True)


_jax_registered: list = []


def _jax_callback(op: RowSum, node: Any = None, **kwargs: Any) -> Callable:
    """The Op in a graph JAX compiles (``pm.sample``'s numpyro and blackjax routes, nutpie's
    JAX backend): its value and gradient computed in this process by a host callback
    (``jax.pure_callback``), one evaluation serving both: a custom VJP hands ``jax.grad``
    the gradient already computed. Samplers that run chains at once call back from XLA's
    threads: one evaluation at a time (``RowSum.evaluate``, which keeps an evaluation's
    error on the Op: JAX reports it as a failure of the callback)."""
    import jax

    dtype = np.dtype(op.dtype)
    result = (jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((op.total,), dtype))

    def host(theta):
        value, grad = op.evaluate(np.asarray(theta, dtype=op.input_type.dtype))
        return np.asarray(value, dtype=dtype), np.array(grad, dtype=dtype)

    def both(theta):
        return jax.pure_callback(host, result, theta, vmap_method="sequential")

    @jax.custom_vjp
    def rowsum(theta):
        return both(theta)

    def forward(theta):
        value, grad = both(theta)
        return (value, grad), grad

    def backward(grad, cotangents):
        # (the gradient output's own cotangent: second derivatives, not available)
        return (cotangents[0] * grad.astype(op.input_type.dtype),)

    rowsum.defvjp(forward, backward)
    return rowsum
