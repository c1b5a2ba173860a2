"""A training step's checkpoint: one layout whatever the form and the number of processes.

This module owns the format of :meth:`TrainFunction.state_dict
<synkhronos.extensions.train.TrainFunction.state_dict>`: its keys, each value's shape
and dtype, the check of a dict against them, and the moves of the rule state between
the master's per-parameter arrays and the processes' variables. The training step
(:mod:`synkhronos.extensions.train`) builds one :class:`Checkpoint` from its
parameters, its rule state and its form, and gets every process ready for a
collective before asking it to save or load.

Keys: ``params/<name>`` for each parameter, ``state/<kind>/<name>`` for each piece of
rule state shaped as its parameter, ``state/<kind>`` for a step counter, and
``state/<index>`` for the state of a rule of the user's own (whose layout is not
known). ``<name>`` is the parameter's name, or ``#<index>`` where names are missing
or repeated. Which kinds a rule keeps, and in what order the training step holds
them, is learned by running the rule's arithmetic on stand-ins (``_StateRecorder``).

1. Save: the parameters' values from the master; the rule state unsharded from the
   master's copy (every process's is the same), sharded by gathering each kind's
   pieces from the processes and cutting the whole into one array per parameter.
2. Load: every key, shape and dtype is checked first (nothing moves on a misfit);
   then the parameters are broadcast, and the rule state is broadcast (unsharded) or
   joined per kind into one flat vector and cut again into each process's piece
   (sharded; the counters are broadcast). Pieces of one length (the sharded update on
   the JAX backend) hold zeros past the parameters' end, and saving drops that tail.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable

from .. import broadcast, gather, set_value
from . import updates
from .updates import _offsets

__all__ = ["Checkpoint"]

Layout = list[tuple[str, int | None]]


class Checkpoint:
    """The checkpoint of one training step: its keys, and its values' way in and out.

    Parameters
    ----------
    params : list of SharedVariable
        The parameters, in the training step's order.
    state : list of SharedVariable
        The rule's state variables as the training step holds them: sharded, one flat
        piece per kind in the order the rule makes them; unsharded, in the order of
        the rule's updates.
    rule : str
        The rule's name (messages; and, where ``known``, which arithmetic to record).
    known : bool
        Whether the rule is one of :mod:`synkhronos.extensions.updates`, whose state's
        layout is known; otherwise the state is keyed by position.
    sharded : bool
        Whether each process holds only its piece of the rule state.
    """

    def __init__(self, params: list[SharedVariable], state: list[SharedVariable],
                 rule: str, known: bool, sharded: bool) -> None:
        self._params = params
        self._state = state
        self._rule = rule
        self._known = known
        self._sharded = sharded

    def save(self) -> dict[str, np.ndarray]:
        """The parameters and the rule state as copies in the master, by key.

        Collective where sharded (the state's pieces are gathered): every process
        must be ready for it.
        """
        state = {key: np.array(param.get_value(borrow=True))
                 for key, param in zip(self._param_keys(), self._params, strict=True)}
        for key, value in zip(self._state_keys(), self._state_values(), strict=True):
            state[key] = value
        return state

    def check(self, state: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The parameters' values and the rule state's, from ``state``, each cast to
        its variable's dtype, in the order :meth:`load` takes them.

        Raises
        ------
        ValueError
            Keys missing or extra, or a value of another shape.
        TypeError
            ``state`` is not a dict, or a value does not cast to its dtype.
        """
        if not isinstance(state, dict):
            raise TypeError(f"load_state_dict takes the dict state_dict() returns; got "
                            f"{type(state).__name__}")
        param_keys, state_keys = self._param_keys(), self._state_keys()
        expected = self._expected_arrays(param_keys, state_keys)
        missing = [key for key in expected if key not in state]
        extra = [key for key in state if key not in expected]
        if missing or extra:
            raise ValueError(
                f"the state does not fit this {self._rule} training "
                f"function (another model or rule?): missing {_listed(missing)}, "
                f"unexpected {_listed(extra)}; nothing was loaded"
            )
        values = {}
        for key, (shape, dtype) in expected.items():
            value = np.asarray(state[key])
            if value.shape != shape:
                raise ValueError(f"state[{key!r}] has shape {value.shape}; this model's is "
                                 f"{shape}; nothing was loaded")
            if not np.can_cast(value.dtype, dtype, casting="same_kind"):
                raise TypeError(f"state[{key!r}] has dtype {value.dtype}, which does not "
                                f"cast to {dtype}; nothing was loaded")
            values[key] = value.astype(dtype, copy=False)
        return [values[key] for key in param_keys], [values[key] for key in state_keys]

    def load(self, param_values: list[np.ndarray], state_values: list[np.ndarray],
             pieces: list[tuple[int, int]] | None) -> None:
        """Every process's parameters and rule state from :meth:`check`'s values.

        Collective: every process must be ready for it. ``pieces``: sharded, each
        process's ``(start, stop)`` of the flat vector, by rank (None unsharded).
        """
        broadcast(self._params, param_values)
        self._load_state(state_values, pieces)

    def _param_keys(self) -> list[str]:
        names = [param.name for param in self._params]
        return [f"params/{name}" if name and names.count(name) == 1 else f"params/#{i}"
                for i, name in enumerate(names)]

    def _layout(self) -> Layout | None:
        """``(kind, parameter index or None)`` of each variable of the rule state
        (None: a rule of the user's own, whose state has no known layout)."""
        if not self._known:
            return None
        if self._sharded:  # one flat piece per kind, in the order they were made
            kinds = _StateRecorder.kinds(self._rule, 1, made_order=True)
            return [(kind, None if index is None else -1) for kind, index in kinds]
        return _StateRecorder.kinds(self._rule, len(self._params), made_order=False)

    def _state_keys(self) -> list[str]:
        """The checkpoint's keys of the rule state, in the order the values travel."""
        layout = self._layout()
        if layout is None:
            return [f"state/{i}" for i in range(len(self._state))]
        names = [key.removeprefix("params/") for key in self._param_keys()]
        keys = []
        for kind, index in layout:
            if index is None:
                keys.append(f"state/{kind}")
            elif index == -1:  # a flat piece over every parameter
                keys += [f"state/{kind}/{name}" for name in names]
            else:
                keys.append(f"state/{kind}/{names[index]}")
        return keys

    def _expected_arrays(self, param_keys: list[str], state_keys: list[str]
                         ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of every value of the checkpoint, by key."""
        expected = {key: (tuple(np.shape(param.get_value(borrow=True))),
                          np.dtype(param.type.dtype))
                    for key, param in zip(param_keys, self._params, strict=True)}
        layout = self._layout()
        if layout is None:
            for key, var in zip(state_keys, self._state, strict=True):
                expected[key] = (tuple(np.shape(var.get_value(borrow=True))),
                                 np.dtype(var.type.dtype))
            return expected
        keys = iter(state_keys)
        for (_, index), var in zip(layout, self._state, strict=True):
            dtype = np.dtype(var.type.dtype)
            if index is None:
                expected[next(keys)] = ((), dtype)
            elif index == -1:
                for param_key in param_keys:
                    expected[next(keys)] = (expected[param_key][0], dtype)
            else:
                expected[next(keys)] = (expected[param_keys[index]][0], dtype)
        return expected

    def _state_values(self) -> list[np.ndarray]:
        """The rule state in the order of ``_state_keys``: sharded, each kind's pieces
        gathered from the processes and cut per parameter."""
        if not self._sharded:
            return [np.array(var.get_value(borrow=True)) for var in self._state]
        pieces = [var for var in self._state if var.ndim == 1]
        whole = gather(pieces, nd_up=0) if pieces else []
        whole = [whole] if isinstance(whole, np.ndarray) else list(whole)
        values = []
        for var in self._state:
            if var.ndim == 0:
                values.append(np.array(var.get_value(borrow=True)))
                continue
            flat = whole.pop(0)
            values += [flat[start:stop].reshape(shape)
                       for start, stop, shape in _offsets(self._params)]
        return values

    def _load_state(self, values: list[np.ndarray],
                    pieces: list[tuple[int, int]] | None) -> None:
        """Every process's rule state from ``values`` (in ``_state_keys`` order)."""
        if not self._state:
            return
        if not self._sharded:
            broadcast(self._state, values)
            return
        assert pieces is not None
        counters, flats = [], []
        given = iter(values)
        for var in self._state:
            if var.ndim == 0:
                counters.append((var, next(given)))
            else:
                flats.append((var, np.concatenate(
                    [next(given).ravel() for _ in self._params])))
        for var, value in counters:
            broadcast(var, value)
        if flats:
            variables = [var for var, _ in flats]
            end = pieces[-1][1]  # pieces of one length (the JAX backend's) end in padding
            flats = [(var, np.pad(flat, (0, end - flat.size))) for var, flat in flats]
            for rank, (start, stop) in enumerate(pieces):
                set_value(rank, variables, [flat[start:stop] for _, flat in flats])


def _listed(keys: list[str], most: int = 6) -> str:
    if not keys:
        return "none"
    shown = ", ".join(map(repr, keys[:most]))
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


class _StateRecorder(updates.State):
    """Runs a rule's arithmetic on stand-ins to learn which state it makes, so that a
    checkpoint can name each state variable ``(kind, parameter index)``."""

    def __init__(self, params: list) -> None:
        self._params = params
        self.made: dict[int, tuple[str, int | None]] = {}
        self.order: Layout = []

    def like(self, param: Any, name: str) -> SharedVariable:
        var = pytensor.shared(np.zeros(1), name=name)
        index = next(i for i, p in enumerate(self._params) if p is param)
        self.made[id(var)] = (name, index)
        self.order.append((name, index))
        return var

    def scalar(self, dtype: str, name: str) -> SharedVariable:
        var = super().scalar("float64", name)
        self.made[id(var)] = (name, None)
        self.order.append((name, None))
        return var

    @classmethod
    def kinds(cls, rule: str, n_params: int, made_order: bool) -> Layout:
        """``(kind, parameter index or None)`` of the rule's state for ``n_params``
        parameters: in the order it is made (the sharded step's state), or in the
        order of the rule's updates (the unsharded step's state)."""
        params = [pt.vector(f"p{i}") for i in range(n_params)]
        recorder = cls(params)
        _, extra = updates.MATH[rule](params, [pt.vector() for _ in params], recorder,
                                      learning_rate=1.0)
        if made_order:
            return recorder.order
        return [recorder.made[id(var)] for var, _ in extra]
