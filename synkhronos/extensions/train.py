"""make_train_function(): one callable training step, exact for any split of the rows.

This module owns the training step built on an update rule of
:mod:`synkhronos.extensions.updates`. One ``train(*data, batch=..., num_slices=...)``
is one command (:mod:`synkhronos.steps`): the workers go from the gradient to the
exchange to the update without a round trip to the master.

1. ``grad_function`` (scattered ``inputs``, one broadcast scalar ``total``): each
   process writes ``grad(loss * rows / total)`` into the flat vector ``grad_shared``,
   where ``rows`` is the number of rows it ran and ``total`` the minibatch's (piece by
   piece, in place: see ``flatten_gradients``); with ``num_slices > 1`` the update
   op ``"sum"`` adds the slices' contributions. It also returns the loss, averaged
   over processes weighted by rows. Summed over processes, ``grad_shared`` is the
   mean gradient over the whole minibatch.
2. Sharded (the default with several processes on ``device="cpu"``; built and held
   by ``_sharded``): ``reduce_scatter(grad_shared, "sum")`` leaves each process the
   summed gradient of its piece of the parameters; ``apply_function`` applies the
   rule to that piece of ``params_flat`` (and of the rule's state, which each process
   holds for its piece only); ``all_gather_pieces`` copies every new piece into every
   process's ``params_flat``, which every parameter views (on the JAX backend, whose
   arrays view nothing and whose shapes are static: the vectors are padded to pieces
   of one length, and a last call copies each parameter out of ``params_flat``).
   Unsharded: ``all_reduce(grad_shared, "sum")``, then every process applies the rule
   to every parameter. With ``exchange="bf16"``/``"fp16"`` either exchange rounds each
   process's gradient to 16 bits first and sums the rounded gradients in float32
   (``synk.all_reduce``'s ``exchange``); the step is then that much off the serial rule.

Either way every process ends with the same parameters, equal (to round-off) to the
rule run in one plain PyTensor process on the same minibatches however the rows
split, provided ``loss`` is a mean over rows. That is what lets ``balance=True``
split a step's rows by measured speed (``steps.Balancer``: each step's gradient call is
timed per process, and the next steps' rows follow the processes' rows per second).
A process given no rows (a minibatch shorter than ``n_parallel``) does not run step
1, so a step that zeroes ``grad_shared`` in every process comes first then.

Checkpoints (``state_dict`` / ``load_state_dict``, laid out by ``_checkpoint``) speak
one layout whatever the form and the number of processes: each parameter, and each
piece of rule state shaped as its parameter (``state/<kind>/<parameter>``), plus the
step counter. Sharded, the state's pieces are gathered from (and cut again into) the
processes' pieces of the flat vector; unsharded, the master's copy is every process's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable

from .. import Function, broadcast, distribute, function, n_parallel
from .. import steps as synk_steps
from ._checkpoint import Checkpoint
from ._dot_into import accumulating, products_into_place
from ._sharded import ShardedUpdate, in_place, obstacles, rule_name, sharded_update
from .updates import RULES, UpdateRule, _check_loss, _check_params, _flat_dtype, _offsets

__all__ = ["TrainFunction", "make_train_function", "make_train_function_pytensor",
           "make_train_function_theano"]


def _resolve_rule(update_rule: Any) -> UpdateRule:
    if isinstance(update_rule, str):
        rule = RULES.get(update_rule)
        if rule is None:
            raise ValueError(f"update_rule must name one of {', '.join(RULES)}; "
                             f"got {update_rule!r}")
        return rule
    if callable(update_rule):  # a rule of updates, or the user's with the same contract
        return update_rule
    raise TypeError(f"update_rule must be a rule of synkhronos.extensions.updates (or a "
                    f"callable with its contract) or a rule's name; got {update_rule!r}")


def _selected(data: Any, batch: Any) -> int | None:
    """The number of rows ``batch`` selects from ``data`` (None if it cannot tell: the
    gradient call then raises the right error before anything moves)."""
    try:
        length = len(data)
        if batch is None:
            return length
        if isinstance(batch, (int, np.integer)) and not isinstance(batch, bool):
            return int(batch)
        if isinstance(batch, slice):
            return len(range(*batch.indices(length)))
        return len(batch)
    except TypeError:
        return None


class TrainFunction:
    """One data-parallel training step; built by :func:`make_train_function`.

    Two forms, the same result:

    - **sharded** (the default with more than one process on ``device="cpu"``, for
      the rules of :mod:`~synkhronos.extensions.updates`): the flat gradient is
      reduce-scattered, so each process holds the minibatch's gradient for its piece
      of the parameters; each applies the rule to its piece only, its rule state
      (momentum, Adam's moments) for that piece only (1/n of the state per process);
      the new pieces are all-gathered into every process's flat parameter vector,
      which every parameter views (so no parameter is copied). ZeRO stage 1, as
      PyTorch's ZeroRedundancyOptimizer. On the JAX backend (``device="gpu"``,
      ``mode="JAX"``) every piece has one length, ``synk.steps.piece_length`` (the
      flat vectors padded at the end with zeros), and each parameter is copied out
      of the flat vector after the gather: JAX arrays view nothing.
    - **unsharded**: the gradient is all-reduced and every process applies the rule
      to every parameter.

    Either way a step is one command.

    Attributes
    ----------
    grad_function : synkhronos.Function
        Step 1: inputs + a broadcast scalar (the minibatch's row count); returns the
        loss; writes the row-weighted gradient into ``grad_shared``.
    apply_function : synkhronos.Function
        The update: unsharded, no inputs (the rule over every parameter); sharded, one
        scattered row per process (its piece's bounds).
    grad_shared : SharedVariable
        The flat gradient vector (scratch: overwritten by every call). After a step it
        holds the minibatch's mean gradient: whole in every process (unsharded), or
        each process's piece of it (sharded; on the JAX backend padded with zeros to
        ``n`` pieces of one length).
    params : list of SharedVariable
    params_flat : SharedVariable or None
        Sharded: the parameters, flat, in ``params`` order (each parameter views its
        place in it; on the JAX backend it is copied out of it after each step, and
        the vector is padded as ``grad_shared``).
    param_updates : list of (SharedVariable, Variable)
        The rule's updates (parameters and rule state) in the unsharded form.
    state : list of SharedVariable
        The rule's state variables (sharded: each process's piece of it).
    sharded : bool
    exchange : {None, "bf16", "fp16"}
        The gradient's exchange: exact (None), or rounded to 16 bits.
    update_rule : callable
        The rule, from :mod:`synkhronos.extensions.updates`.
    inputs : list of Variable
        The scattered inputs, in the order ``train`` takes its data (with givens
        slicing shared variables: the scalar inputs).
    form : {"inputs", "slice", "sliceable"}
        Where a step's rows come from: scattered ``inputs``; ``givens`` slicing
        shared variables by scalar inputs (the Theano tutorials' pattern); or
        ``sliceable_shareds`` selected by ``batch_s``.
    balancer : object or None
        With ``balance=True`` and several processes: each process's measured speed;
        ``balancer.in_use`` is the split in use (each process's share of the rows,
        None while it is still the even split), ``balancer.changes`` how often it
        moved. Otherwise None.
    """

    def __init__(self, loss: Variable, params: Sequence[SharedVariable],
                 inputs: Sequence[Variable], update_rule: UpdateRule,
                 hyper: dict[str, Any], compile_kwargs: dict[str, Any] | None = None,
                 rule_args: Sequence[Any] = (), sharded: bool | None = None,
                 givens: Any = None, sliceable_shareds: Any = None,
                 balance: bool = False, exchange: str | None = None,
                 chunks: int | None = None) -> None:
        compile_kwargs = dict(compile_kwargs or {})
        if not isinstance(balance, bool):
            raise TypeError(f"balance must be True or False; got {balance!r}")
        if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int)
                                   or chunks < 1):
            raise ValueError(f"chunks must be None or an int >= 1; got {chunks!r}")
        self.chunks = chunks
        self.exchange = _check_exchange(exchange)
        if isinstance(inputs, Variable):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple)):
            raise TypeError(f"inputs must be a list of variables scattered along axis 0; "
                            f"got {type(inputs).__name__}")
        self.update_rule = update_rule
        loss, self.params = _check_loss(loss), _check_params(params)
        self.inputs = list(inputs)
        dtype = _flat_dtype(self.params)
        self._givens = list(givens.items()) if isinstance(givens, dict) else list(givens or [])
        self._sliceable = sliceable_shareds
        self.form = _data_form(self.inputs, self._givens, sliceable_shareds)
        if chunks is not None and balance:
            raise ValueError("chunks share each step's rows out as the processes come free; "
                             "balance=True fixes them by measured speed: give one or the "
                             "other")
        if chunks is not None and (self.form != "inputs" or not in_place(compile_kwargs)):
            raise ValueError("chunks need the rows as scattered inputs and values updated in "
                             "place (device='cpu', not mode='JAX'): each chunk's gradient "
                             "is added into the process's gradient vector where it lies")
        if balance and self.form == "sliceable":
            raise ValueError("balance=True splits each step's rows by measured speed, but "
                             "with sliceable_shareds batch_s chooses each process's rows: "
                             "leave balance off, or give the rows as inputs")
        # Measured every step (two clock readings per process), balanced from the
        # middle of the last steps' timings: ``steps.Balancer``.
        self.balancer = synk_steps.Balancer(n_parallel()) if balance and n_parallel() > 1 else None
        rows, self._total = self._row_counts(dtype)
        # The rule differentiates the loss weighted by this process's share of the
        # minibatch: the weight scales the gradient's seed, with no pass over the
        # gradient itself.
        weighted = loss * (rows / self._total)
        result = update_rule(weighted, self.params, *rule_args, **hyper)
        try:
            grad_updates, param_updates, grad_shared = result
            ok = (len(grad_updates) == 1 and grad_updates[0][0] is grad_shared
                  and isinstance(grad_shared, SharedVariable))
        except (TypeError, ValueError, IndexError):
            ok = False
        if not ok:
            raise TypeError(
                f"update_rule {getattr(update_rule, '__name__', update_rule)!r} must return "
                "one gradient update into one flat shared vector, (grad_updates, "
                "param_updates, grad_shared), as the rules of synkhronos.extensions.updates "
                "do (sgd_nonflat does not: build that step by hand)"
            )
        (_, flat), = grad_updates
        if in_place(compile_kwargs):  # (JAX arrays are written by no one in place)
            flat = products_into_place(flat, grad_shared, _offsets(self.params))
        if self.exchange is not None and grad_shared.type.dtype != "float32":
            raise TypeError(f"exchange={self.exchange!r} rounds float32 gradients; "
                            f"these parameters' gradient is {grad_shared.type.dtype} "
                            "(leave exchange=None)")
        self.param_updates = param_updates
        name = update_rule.__name__
        self.sharded = self._choose_sharded(sharded, compile_kwargs)
        self.params_flat: SharedVariable | None = None
        self._piece_update: ShardedUpdate | None = None
        if self.sharded:
            # (on the JAX backend the gradient goes into a padded vector of its own)
            self._piece_update = sharded_update(self.params, grad_shared, flat, update_rule,
                                                rule_args, hyper, compile_kwargs,
                                                exchange=self.exchange)
            grad_shared, flat = self._piece_update.grad_shared, self._piece_update.grad_flat
            self.params_flat = self._piece_update.params_flat
            self.apply_function = self._piece_update.apply_function
            self.state = self._piece_update.state
        else:
            self.apply_function = function([], updates=param_updates,
                                           name=f"train_apply_{name}", **compile_kwargs)
            targets = {id(p) for p in self.params}
            self.state = [var for var, _ in param_updates if id(var) not in targets]
        self.grad_shared = grad_shared
        # In chunks: each chunk's gradient added into grad_shared, which the step zeroes
        # first (``accumulating``: BLAS with beta = 1 on the slot itself)
        self._grad_add_function: Function | None = None if chunks is None else function(
            self.inputs, loss, bcast_inputs=[self._total],
            updates=[(grad_shared, accumulating(flat, grad_shared, _offsets(self.params)),
                      "sum")],
            name=f"train_grad_chunks_{name}", **compile_kwargs,
        )
        self.grad_function: Function = function(
            self.inputs, loss,
            bcast_inputs=[self._total] if self.form == "inputs" else None,
            updates=[(grad_shared, flat, "sum")], givens=self._givens or None,
            sliceable_shareds=sliceable_shareds,
            name=f"train_grad_{name}", **compile_kwargs,
        )
        self._count_function: Function | None = None
        if self.form == "sliceable":
            # each process's row count, summed over processes before the gradient call
            assert isinstance(self._total, SharedVariable)
            self._count_function = function(
                [], updates=[(self._total, pt.cast(rows, dtype))],
                givens=self._givens or None, sliceable_shareds=sliceable_shareds,
                name=f"train_rows_{name}",
                **dict(compile_kwargs, on_unused_input="ignore"))  # the labels' rows
        zeroed = [(grad_shared, pt.zeros_like(grad_shared))]
        if self.form == "sliceable":  # a process with no rows adds no stale count
            zeroed.append((self._total, pt.zeros_like(self._total)))
        self._zero_function: Function = function(
            [], updates=zeroed, name=f"train_zero_{name}", **compile_kwargs,
        )
        self._checkpoint = Checkpoint(self.params, self.state, name,
                                      rule_name(update_rule) is not None, self.sharded)
        self._ready = False
        self._steps: dict[str, synk_steps.Step] = {}

    def _row_counts(self, dtype: str) -> tuple[Variable, Variable]:
        """This process's rows in a step, and the minibatch's (an input, an expression
        of the slice's bounds, or a shared scalar summed over processes each step)."""
        if self.form == "inputs":
            return pt.cast(self.inputs[0].shape[0], dtype), pt.scalar("total_rows", dtype=dtype)
        key, value = self._givens[0]  # the first given's rows are the minibatch's
        rows = pt.cast(key.shape[0], dtype)
        if self.form == "slice":
            # the slice of the whole shared variable, as the serial function takes it:
            # every process evaluates its length (the shared variable itself is not
            # replaced; only the given's value is, by each process's block)
            return rows, pt.cast(value.shape[0], dtype)
        return rows, pytensor.shared(np.zeros((), dtype=dtype), name="train_total_rows")

    def _choose_sharded(self, sharded: bool | None, compile_kwargs: dict) -> bool:
        """As asked; by default sharded with several processes where the update runs
        in place (see ``make_train_function``), unless impossible
        (``_sharded.obstacles``)."""
        reasons = obstacles(self.update_rule, self.params)
        if sharded is None:
            return n_parallel() > 1 and in_place(compile_kwargs) and not reasons
        if sharded and reasons:
            raise ValueError(f"sharded=True is not possible here: {'; '.join(reasons)}")
        return bool(sharded)

    def reset_state(self) -> None:
        """Zero the rule's state (velocities, moments, Adam's step count) in every
        process, as a fresh rule has it.

        Collective: every process takes part; returns when all have finished.
        """
        if not self._ready or not self.state:
            return  # nothing has run (the state is as made), or the rule keeps none
        if self._piece_update is not None:
            self._piece_update.zero_state()
        else:
            broadcast(self.state, [np.zeros_like(var.get_value(borrow=True))
                                   for var in self.state])

    def _setup(self) -> None:
        """First call: distribute, and (sharded) give each process its piece's bounds
        and its piece of the rule state."""
        distribute()
        if self._piece_update is not None:
            self._piece_update.setup()
        else:
            self._steps["reduce"] = synk_steps.all_reduce(self.grad_shared, op="sum",
                                                          exchange=self.exchange)
        if self._count_function is not None:
            self._steps["count"] = synk_steps.all_reduce(self._total, op="sum")
        self._ready = True

    def __call__(self, *data: Any, batch: Any = None, batch_s: Any = None,
                 num_slices: int = 1, shares: Any = None) -> np.ndarray:
        """Take one step on the selected rows; return their mean loss.

        Collective: every process takes part; returns when all have finished.

        Parameters
        ----------
        *data : synk.Data or array_like
            One value per input, all of the same length along axis 0 (with ``givens``
            slicing shared variables: the scalar inputs, e.g. the minibatch index).
        batch : None, int, slice or 1-d array of int, optional
            The minibatch's rows, as for a ``synk.Function`` call.
        batch_s : slice, index array, or a list of them (one per process), optional
            With ``sliceable_shareds``: each process's rows of them, as for a
            ``synk.Function`` call.
        num_slices : int, optional
            Slices each process runs its rows in (to bound memory); same result.
        shares : sequence of float, optional
            Each process's share of the minibatch's rows, as for a ``synk.Function``
            call (one positive number per process); with ``balance=True``, the
            measured shares are used when this is None. Same result.

        Returns
        -------
        np.ndarray
            The loss over the minibatch (0-d), equal to the serial loss.

        Raises
        ------
        TypeError
            If the number of data arguments is not the number of inputs.
        ValueError
            If the batch selects no rows, or as a ``synk.Function`` call would.
        """
        if len(data) != len(self.inputs):
            raise TypeError(f"train takes one data argument per input ({len(self.inputs)}); "
                            f"got {len(data)}")
        if batch_s is not None and self.form != "sliceable":
            raise ValueError("batch_s selects rows of sliceable_shareds, but this training "
                             "step was built without them")
        if shares is not None and self.form == "sliceable":
            raise ValueError("shares split a step's rows, but with sliceable_shareds batch_s "
                             "chooses each process's rows")
        total = _selected(data[0], batch) if self.form == "inputs" else None
        if total == 0:
            raise ValueError("the minibatch selects no rows; a training step needs at least one")
        if not self._ready:
            self._setup()
        n = n_parallel()
        steps = []
        if self._piece_update is not None:
            # a parameter set since the last step: its value counts
            steps += self._piece_update.before_gradient
        chunked = self._grad_add_function is not None and num_slices == 1 and shares is None
        if chunked or (total is not None and total < n) or (self.form != "inputs" and n > 1):
            # some process runs nothing in the gradient call: its old gradient must not
            # count (with data in shared variables, the master does not know the rows)
            steps.append(synk_steps.call(self._zero_function))
        if self._count_function is not None:
            steps += [synk_steps.call(self._count_function, batch_s=batch_s),
                      self._steps["count"]]
        grad_at = len(steps)
        extra = ((np.asarray(total or 1, dtype=self.grad_shared.type.dtype),)
                 if self.form == "inputs" else ())
        balancer = self.balancer
        if shares is None and balancer is not None:
            shares = balancer.shares()
        if chunked:
            steps.append(synk_steps.call(self._grad_add_function, *data, *extra, batch=batch,
                                         chunks=self.chunks))
        else:
            steps.append(synk_steps.call(
                self.grad_function, *data, *extra, batch=batch, batch_s=batch_s,
                num_slices=num_slices, shares=shares,
                timings=None if balancer is None else balancer.record,
            ))
        if self._piece_update is not None:
            steps += self._piece_update.update_steps()
        else:
            if n > 1 or self.exchange is not None:  # (one process: only to round)
                steps.append(self._steps["reduce"])
            steps.append(synk_steps.call(self.apply_function))
        results = synk_steps.run(steps)  # one command: every process goes straight through
        return results[grad_at]

    # -- checkpoints ----------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """The parameters and the rule's state, as numpy arrays in the master.

        Collective: every process takes part; returns when all have finished
        (sharded: each process's piece of the rule state is gathered). Distributes the
        functions first if no step has run yet.

        Returns
        -------
        dict of str to numpy.ndarray
            ``"params/<name>"``: each parameter's value; ``"state/<kind>/<name>"``:
            the rule's state for that parameter (``velocity``, ``accumulator``,
            ``delta_accumulator``, ``m``, ``v``, ``u``), shaped as the parameter;
            ``"state/t"``: the step counter of ``adam`` and ``adamax``. ``<name>`` is
            the parameter's name, or ``#<index>`` where names are missing or repeated.
            The same keys and shapes whether the update is sharded or not and whatever
            the number of processes, so the dict loads into any of them. For an update
            rule of the user's own (not one of
            :mod:`~synkhronos.extensions.updates`) the state is keyed by position,
            ``"state/<index>"``. Hyper-parameters (the learning rate, ...) are not in
            it: they belong to the function being built. Copies: later steps do not
            change them.

        Examples
        --------
        >>> np.savez("checkpoint.npz", **train.state_dict())    # doctest: +SKIP
        >>> with np.load("checkpoint.npz") as saved:             # doctest: +SKIP
        ...     train.load_state_dict(dict(saved))
        """
        if not self._ready:
            self._setup()
        return self._checkpoint.save()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set the parameters and the rule's state in every process from ``state``.

        Collective: every process takes part; returns when all have finished.

        ``state`` is what :meth:`state_dict` returned, here or in another session:
        with another number of processes, or the other ``sharded`` choice. Training
        on from it gives what training without the break would have given (to
        rounding).

        Parameters
        ----------
        state : dict of str to array_like
            Exactly the keys of :meth:`state_dict`, each value of its shape; values
            are cast to the variables' dtypes where numpy casts them safely within a
            kind (float64 to float32 included).

        Raises
        ------
        ValueError
            If ``state`` comes from another model or rule: keys missing or extra
            (other parameter names, another rule), or a value of another shape.
            Nothing is changed then.
        TypeError
            If ``state`` is not a dict, or a value cannot be cast to its variable's
            dtype (a float into an integer counter's place is refused likewise).
            Nothing is changed then.
        """
        param_values, state_values = self._checkpoint.check(state)  # before anything moves
        if not self._ready:
            self._setup()
        pieces = None if self._piece_update is None else self._piece_update.pieces
        self._checkpoint.load(param_values, state_values, pieces)

    def __repr__(self) -> str:
        return f"<synk TrainFunction {self.update_rule.__name__}>"


def _check_exchange(exchange: Any) -> str | None:
    """``exchange`` checked when the step is built (the collective checks it again, with
    the same words, when the first step builds its exchange)."""
    if exchange is not None and not isinstance(exchange, str):
        raise TypeError(f"exchange must be None, 'bf16' or 'fp16'; got "
                        f"{type(exchange).__name__}")
    if exchange not in (None, "bf16", "fp16"):
        raise ValueError(f"exchange must be None (exact), 'bf16' or 'fp16'; got "
                         f"{exchange!r}")
    return exchange


def _data_form(inputs: list, givens: list, sliceable: Any) -> str:
    """Where a step's rows come from: ``"inputs"`` (scattered inputs), ``"slice"``
    (``givens`` slicing shared variables by scalar inputs, the Theano tutorials'
    pattern) or ``"sliceable"`` (``sliceable_shareds`` with ``batch_s``)."""
    if sliceable:
        if inputs:
            raise ValueError("with sliceable_shareds the rows come from them: inputs must "
                             "be empty (the rows of each step are chosen by batch_s)")
        if not givens:
            raise ValueError("sliceable_shareds need givens that put them in place of the "
                             "loss's inputs, givens=[(x, s_x), (y, s_y)]")
        return "sliceable"
    if inputs and all(var.ndim == 0 for var in inputs) and givens:
        return "slice"
    if not inputs:
        raise ValueError("inputs must hold at least one variable scattered along axis 0 "
                         "(the minibatch rows); got an empty list")
    return "inputs"


def _forms(inputs: Any, rest: tuple, what: str) -> tuple[list, Any, tuple]:
    """``(inputs, update_rule, rule_args)`` from today's form or the original's.

    Today's: ``(loss, params, inputs, update_rule, ...)``. The original Synkhronos':
    ``(loss, params, x, y, update_rule, *rule_args)``, told apart by a variable where
    today's form has its rule.
    """
    if rest and isinstance(rest[0], Variable):  # the original's x, y
        if len(rest) < 2:
            raise TypeError(f"{what}(loss, params, x, y, update_rule, ...) is missing "
                            "update_rule")
        return [inputs, rest[0]], rest[1], tuple(rest[2:])
    if not rest:
        raise TypeError(f"{what}() is missing update_rule")
    return inputs, rest[0], tuple(rest[1:])


def make_train_function(loss: Variable, params: Sequence[SharedVariable],
                        inputs: Sequence[Variable] | Variable, *rule_and_args: Any,
                        compile_kwargs: dict[str, Any] | None = None,
                        sharded: bool | None = None, givens: Any = None,
                        sliceable_shareds: Any = None, balance: bool = False,
                        chunks: int | None = None,
                        exchange: Literal["bf16", "fp16"] | None = None,
                        **hyper: Any) -> TrainFunction:
    """Build a data-parallel training step: gradient, all-reduce, update.

    Two call forms: today's ``make_train_function(loss, params, inputs, update_rule,
    **hyper)``, and the original Synkhronos' ``make_train_function(loss, params, x, y,
    update_rule, *args, **kwargs)`` (``args``/``kwargs`` go to the rule). Both give
    the same exact training step.

    Parameters
    ----------
    loss : scalar Variable
        The loss, a mean over the rows of ``inputs`` (so the row-weighted combination
        of the processes' gradients is the minibatch's gradient).
    params : list of SharedVariable
        The parameters to train.
    inputs : list of Variable
        Scattered along axis 0 across processes; ``train`` takes one value for each.
    update_rule : callable or str
        A rule of :mod:`synkhronos.extensions.updates` (``updates.adam``), its name
        (``"adam"``), or a callable with the same contract.
    compile_kwargs : dict, optional
        Passed to the underlying ``synk.function`` calls and so to
        ``pytensor.function`` (e.g. ``{"mode": "JAX"}``).
    sharded : bool, optional
        Shard the update (see :class:`TrainFunction`); possible with a rule of
        :mod:`~synkhronos.extensions.updates` and parameters of one dtype, on either
        device; ``False`` all-reduces the gradient and applies the rule in every
        process to every parameter. The same result either way. The default
        (``None``) shards with more than one process on ``device="cpu"`` (a backend
        other than JAX), where every parameter views the flat vector and nothing is
        copied. On ``device="gpu"`` (or ``mode="JAX"``) the default is unsharded:
        there sharding saves device memory (the rule state is 1/n per process) but
        costs time, since JAX arrays view nothing (each step also copies every
        parameter out of the flat vector) and the reduce-scatter and all-gather of
        pieces are staged through host memory, while with a GPU per process the
        unsharded step's all-reduce runs on NCCL without leaving the device. Pass
        ``sharded=True`` there when the rule state is what does not fit.
    givens : dict or list of pairs, optional
        Data held in shared variables, as for ``synk.function``: either givens that
        slice each minibatch out of shared variables with bounds from scalar
        ``inputs`` (the Theano tutorials' pattern; ``train(index)``), or, with
        ``sliceable_shareds``, givens that put those variables in place of the loss's
        inputs (``inputs=[]``; ``train(batch_s=...)``). The first given's variable
        counts the rows of a step.
    sliceable_shareds : list of SharedVariable, optional
        Shared variables holding each process's rows, selected by ``batch_s``.
    balance : bool, default False
        Give each process rows in proportion to its measured speed. A synchronous
        step waits for its slowest process, and which process is slower follows the
        core it runs on. Every step times each process's gradient on its rows; once
        every process has been timed over 16 steps (after 2 left out), each step's
        rows are split by the processes' rows per second (from the middle half of
        their last 32 timings; the split moves only when a share moves by more than
        half a percent of the rows). The result is the even split's up to
        floating-point rounding (each process's gradient is weighted by its rows),
        but which rows a process takes then depends on timing, so two runs may
        differ in the last bits. Not with ``sliceable_shareds`` (``batch_s`` chooses
        the rows there). The shares in use: ``train.balancer.in_use`` (None: the
        even split).
    chunks : int, optional
        Take each step's rows in this many chunks as the processes come free, instead
        of an even block each: every process runs the next chunk not yet taken (a
        shared counter) and adds its gradient into its exchange slot where it lies
        (BLAS with beta = 1), until none is left; the gradients are weighted by the
        rows each chunk had, so the step equals the even split's up to
        floating-point rounding, whatever process ran which chunk. A process slowed by
        another program beside it takes fewer chunks, and the others do not wait for
        it. Every chunk is a call of the gradient function, which pays what a call
        costs whatever its rows (reading every weight, writing every weight's
        gradient): for a model with large weights and few rows a process (the MLP of
        ``benchmarks/scaling.py`` at 256 rows) that is more than the wait it saves,
        and the even split stays faster; see the performance page's "Rows taken as
        the processes come free" for when it pays. Scattered ``inputs`` on
        ``device="cpu"`` only;
        not with ``balance``; a step called with ``num_slices`` or ``shares`` takes
        the even split. Which rows a process takes depends on timing, so two runs may
        differ in the last bits.
    exchange : {None, "bf16", "fp16"}
        None (default): the exact exchange of the gradient. ``"bf16"``/``"fp16"``: each
        process rounds its (row-weighted) gradient to bfloat16 or IEEE half before the
        exchange, and the rounded gradients are summed in float32 in rank order, as
        ``synk.all_reduce(..., exchange=...)`` does (PyTorch DDP's compression hooks);
        sharded or not, the same sums. The step is then no longer equal to the serial
        rule: each gradient keeps 8 (bf16) or 11 (fp16) significant bits; fp16 also
        loses gradients beyond 65504 or below 6e-8. With one process the gradient is
        rounded all the same. Float32 parameters only.
    **hyper
        The rule's hyper-parameters (``learning_rate=...`` or the original's
        ``lr=...``, ...); positional ones may follow ``update_rule``.

    Returns
    -------
    TrainFunction
        ``train(*data, batch=None, batch_s=None, num_slices=1, shares=None) -> loss``.
        Numerically equal to the
        same rule run in one PyTensor process on the same minibatches, for any split
        of the rows and any ``num_slices`` (the original averaged the processes'
        gradients equally, exact only on even splits). It is distributed on its first
        call (or by ``synk.distribute()``).

    Raises
    ------
    TypeError
        If ``update_rule`` is missing, neither a rule nor a rule's name, or a
        hyper-parameter is unknown to the rule.
    ValueError
        If ``update_rule`` names no rule, ``inputs`` is empty (without
        ``sliceable_shareds``), ``balance=True`` with ``sliceable_shareds``, or
        ``exchange`` names no format.
    TypeError
        Also if ``exchange`` is given for parameters that are not float32.
    RuntimeError
        Before ``synk.fork()``.

    Examples
    --------
    >>> train = make_train_function(loss, params, [x, y], "adam", learning_rate=1e-3)
    >>> xd, yd = synk.data(X), synk.data(Y)
    >>> for idx in np.array_split(np.random.permutation(len(X)), 100):
    ...     train(xd, yd, batch=idx)
    """
    inputs, update_rule, rule_args = _forms(inputs, rule_and_args, "make_train_function")
    return TrainFunction(loss, params, inputs, _resolve_rule(update_rule), hyper,
                         compile_kwargs, rule_args, sharded, givens, sliceable_shareds,
                         balance, exchange, chunks)


def make_train_function_pytensor(loss: Variable, params: Sequence[SharedVariable],
                                 inputs: Sequence[Variable] | Variable, *rule_and_args: Any,
                                 compile_kwargs: dict[str, Any] | None = None,
                                 **hyper: Any) -> Callable[..., np.ndarray]:
    """The same training step as plain PyTensor functions in this process alone.

    The serial program :func:`make_train_function` must match (the original's
    ``make_train_function_theano``; that name is an alias). Same call forms; returns
    ``train(*data) -> loss`` over whole arrays (slice the minibatch yourself), or, with
    ``givens=`` (passed to ``pytensor.function``), over what the givens select.
    """
    inputs, update_rule, rule_args = _forms(inputs, rule_and_args,
                                            "make_train_function_pytensor")
    rule = _resolve_rule(update_rule)
    inputs = [inputs] if isinstance(inputs, Variable) else list(inputs)
    givens = hyper.pop("givens", None)
    grad_updates, param_updates, _ = rule(loss, params, *rule_args, **hyper)
    kwargs = dict(compile_kwargs or {})
    grad_step = pytensor.function(inputs, loss, updates=grad_updates, givens=givens, **kwargs)
    apply_step = pytensor.function([], [], updates=param_updates, **kwargs)

    def train(*data: Any) -> np.ndarray:
        loss_value = grad_step(*data)
        apply_step()
        return loss_value

    return train


make_train_function_theano = make_train_function_pytensor
