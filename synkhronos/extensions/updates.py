"""First-order update rules split for data parallelism, with one flat gradient vector.

This module owns the update rules (``sgd``, ``momentum``, ``nesterov_momentum``,
``adagrad``, ``rmsprop``, ``adadelta``, ``adam``, ``adamax``; Lasagne's defaults and
formulas) and the flattening of all gradients into one shared vector. Every rule
returns ``(grad_updates, param_updates, grad_shared)`` and data moves in three steps:

1. ``grad_updates`` writes ``concatenate([g.ravel() for g in grads])`` into the one
   flat shared vector ``grad_shared`` (piece by piece, in place), in each process,
   from its own rows;
2. a collective combines ``grad_shared`` over the processes: one exchange per step,
   however many parameters there are;
3. ``param_updates`` splits ``grad_shared`` back into one piece per parameter by
   constant offsets (``grad_shared[o_i:o_i + size_i].reshape(shape_i)``) and applies
   the rule, in each process, to identical values, so the parameters stay identical.

The rule's state (velocities, moments, accumulators, Adam's timestep) lives in shared
variables the rule creates, zero-initialized, and updated by ``param_updates``.
Parameter shapes are read when the rule is built and must not change afterwards.

The recipe::

    grad_updates, param_updates, grad_shared = updates.adam(loss, params)
    f_grad = synk.function(inputs, loss, updates=grad_updates)
    f_apply = synk.function([], updates=param_updates)
    synk.distribute()
    for idx in minibatches:
        f_grad(*data, batch=idx)                 # each process: its rows' mean gradient
        synk.all_reduce(grad_shared, op="avg")   # plain mean over the processes
        f_apply()                                # each process: the same update

The original Synkhronos' helpers keep their names and return values
(``flatten_vars``, ``vars_flat_size``, ``unflatten_vars``, ``flat_unflat_grads``,
``nonflat_grads``, ``apply_momentum``, ``apply_nesterov_momentum``, ``sgd_nonflat``),
and every rule also takes its ``lr=`` for ``learning_rate=``.

``op="avg"`` in the all-reduce weights every process equally, so the combined
gradient is the full minibatch's mean gradient only when the rows split evenly over
the processes (and a process given no rows keeps its previous gradient in the
average). :func:`synkhronos.extensions.train.make_train_function` weights each
process by its rows and is exact for any split, ``num_slices`` included.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.scalar import upcast

__all__ = [
    "RULES",
    "MATH",
    "State",
    "UpdateRule",
    "flatten_gradients",
    "split_flat",
    "flatten_vars",
    "vars_flat_size",
    "unflatten_vars",
    "flat_unflat_grads",
    "nonflat_grads",
    "apply_momentum",
    "apply_nesterov_momentum",
    "sgd_nonflat",
    "sgd",
    "momentum",
    "nesterov_momentum",
    "adagrad",
    "rmsprop",
    "adadelta",
    "adam",
    "adamax",
]

Updates = list[tuple[SharedVariable, Variable]]
RuleResult = tuple[Updates, Updates, SharedVariable]
UpdateRule = Callable[..., RuleResult]
Hyper = float | Variable


def _check_loss(loss: Any) -> Variable:
    if not isinstance(loss, Variable):
        raise TypeError(f"loss must be a PyTensor variable; got {type(loss).__name__}")
    if getattr(loss.type, "ndim", None) != 0:
        raise ValueError(f"loss must be a scalar (0-d) variable; got {loss.type}")
    return loss


def _check_params(params: Any) -> list[SharedVariable]:
    if isinstance(params, SharedVariable):
        params = [params]
    if not isinstance(params, (list, tuple)):
        raise TypeError(f"params must be a list of shared variables; got "
                        f"{type(params).__name__}")
    if not params:
        raise ValueError("params must hold at least one shared variable; got an empty list")
    for i, param in enumerate(params):
        if not isinstance(param, SharedVariable):
            raise TypeError(f"params[{i}] must be a shared variable; got {param!r}")
        if any(param is other for other in params[:i]):
            raise ValueError(f"params[{i}] ({param}) appears more than once in params")
    return list(params)


def _offsets(params: Sequence[SharedVariable]) -> list[tuple[int, int, tuple[int, ...]]]:
    """``(start, stop, shape)`` of each parameter's piece of the flat vector."""
    pieces, start = [], 0
    for param in params:
        shape = tuple(np.shape(param.get_value(borrow=True)))
        size = int(np.prod(shape, dtype=np.int64))
        pieces.append((start, start + size, shape))
        start += size
    return pieces


def _flat_dtype(params: Sequence[SharedVariable]) -> str:
    """The flat vector's dtype: what concatenating the gradients gives (a gradient has
    its parameter's dtype)."""
    return upcast(*(param.dtype for param in params))


def flatten_gradients(loss: Variable, params: Sequence[SharedVariable]
                      ) -> tuple[Variable, SharedVariable]:
    """The gradients of ``loss`` as one flat expression, and the vector to hold it.

    The expression sets each parameter's gradient into its piece of ``grad_shared``
    (``set_subtensor``) rather than concatenating them into a new vector: as the
    update of ``grad_shared`` PyTensor then writes every piece in place into the
    variable's own buffer, which after the first all-reduce is the all-reduce's
    exchange slot, so the gradient is never copied again on its way there.

    Parameters
    ----------
    loss : scalar Variable
        The loss to differentiate.
    params : list of SharedVariable
        The parameters, in the order their pieces take in the flat vector.

    Returns
    -------
    flat : Variable
        ``grad_shared`` with ``grad(loss, p).ravel()`` set into each piece, in
        ``params`` order: ``concatenate([grad(loss, p).ravel() for p in params])``.
    grad_shared : SharedVariable
        A zero vector of ``flat``'s length and dtype, named ``"grad_shared"``.

    Raises
    ------
    TypeError
        If ``loss`` is not a variable or a parameter is not a shared variable.
    ValueError
        If ``loss`` is not 0-d, or ``params`` is empty or repeats a variable.
    """
    loss = _check_loss(loss)
    params = _check_params(params)
    pieces = _offsets(params)
    dtype = _flat_dtype(params)
    grad_shared = pytensor.shared(np.zeros(pieces[-1][1], dtype=dtype), name="grad_shared")
    flat = grad_shared
    for grad, (start, stop, _) in zip(pytensor.grad(loss, params), pieces, strict=True):
        piece = pt.as_tensor_variable(grad).ravel()
        flat = pt.set_subtensor(flat[start:stop], piece if piece.dtype == dtype
                                else pt.cast(piece, dtype))
    return flat, grad_shared


def split_flat(flat: Variable, params: Sequence[SharedVariable]) -> list[Variable]:
    """One piece of ``flat`` per parameter: constant-offset slices, reshaped and cast.

    Parameters
    ----------
    flat : 1-d Variable
        Laid out as :func:`flatten_gradients` lays out the gradients.
    params : list of SharedVariable
        The same parameters, in the same order.

    Returns
    -------
    list of Variable
        Piece ``i`` has parameter ``i``'s shape (read now) and dtype.
    """
    params = _check_params(params)
    pieces = []
    for param, (start, stop, shape) in zip(params, _offsets(params), strict=True):
        piece = flat[start:stop].reshape(shape)
        pieces.append(piece if piece.dtype == param.dtype else pt.cast(piece, param.dtype))
    return pieces


# -- the original Synkhronos' helpers, with its names and return values -----------------
def flatten_vars(variables: Sequence[Variable]) -> Variable:
    """All ``variables`` flattened and joined into one vector, in order.

    The original Synkhronos' helper, for an all-reduce of one buffer instead of one per
    variable. Works on any tensor variables (gradients, shared variables).
    """
    return pt.concatenate([pt.as_tensor_variable(v).ravel() for v in variables])


def vars_flat_size(variables: Sequence[SharedVariable]) -> int:
    """The total number of items of the shared ``variables`` (their current values)."""
    return sum(int(np.size(v.get_value(borrow=True))) for v in variables)


def unflatten_vars(flat_var: Variable, variables: Sequence[SharedVariable]) -> list[Variable]:
    """One piece of the 1-d ``flat_var`` per shared variable, reshaped to its shape.

    The inverse of :func:`flatten_vars` for shared variables (shapes read now); unlike
    :func:`split_flat`, pieces keep ``flat_var``'s dtype, as in the original.
    """
    pieces, start = [], 0
    for var in variables:
        shape = np.shape(var.get_value(borrow=True))
        size = int(np.prod(shape, dtype=np.int64))
        pieces.append(flat_var[start:start + size].reshape(shape))
        start += size
    return pieces


def flat_unflat_grads(loss: Variable, params: Sequence[SharedVariable]
                      ) -> tuple[SharedVariable, Variable, list[Variable]]:
    """The original's gradient triple: ``(grad_shared_flat, flat_grad, unflat_grads)``.

    ``flat_grad`` is every gradient flattened into one vector, ``grad_shared_flat`` a
    zero shared vector to hold it (the update ``(grad_shared_flat, flat_grad)`` writes
    it), and ``unflat_grads`` its pieces shaped as the parameters, for the update rule.
    """
    params = _check_params(params)
    flat, grad_shared = flatten_gradients(loss, params)
    return grad_shared, flat, split_flat(grad_shared, params)


def nonflat_grads(loss: Variable, params: Sequence[SharedVariable]
                  ) -> tuple[list[SharedVariable], list[Variable]]:
    """One zero shared variable per parameter to hold its gradient, and the gradients.

    The original's pattern without flattening (one all-reduce per parameter: slower;
    kept for programs that use it).
    """
    params = _check_params(params)
    grads = pytensor.grad(_check_loss(loss), params)
    holders = [_zeros_like(p, "grad") for p in params]
    return holders, [g if g.dtype == h.dtype else pt.cast(g, h.dtype)
                     for g, h in zip(grads, holders, strict=True)]


def apply_momentum(param_updates: Updates, momentum: Hyper = 0.9) -> Updates:
    """Add heavy-ball momentum to plain updates ``[(p, p_new), ...]`` (Lasagne's rule).

    With ``x = momentum * v + p_new``: ``v <- x - p`` and ``p <- x``; velocities ``v``
    start at zero.
    """
    updates: Updates = []
    for p, new in param_updates:
        velocity = _zeros_like(p, "velocity")
        x = momentum * velocity + new
        updates += [_new(velocity, x - p), _new(p, x)]
    return updates


def apply_nesterov_momentum(param_updates: Updates, momentum: Hyper = 0.9) -> Updates:
    """Add Nesterov momentum to plain updates ``[(p, p_new), ...]`` (Lasagne's rule).

    With ``x = momentum * v + p_new - p``: ``v <- x`` and ``p <- momentum * x + p_new``.
    """
    updates: Updates = []
    for p, new in param_updates:
        velocity = _zeros_like(p, "velocity")
        x = momentum * velocity + new - p
        updates += [_new(velocity, x), _new(p, momentum * x + new)]
    return updates


def _prepare(loss: Variable, params: Any) -> tuple[list, Updates, SharedVariable, list]:
    """Checked params, the gradient update, the flat vector, and its per-param pieces."""
    params = _check_params(params)
    flat, grad_shared = flatten_gradients(loss, params)
    return params, [(grad_shared, flat)], grad_shared, split_flat(grad_shared, params)


def _zeros_like(param: SharedVariable, name: str) -> SharedVariable:
    value = param.get_value(borrow=True)
    label = f"{param.name}_{name}" if param.name else name
    return pytensor.shared(np.zeros(np.shape(value), dtype=param.dtype), name=label,
                           shape=param.type.shape)


def _new(var: SharedVariable, value: Variable) -> tuple[SharedVariable, Variable]:
    """An update pair whose value has the variable's dtype."""
    return var, value if value.dtype == var.dtype else pt.cast(value, var.dtype)


class State:
    """Makes a rule's state variables (velocities, moments, the step counter).

    The rules' arithmetic (``MATH``) asks this for its state, so the same arithmetic
    serves parameters held one shared variable each (``like`` copies a parameter's
    shape) and a flat piece of all of them that differs per process (the sharded
    update of :mod:`synkhronos.extensions.train` passes its own ``State``).
    """

    def like(self, param: Any, name: str) -> SharedVariable:
        """A zero shared variable shaped as ``param``."""
        return _zeros_like(param, name)

    def scalar(self, dtype: str, name: str) -> SharedVariable:
        """A zero shared scalar (a step counter)."""
        return pytensor.shared(np.asarray(0, dtype=dtype), name=name)


MathResult = tuple[list[Variable], Updates]


def _sgd(params: list, grads: list, state: State, learning_rate: Hyper) -> MathResult:
    return [p - learning_rate * g for p, g in zip(params, grads, strict=True)], []


def _momentum(params: list, grads: list, state: State, learning_rate: Hyper,
              momentum: Hyper = 0.9) -> MathResult:
    new, extra = [], []
    for p, g in zip(params, grads, strict=True):
        velocity = state.like(p, "velocity")
        step = momentum * velocity - learning_rate * g
        extra.append(_new(velocity, step))
        new.append(p + step)
    return new, extra


def _nesterov_momentum(params: list, grads: list, state: State, learning_rate: Hyper,
                       momentum: Hyper = 0.9) -> MathResult:
    new, extra = [], []
    for p, g in zip(params, grads, strict=True):
        velocity = state.like(p, "velocity")
        step = momentum * velocity - learning_rate * g
        extra.append(_new(velocity, step))
        new.append(p + momentum * step - learning_rate * g)
    return new, extra


def _adagrad(params: list, grads: list, state: State, learning_rate: Hyper = 1.0,
             epsilon: Hyper = 1e-6) -> MathResult:
    new, extra = [], []
    for p, g in zip(params, grads, strict=True):
        accumulator = state.like(p, "accumulator")
        total = accumulator + g**2
        extra.append(_new(accumulator, total))
        new.append(p - learning_rate * g / pt.sqrt(total + epsilon))
    return new, extra


def _rmsprop(params: list, grads: list, state: State, learning_rate: Hyper = 1.0,
             rho: Hyper = 0.9, epsilon: Hyper = 1e-6) -> MathResult:
    new, extra = [], []
    for p, g in zip(params, grads, strict=True):
        accumulator = state.like(p, "accumulator")
        average = rho * accumulator + (1 - rho) * g**2
        extra.append(_new(accumulator, average))
        new.append(p - learning_rate * g / pt.sqrt(average + epsilon))
    return new, extra


def _adadelta(params: list, grads: list, state: State, learning_rate: Hyper = 1.0,
              rho: Hyper = 0.95, epsilon: Hyper = 1e-6) -> MathResult:
    new, extra = [], []
    for p, g in zip(params, grads, strict=True):
        accumulator = state.like(p, "accumulator")
        delta_accumulator = state.like(p, "delta_accumulator")
        average = rho * accumulator + (1 - rho) * g**2
        step = g * pt.sqrt(delta_accumulator + epsilon) / pt.sqrt(average + epsilon)
        extra += [_new(accumulator, average),
                  _new(delta_accumulator, rho * delta_accumulator + (1 - rho) * step**2)]
        new.append(p - learning_rate * step)
    return new, extra


def _adam(params: list, grads: list, state: State, learning_rate: Hyper = 0.001,
          beta1: Hyper = 0.9, beta2: Hyper = 0.999, epsilon: Hyper = 1e-8) -> MathResult:
    t_prev = state.scalar(grads[0].dtype, "t")
    t = t_prev + 1
    step_size = learning_rate * pt.sqrt(1 - beta2**t) / (1 - beta1**t)
    new, extra = [], []
    for p, g in zip(params, grads, strict=True):
        m_prev, v_prev = state.like(p, "m"), state.like(p, "v")
        m = beta1 * m_prev + (1 - beta1) * g
        v = beta2 * v_prev + (1 - beta2) * g**2
        extra += [_new(m_prev, m), _new(v_prev, v)]
        new.append(p - step_size * m / (pt.sqrt(v) + epsilon))
    extra.append(_new(t_prev, t))
    return new, extra


def _adamax(params: list, grads: list, state: State, learning_rate: Hyper = 0.002,
            beta1: Hyper = 0.9, beta2: Hyper = 0.999, epsilon: Hyper = 1e-8) -> MathResult:
    t_prev = state.scalar(grads[0].dtype, "t")
    t = t_prev + 1
    step_size = learning_rate / (1 - beta1**t)
    new, extra = [], []
    for p, g in zip(params, grads, strict=True):
        m_prev, u_prev = state.like(p, "m"), state.like(p, "u")
        m = beta1 * m_prev + (1 - beta1) * g
        u = pt.maximum(beta2 * u_prev, abs(g))
        extra += [_new(m_prev, m), _new(u_prev, u)]
        new.append(p - step_size * m / (u + epsilon))
    extra.append(_new(t_prev, t))
    return new, extra


MATH: dict[str, Callable[..., MathResult]] = {
    "sgd": _sgd, "momentum": _momentum, "nesterov_momentum": _nesterov_momentum,
    "adagrad": _adagrad, "rmsprop": _rmsprop, "adadelta": _adadelta, "adam": _adam,
    "adamax": _adamax,
}
"""Each rule's arithmetic: ``(params, grads, state, **hyper) -> (new params, state
updates)``, on any parameter expressions (whole parameters, or a flat piece)."""


def _rule(name: str, loss: Variable, params: Any, **hyper: Any) -> RuleResult:
    params, grad_updates, grad_shared, grads = _prepare(loss, params)
    new, extra = MATH[name](params, grads, State(), **hyper)
    updates = [_new(p, value) for p, value in zip(params, new, strict=True)] + extra
    return grad_updates, updates, grad_shared


def sgd(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper
        ) -> RuleResult:
    """Stochastic gradient descent: ``p <- p - learning_rate * g``.

    Parameters
    ----------
    loss : scalar Variable
        The loss (a mean over rows, for the parallel result to equal the serial one).
    params : list of SharedVariable
        The parameters to update.
    learning_rate : float or scalar Variable
        Step size.

    Returns
    -------
    grad_updates : list of (SharedVariable, Variable)
        Writes every gradient into ``grad_shared``.
    param_updates : list of (SharedVariable, Variable)
        Splits ``grad_shared`` by parameter and applies the rule.
    grad_shared : SharedVariable
        The flat gradient vector.
    """
    return _rule("sgd", loss, params, learning_rate=learning_rate)


def momentum(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper,
             momentum: Hyper = 0.9) -> RuleResult:
    """Heavy-ball momentum: ``v <- momentum * v - learning_rate * g``, ``p <- p + v``.

    Velocities ``v`` start at zero. Parameters and returns as in :func:`sgd`;
    ``momentum`` is the decay of the velocity.
    """
    return _rule("momentum", loss, params, learning_rate=learning_rate, momentum=momentum)


def nesterov_momentum(loss: Variable, params: Sequence[SharedVariable],
                      learning_rate: Hyper, momentum: Hyper = 0.9) -> RuleResult:
    """Nesterov momentum: ``v <- momentum * v - learning_rate * g``,
    ``p <- p + momentum * v - learning_rate * g`` (with the new ``v``).

    Velocities ``v`` start at zero. Parameters and returns as in :func:`sgd`.
    """
    return _rule("nesterov_momentum", loss, params, learning_rate=learning_rate,
                 momentum=momentum)


def adagrad(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper = 1.0,
            epsilon: Hyper = 1e-6) -> RuleResult:
    """Adagrad: ``a <- a + g**2``, ``p <- p - learning_rate * g / sqrt(a + epsilon)``.

    Accumulators ``a`` start at zero. Parameters and returns as in :func:`sgd`.
    """
    return _rule("adagrad", loss, params, learning_rate=learning_rate, epsilon=epsilon)


def rmsprop(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper = 1.0,
            rho: Hyper = 0.9, epsilon: Hyper = 1e-6) -> RuleResult:
    """RMSProp: ``a <- rho * a + (1 - rho) * g**2``,
    ``p <- p - learning_rate * g / sqrt(a + epsilon)``.

    Accumulators ``a`` start at zero. Parameters and returns as in :func:`sgd`.
    """
    return _rule("rmsprop", loss, params, learning_rate=learning_rate, rho=rho,
                 epsilon=epsilon)


def adadelta(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper = 1.0,
             rho: Hyper = 0.95, epsilon: Hyper = 1e-6) -> RuleResult:
    """Adadelta: ``a <- rho * a + (1 - rho) * g**2``,
    ``u = g * sqrt(d + epsilon) / sqrt(a + epsilon)``, ``p <- p - learning_rate * u``,
    ``d <- rho * d + (1 - rho) * u**2``.

    Accumulators ``a`` (squared gradients) and ``d`` (squared steps) start at zero.
    Parameters and returns as in :func:`sgd`.
    """
    return _rule("adadelta", loss, params, learning_rate=learning_rate, rho=rho,
                 epsilon=epsilon)


def adam(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper = 0.001,
         beta1: Hyper = 0.9, beta2: Hyper = 0.999, epsilon: Hyper = 1e-8) -> RuleResult:
    """Adam with the bias correction folded into the step size.

    With ``t <- t + 1``, ``m <- beta1 * m + (1 - beta1) * g``,
    ``v <- beta2 * v + (1 - beta2) * g**2`` and
    ``a = learning_rate * sqrt(1 - beta2**t) / (1 - beta1**t)``:
    ``p <- p - a * m / (sqrt(v) + epsilon)``. The timestep ``t`` is one shared scalar
    for all parameters; ``t``, ``m`` and ``v`` start at zero. Parameters and returns as
    in :func:`sgd`.
    """
    return _rule("adam", loss, params, learning_rate=learning_rate, beta1=beta1,
                 beta2=beta2, epsilon=epsilon)


def adamax(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper = 0.002,
           beta1: Hyper = 0.9, beta2: Hyper = 0.999, epsilon: Hyper = 1e-8) -> RuleResult:
    """Adamax, Adam's infinity-norm variant.

    With ``t <- t + 1``, ``m <- beta1 * m + (1 - beta1) * g``,
    ``u <- max(beta2 * u, |g|)`` and ``a = learning_rate / (1 - beta1**t)``:
    ``p <- p - a * m / (u + epsilon)``. ``t``, ``m`` and ``u`` start at zero.
    Parameters and returns as in :func:`sgd`.
    """
    return _rule("adamax", loss, params, learning_rate=learning_rate, beta1=beta1,
                 beta2=beta2, epsilon=epsilon)


def sgd_nonflat(loss: Variable, params: Sequence[SharedVariable], learning_rate: Hyper
                ) -> tuple[Updates, Updates, list[SharedVariable]]:
    """SGD with one gradient holder per parameter (see :func:`nonflat_grads`).

    Returns ``(grad_updates, param_updates, grads_shared)`` where ``grads_shared`` is
    a list: all-reduce it as a list (one fused exchange in synkhronos).
    """
    holders, grads = nonflat_grads(loss, params)
    grad_updates = list(zip(holders, grads, strict=True))
    updates = [_new(p, p - learning_rate * g) for p, g in zip(params, holders, strict=True)]
    return grad_updates, updates, holders


def _takes_lr(rule: Callable[..., Any]) -> Callable[..., Any]:
    """Let ``rule`` take the original Synkhronos' ``lr=`` for ``learning_rate=``."""

    @functools.wraps(rule)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "lr" in kwargs:
            if "learning_rate" in kwargs or len(args) > 2:
                raise TypeError(f"{rule.__name__}() got both lr and learning_rate")
            kwargs["learning_rate"] = kwargs.pop("lr")
        return rule(*args, **kwargs)

    return wrapper


(sgd, momentum, nesterov_momentum, adagrad, rmsprop, adadelta, adam, adamax, sgd_nonflat) = (
    _takes_lr(rule) for rule in (sgd, momentum, nesterov_momentum, adagrad, rmsprop,
                                 adadelta, adam, adamax, sgd_nonflat)
)

RULES: dict[str, UpdateRule] = {
    rule.__name__: rule
    for rule in (sgd, momentum, nesterov_momentum, adagrad, rmsprop, adadelta, adam, adamax)
}
"""Every update rule, by name (the names ``make_train_function`` accepts)."""
