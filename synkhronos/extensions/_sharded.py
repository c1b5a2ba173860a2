"""The sharded update of a training step: each process updates its piece of the parameters.

This module owns the sharded form of :class:`~synkhronos.extensions.train.TrainFunction`
(ZeRO stage 1, as PyTorch's ZeroRedundancyOptimizer): when a rule can run on a piece
(``obstacles``), the flat parameter vector, the update of one process's piece of it,
the rule state of that piece (1/n of the state per process), and each process's piece
bounds. The training step decides whether to shard, asks ``sharded_update`` for the
form that fits the session's values, and runs the steps it hands back, in one command
per training step:

1. ``before_gradient``: what must precede the gradient call (in place: a parameter
   set since the last step is copied into its place in ``params_flat``).
2. (The training step's gradient call writes ``grad_shared`` in every process.)
3. ``update_steps()``: ``reduce_scatter(grad_shared, "sum")`` leaves each process the
   summed gradient of its piece (with ``exchange=``, of the processes' gradients rounded
   to 16 bits); ``apply_function`` runs the rule's arithmetic
   (:data:`~synkhronos.extensions.updates.MATH`) on that piece of the parameters and
   of the state (in place on views of the pieces; on the JAX backend given the
   piece's bounds as one scattered row per process);
   ``all_gather_pieces`` gives every new piece to every process's ``params_flat``
   (in place: one buffer that every process's ``params_flat`` views, so nothing is
   copied); then every parameter takes its place of it again.

Two forms, chosen once when the step is built:

- ``InPlaceUpdate`` (``device="cpu"``, a backend other than JAX): every parameter
  *views* its place in ``params_flat``, the pieces are the collectives' cache-line
  cuts (about equal, lengths differing per process), and the rule updates in place
  a variable viewing the process's piece of ``params_flat`` (``steps.piece_view``),
  reading one viewing its piece of ``grad_shared``. No parameter is ever copied.
- ``EvenPieceUpdate`` (the JAX backend: ``device="gpu"``, ``mode="JAX"``): JAX arrays
  view nothing and JAX compiles static shapes, so ``params_flat`` and ``grad_shared``
  are padded to ``n`` pieces of one length ``L`` (``steps.piece_length``: ceil of the
  size over ``n``, rounded up to a cache line, which is also where the collectives cut
  them); the rule runs on ``L`` elements at a traced offset in every process, its
  state is ``L`` long in each, and after the all-gather one more call copies each
  parameter out of ``params_flat``. The padding holds zeros in the gradient, and no
  rule mixes elements, so it never changes a parameter.

The pieces are known only once the functions are distributed (``setup``), where the
state is zeroed (in place: made, its length differing per process).
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import get_mode
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.link.jax.linker import JAXLinker

from .. import Function, broadcast, device, function, n_parallel, set_value
from .. import data as synk_data
from .. import steps as synk_steps
from . import updates
from .updates import RULES, _offsets

__all__ = ["ShardedUpdate", "InPlaceUpdate", "EvenPieceUpdate", "sharded_update",
           "in_place", "obstacles", "rule_name"]


def rule_name(update_rule: Any) -> str | None:
    """The name of a rule of ``updates`` (whose arithmetic can run on a piece)."""
    name = getattr(update_rule, "__name__", None)
    return name if name in updates.MATH and RULES.get(name) is update_rule else None


def obstacles(update_rule: Any, params: Sequence[SharedVariable]) -> list[str]:
    """Why the update cannot be sharded here (empty if it can): a rule of the user's
    own, or parameters of several dtypes (one flat vector holds them all)."""
    reasons = []
    if rule_name(update_rule) is None:
        reasons.append("the rule is not one of synkhronos.extensions.updates")
    if len({p.type.dtype for p in params}) > 1:
        reasons.append("the parameters have several dtypes")
    return reasons


def _hyper_of(update_rule: Any, rule_args: Sequence[Any], hyper: dict) -> dict:
    """The rule's hyper-parameters by name (positional ones too; ``lr`` is
    ``learning_rate``)."""
    hyper = dict(hyper)
    if "lr" in hyper:
        hyper["learning_rate"] = hyper.pop("lr")
    bound = inspect.signature(update_rule).bind(None, None, *rule_args, **hyper)
    return {k: v for k, v in bound.arguments.items() if k not in ("loss", "params")}


class _PieceState(updates.State):
    """State for a rule applied to each process's piece of the flat parameters: a
    vector of the piece's length (``length`` None: it differs per process, set by
    ``ShardedUpdate.setup`` before the first step), so each process holds the state
    of its piece only."""

    def __init__(self, length: int | None) -> None:
        self.length = length
        self.made: list[SharedVariable] = []  # every state variable, step counter too

    def like(self, param: Any, name: str) -> SharedVariable:
        var = pytensor.shared(np.zeros(self.length or 0, dtype=param.dtype),
                              name=f"piece_{name}", shape=(self.length,))
        self.made.append(var)
        return var

    def scalar(self, dtype: str, name: str) -> SharedVariable:
        var = super().scalar(dtype, name)
        self.made.append(var)
        return var


class ShardedUpdate(abc.ABC):
    """The flat parameters, and the update of one process's piece of them.

    Made by :func:`sharded_update`, in the form that fits the session's values.

    Parameters
    ----------
    params : list of SharedVariable
        The parameters, of one dtype.
    grad_shared : SharedVariable
        The rule's flat gradient vector.
    grad_flat : Variable
        The rule's expression of the gradient written into it.
    update_rule : callable
        A rule of :mod:`synkhronos.extensions.updates` (``rule_name`` finds it).
    rule_args, hyper
        The rule's hyper-parameters, positional and by name, as the user gave them.
    compile_kwargs : dict
        Passed to ``synk.function``.
    exchange : {None, "bf16", "fp16"}
        The gradient's exchange: exact (None) or rounded to 16 bits
        (``synk.steps.reduce_scatter(..., exchange=...)``).

    Attributes
    ----------
    grad_shared : SharedVariable
        The flat gradient vector the training step's gradient call writes (and the
        reduce-scatter combines).
    grad_flat : Variable
        The gradient call's expression for it.
    params_flat : SharedVariable
        The parameters, flat, in ``params`` order.
    apply_function : synkhronos.Function
        The rule on one process's piece (``InPlaceUpdate``: of the variables viewing
        it; ``EvenPieceUpdate``: given one scattered row per process, its bounds).
    state : list of SharedVariable
        Each process's piece of the rule state, in the order the rule makes it (a
        step counter is whole in every process).
    pieces : list of (int, int)
        After ``setup``: each process's ``(start, stop)`` of ``params_flat``, by rank.
    before_gradient : list of synkhronos.steps.Step
        After ``setup``: the steps that start a training step (see the module).
    """

    def __init__(self, params: list[SharedVariable], grad_shared: SharedVariable,
                 grad_flat: Variable, update_rule: Any, rule_args: Sequence[Any],
                 hyper: dict[str, Any], compile_kwargs: dict[str, Any], *,
                 exchange: str | None = None) -> None:
        self._exchange = exchange
        self._params = params
        self._name = update_rule.__name__
        self._compile_kwargs = compile_kwargs
        self.grad_shared, self.grad_flat = grad_shared, grad_flat
        state = _PieceState(self._state_length())
        inputs, piece, grads, target, write = self._piece_of()
        new, extra = updates.MATH[self._name]([piece], [grads], state,
                                              **_hyper_of(update_rule, rule_args, hyper))
        value = new[0] if new[0].dtype == piece.dtype else pt.cast(new[0], piece.dtype)
        # (InPlaceUpdate: the piece's variable views params_flat, whose own
        # identity update says so to PyTensor and to synkhronos, which then knows
        # params_flat as a variable of a distributed function: no copy is made)
        also = [] if target is self.params_flat else [(self.params_flat, self.params_flat)]
        self.apply_function: Function = function(
            inputs, updates=[(target, write(value)), *also] + extra,
            name=f"train_apply_piece_{self._name}", **compile_kwargs,
        )
        self.state: list[SharedVariable] = state.made
        self.before_gradient: list[synk_steps.Step] = []

    # -- the form's own parts -------------------------------------------------------------
    @abc.abstractmethod
    def _state_length(self) -> int | None:
        """The length of each process's piece of the state (None: it differs)."""

    @abc.abstractmethod
    def _piece_of(self) -> tuple[list[Variable], Variable, Variable, Variable, Any]:
        """Make ``params_flat``; return the update's inputs, this process's piece of
        the parameters and of the gradient, the shared variable the update writes, and
        how the piece's new value is written into it."""

    @abc.abstractmethod
    def _apply(self) -> list[synk_steps.Step]:
        """The steps that run ``apply_function`` on each process's piece."""

    @abc.abstractmethod
    def _after_gather(self) -> list[synk_steps.Step]:
        """The steps that give every parameter its place of ``params_flat`` again."""

    # -- the same in both forms -------------------------------------------------------------
    def setup(self) -> None:
        """Once the functions are distributed: each process's piece's bounds, its
        piece of the rule state (zeroed), and the steps of a training step."""
        self.pieces = synk_steps.pieces(self.params_flat)
        self.zero_state()
        self._reduce = synk_steps.reduce_scatter(self.grad_shared, op="sum",
                                                 exchange=self._exchange)
        self._gather = synk_steps.all_gather_pieces(self.params_flat)

    def update_steps(self) -> list[synk_steps.Step]:
        """The steps after the gradient call: exchange, apply, gather, parameters."""
        return [self._reduce, *self._apply(), self._gather, *self._after_gather()]

    def zero_state(self) -> None:
        """Zero every process's piece of the rule state, as a fresh rule has it.

        Collective: every process takes part; returns when all have finished.
        """
        lengths = {stop - start for start, stop in self.pieces}
        for var in self.state:
            dtype = var.type.dtype
            if var.ndim == 0:  # a step counter: the same in every process
                broadcast(var, np.zeros((), dtype=dtype))
            elif len(lengths) == 1:  # pieces of one length: one command
                broadcast(var, np.zeros(next(iter(lengths)), dtype=dtype))
            else:
                for rank, (start, stop) in enumerate(self.pieces):
                    set_value(rank, var, np.zeros(stop - start, dtype=dtype))


class InPlaceUpdate(ShardedUpdate):
    """The sharded update on values that view one another (``device="cpu"``): every
    parameter views its place in ``params_flat``, and so do two variables of each
    process's piece of it and of ``grad_shared``, which the rule updates in place.

    Updating the piece's own variable, PyTensor runs the rule's elementwise
    arithmetic in place on its storage: one pass over the piece. (Written into a slice
    of ``params_flat`` by ``set_subtensor`` it took a new array and a copy: 0.80 ms
    against 0.31 ms for half of 1.86 M float32 on the 2-core machine.)"""

    def _state_length(self) -> int | None:
        return None

    def _piece_of(self) -> tuple[list[Variable], Variable, Variable, Variable, Any]:
        values = [np.asarray(p.get_value(borrow=True)).ravel() for p in self._params]
        self.params_flat = pytensor.shared(np.concatenate(values), name="params_flat")
        dtype = self.grad_shared.type.dtype
        self._piece = pytensor.shared(np.zeros(0, dtype=values[0].dtype),
                                      name="params_piece", shape=(None,))
        self._grad_piece = pytensor.shared(np.zeros(0, dtype=dtype), name="grad_piece",
                                           shape=(None,))
        return [], self._piece, self._grad_piece, self._piece, lambda new: new

    def setup(self) -> None:
        super().setup()
        self.before_gradient = [synk_steps.views(self.params_flat, self._params, True)]
        self._views_out = synk_steps.views(self.params_flat, self._params, False)
        # before the update, the pieces view their places (a gather or a set value may
        # have moved them); after it, a piece the update did not write in place (a
        # backend that copies) gives its value to params_flat
        self._views_in = [synk_steps.piece_view(self.grad_shared, self._grad_piece),
                          synk_steps.piece_view(self.params_flat, self._piece)]
        self._written = synk_steps.piece_view(self.params_flat, self._piece, copy_in=True)
        # every process's params_flat views one buffer: each piece, updated in place
        # there, is read where it lies (no process copies the others' pieces)
        self._gather = synk_steps.all_gather_pieces(self.params_flat, common=True)

    def _apply(self) -> list[synk_steps.Step]:
        return [*self._views_in, synk_steps.call(self.apply_function), self._written]

    def _after_gather(self) -> list[synk_steps.Step]:
        return [self._views_out]


class EvenPieceUpdate(ShardedUpdate):
    """The sharded update on JAX arrays (static shapes, nothing viewed): the flat
    vectors padded to ``n`` pieces of one length, the rule on one piece at a traced
    offset, and each parameter copied out of ``params_flat`` after the all-gather."""

    def __init__(self, params: list[SharedVariable], grad_shared: SharedVariable,
                 grad_flat: Variable, *args: Any, **kwargs: Any) -> None:
        self._size = int(grad_shared.get_value(borrow=True).size)
        dtype = grad_shared.type.dtype
        self._length = synk_steps.piece_length(self._size, dtype)
        padded = n_parallel() * self._length
        # The gradient call writes every parameter's place of the padded vector, as the
        # rule's expression writes the rule's vector, and zeros into the padding.
        padded_grad = pytensor.shared(np.zeros(padded, dtype=dtype), name="grad_shared")
        expression = clone_replace(grad_flat, replace={grad_shared: padded_grad})
        if padded > self._size:
            expression = pt.set_subtensor(expression[self._size:],
                                          np.zeros(padded - self._size, dtype=dtype))
        super().__init__(params, padded_grad, expression, *args, **kwargs)
        self._params_out: Function = function(
            [], updates=[(p, self.params_flat[start:stop].reshape(shape))
                         for p, (start, stop, shape) in zip(params, _offsets(params),
                                                            strict=True)],
            name=f"train_params_out_{self._name}", **self._compile_kwargs,
        )

    def _state_length(self) -> int | None:
        return self._length

    def _piece_of(self) -> tuple[list[Variable], Variable, Variable, Variable, Any]:
        bounds = pt.lmatrix("piece")  # one scattered row per process: (start, stop)
        dtype = self.grad_shared.type.dtype
        padding = np.zeros(self.grad_shared.get_value(borrow=True).size - self._size,
                           dtype=dtype)
        values = [np.asarray(p.get_value(borrow=True)).ravel() for p in self._params]
        self.params_flat = pytensor.shared(np.concatenate(values + [padding]),
                                           name="params_flat")
        # The parameters as they are now (set since the last step, or not), flat and
        # padded; the piece is L elements from a traced offset (an index vector: JAX
        # slices only at static bounds).
        current = pt.concatenate([p.ravel() for p in self._params]
                                 + ([pt.constant(padding)] if padding.size else []))
        index = bounds[0, 0] + pt.arange(self._length, dtype="int64")
        return ([bounds], current[index], self.grad_shared[index], self.params_flat,
                lambda new: pt.set_subtensor(current[index], new))

    def setup(self) -> None:
        super().setup()
        self._bounds = synk_data(np.asarray(self.pieces, dtype=np.int64))
        expected = [(r * self._length, (r + 1) * self._length) for r in range(len(self.pieces))]
        assert self.pieces == expected, (self.pieces, expected)  # steps.piece_length's promise

    def _apply(self) -> list[synk_steps.Step]:
        return [synk_steps.call(self.apply_function, self._bounds)]

    def _after_gather(self) -> list[synk_steps.Step]:
        return [synk_steps.call(self._params_out)]


def in_place(compile_kwargs: dict) -> bool:
    """Whether the sharded update can run in place here: values that view one another
    (``device="cpu"``), functions of a backend other than JAX (the mode given, or
    PyTensor's default one)."""
    if device() != "cpu":
        return False
    mode = compile_kwargs.get("mode")
    try:
        linker = get_mode(mode).linker
    except Exception:  # (a mode PyTensor does not know: the function's compile says so)
        return str(mode).upper() != "JAX"
    return not isinstance(linker, JAXLinker)


def sharded_update(params: list[SharedVariable], grad_shared: SharedVariable,
                   grad_flat: Variable, update_rule: Any, rule_args: Sequence[Any],
                   hyper: dict[str, Any], compile_kwargs: dict[str, Any], *,
                   exchange: str | None = None) -> ShardedUpdate:
    """The sharded update in the form that fits this session's values: in place where
    they view one another, in pieces of one length on the JAX backend."""
    form = InPlaceUpdate if in_place(compile_kwargs) else EvenPieceUpdate
    return form(params, grad_shared, grad_flat, update_rule, rule_args, hyper,
                compile_kwargs, exchange=exchange)
