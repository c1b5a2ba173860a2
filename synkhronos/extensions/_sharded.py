"""The sharded update of a training step: each process updates its piece of the parameters.

This module owns the sharded form of :class:`~synkhronos.extensions.train.TrainFunction`
(ZeRO stage 1, as PyTorch's ZeroRedundancyOptimizer): when a rule can run on a piece
(``obstacles``), the flat parameter vector that every parameter views, the update of
one process's piece of it, the rule state of that piece (1/n of the state per process),
and each process's piece bounds. The training step decides whether to shard and runs
the steps this module hands it, in one command per training step:

1. ``views_in``: a parameter set since the last step is copied into its place in
   ``params_flat`` (the parameters view it afterwards).
2. (The training step's gradient call writes ``grad_shared`` in every process.)
3. ``update_steps()``: ``reduce_scatter(grad_shared, "sum")`` leaves each process the
   summed gradient of its piece (with ``exchange=``, of the processes' gradients rounded
   to 16 bits); ``apply_function`` runs the rule's arithmetic
   (:data:`~synkhronos.extensions.updates.MATH`) on that piece of ``params_flat`` and
   of the state, given the piece's bounds as one scattered row per process;
   ``all_gather_pieces`` copies every new piece into every process's ``params_flat``;
   ``views_out`` makes every parameter view its place again.

The pieces are known only once the functions are distributed (``setup``), and the
state is made empty (its length differs per process) and zeroed there.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable

from .. import Function, broadcast, device, function, set_value
from .. import data as synk_data
from .. import steps as synk_steps
from . import updates
from .updates import RULES

__all__ = ["ShardedUpdate", "obstacles", "rule_name"]


def rule_name(update_rule: Any) -> str | None:
    """The name of a rule of ``updates`` (whose arithmetic can run on a piece)."""
    name = getattr(update_rule, "__name__", None)
    return name if name in updates.MATH and RULES.get(name) is update_rule else None


def obstacles(update_rule: Any, params: Sequence[SharedVariable],
              compile_kwargs: dict) -> list[str]:
    """Why the update cannot be sharded here (empty if it can): a rule of the user's
    own, parameters of several dtypes, or the JAX backend (``device="gpu"`` or
    ``mode="JAX"``: immutable arrays cannot be viewed and updated in place)."""
    reasons = []
    if rule_name(update_rule) is None:
        reasons.append("the rule is not one of synkhronos.extensions.updates")
    if len({p.type.dtype for p in params}) > 1:
        reasons.append("the parameters have several dtypes")
    if str(compile_kwargs.get("mode", "")).upper() == "JAX" or device() == "gpu":
        # each process updates its own piece, of its own size: JAX compiles static
        # shapes, and its arrays cannot be viewed and updated in place
        reasons.append("JAX arrays cannot be updated in place (device='gpu' or "
                       "mode='JAX')")
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
    vector whose length differs per process (set by ``ShardedUpdate.setup`` before
    the first step), so each process holds the state of its piece only."""

    def __init__(self) -> None:
        self.made: list[SharedVariable] = []  # every state variable, step counter too

    def like(self, param: Any, name: str) -> SharedVariable:
        var = pytensor.shared(np.zeros(0, dtype=param.dtype), name=f"piece_{name}",
                              shape=(None,))
        self.made.append(var)
        return var

    def scalar(self, dtype: str, name: str) -> SharedVariable:
        var = super().scalar(dtype, name)
        self.made.append(var)
        return var


class ShardedUpdate:
    """The flat parameters, and the update of one process's piece of them.

    Parameters
    ----------
    params : list of SharedVariable
        The parameters, of one dtype.
    grad_shared : SharedVariable
        The flat gradient vector the training step's gradient call writes.
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
    params_flat : SharedVariable
        The parameters, flat, in ``params`` order.
    apply_function : synkhronos.Function
        The rule on one process's piece: one scattered row per process, its bounds.
    state : list of SharedVariable
        Each process's piece of the rule state, in the order the rule makes it (a
        step counter is whole in every process).
    pieces : list of (int, int)
        After ``setup``: each process's ``(start, stop)`` of ``params_flat``, by rank.
    views_in : synkhronos.steps.Step
        After ``setup``: the step that starts a training step (see the module).
    """

    def __init__(self, params: list[SharedVariable], grad_shared: SharedVariable,
                 update_rule: Any, rule_args: Sequence[Any], hyper: dict[str, Any],
                 compile_kwargs: dict[str, Any], exchange: str | None = None) -> None:
        named = _hyper_of(update_rule, rule_args, hyper)
        self._exchange = exchange
        name = update_rule.__name__
        self._params = params
        self._grad_shared = grad_shared
        values = [np.asarray(p.get_value(borrow=True)).ravel() for p in params]
        self.params_flat = flat = pytensor.shared(np.concatenate(values), name="params_flat")
        bounds = pt.lmatrix("piece")  # one scattered row per process: (start, stop)
        start, stop = bounds[0, 0], bounds[0, 1]
        state = _PieceState()
        new, extra = updates.MATH[name]([flat[start:stop]], [grad_shared[start:stop]],
                                        state, **named)
        piece = new[0] if new[0].dtype == flat.dtype else pt.cast(new[0], flat.dtype)
        self.apply_function: Function = function(
            [bounds], updates=[(flat, pt.set_subtensor(flat[start:stop], piece))] + extra,
            name=f"train_apply_piece_{name}", **compile_kwargs,
        )
        self.state: list[SharedVariable] = state.made

    def setup(self) -> None:
        """Once the functions are distributed: each process's piece's bounds, its
        piece of the rule state (zeroed), and the steps of a training step."""
        self.pieces = synk_steps.pieces(self.params_flat)
        self._bounds = synk_data(np.asarray(self.pieces, dtype=np.int64))
        self.zero_state()
        self.views_in = synk_steps.views(self.params_flat, self._params, True)
        self._views_out = synk_steps.views(self.params_flat, self._params, False)
        self._reduce = synk_steps.reduce_scatter(self._grad_shared, op="sum",
                                                 exchange=self._exchange)
        self._gather = synk_steps.all_gather_pieces(self.params_flat)

    def update_steps(self) -> list[synk_steps.Step]:
        """The steps after the gradient call: exchange, apply, gather, view."""
        return [self._reduce, synk_steps.call(self.apply_function, self._bounds),
                self._gather, self._views_out]

    def zero_state(self) -> None:
        """Zero every process's piece of the rule state, as a fresh rule has it.

        Collective: every process takes part; returns when all have finished.
        """
        dtype = self.params_flat.type.dtype
        for var in self.state:
            if var.ndim == 0:  # a step counter: the same in every process
                broadcast(var, np.zeros((), dtype=var.type.dtype))
                continue
            for rank, (start, stop) in enumerate(self.pieces):
                set_value(rank, var, np.zeros(stop - start, dtype=dtype))
