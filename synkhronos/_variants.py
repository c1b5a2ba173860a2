"""The compiled variants of one ``synk.function``, and their prepared calls.

``function.py`` reads what the user gave; this module compiles it, in the master: the
function as asked (``Variants.local``: the serial program too, for ``as_pytensor``), and
lazily two kinds of variant, each registered for distribution under an id of its own:

- an ``output_subset``: PyTensor 3 has no call-time subset, so the subset is compiled;
- the sliced form: the outputs and then the update values, returned instead of
  applied, so that each process can accumulate them over its slices.

Every compiled function takes the same signature (the inputs, the broadcast inputs,
then one stand-in per shared variable that holds rows: ``_signature.row_inputs``) and
trusts its inputs, which the master validated and cast. Each variant gets one
``PreparedCall`` (``_call.py``) when it is first called, distributing first where the
workers do not have it yet (its shared variables get their ids then).
"""

from __future__ import annotations

from typing import Any, cast

import pytensor

from ._call import Prepared, PreparedCall
from ._core.session import Session
from ._reducers import ReduceOp
from .distribute import REGISTRY, distribute

__all__ = ["Variants"]


class Variants:
    """One function's compiled variants by ``(output subset, sliced)``; the plain and
    the sliced form's prepared calls at hand (``plain``, ``sliced``), for the calls
    that repeat."""

    def __init__(self, session: Session, name: str | None, signature: list, givens: list,
                 kwargs: dict, trusted: bool, outputs: list, output_ops: list[ReduceOp],
                 updates: list, update_ops: list[ReduceOp], row_shareds: list,
                 n_scattered: int, labels: list[str], axes: tuple[int, ...] | None = None,
                 sliceable: list | tuple = ()):
        self._session = session
        self._name = name
        self._signature = signature
        self._givens = givens
        self._kwargs = kwargs
        self._trusted = trusted
        self._outputs, self._output_ops = outputs, output_ops
        self._updates, self._update_ops = updates, update_ops
        self._row_shareds = row_shareds
        self._n_scattered = n_scattered
        self._labels = labels
        self._axes = axes  # each scattered input's row axis, where one is not 0
        self._registry = REGISTRY.get(session.ctx)
        self.local = self.compile(outputs, updates, **kwargs)
        fn_id = self._registry.add_function(self.local, row_shareds)
        self._registry.row_holders.update(id(var) for var in sliceable)
        self._ids: dict[tuple, int] = {(None, False): fn_id}  # -> compiled fn id
        self._prepared: dict[int, PreparedCall] = {}  # fn id -> its prepared calls
        self.plain: PreparedCall | None = None  # the (None, False) variant's, once made
        self.sliced: PreparedCall | None = None  # and the (None, True) variant's

    def compile(self, outputs: list, updates: list, **kwargs: Any) -> Any:
        fn = pytensor.function(
            self._signature,
            outputs,
            updates=updates,
            givens=self._givens,
            name=self._name,  # (``synk.profile()`` names its records by it)
            **kwargs,
        )
        # Every process gets inputs that the master validated (ndim, dtype, static
        # shape) and cast: skip PyTensor's per-call check of them (2 us per process).
        fn.trust_input = self._trusted
        return fn

    def prepared(self, subset: tuple[int, ...] | None, sliced: bool) -> PreparedCall:
        """The prepared calls of the compiled function for this subset / slicing."""
        key = (subset, sliced)
        fn_id = self._ids.get(key)
        if fn_id is None:
            chosen = self._outputs if subset is None else [self._outputs[i] for i in subset]
            kwargs = dict(self._kwargs, on_unused_input="ignore")
            if sliced:
                fn = self.compile(chosen + [u for _, u in self._updates], [], **kwargs)
            else:
                fn = self.compile(chosen, self._updates, **kwargs)
            fn_id = self._ids[key] = self._registry.add_function(fn)
        prepared = self._prepared.get(fn_id)
        if prepared is not None:
            return prepared
        if not self._registry.is_distributed(fn_id):
            distribute()  # its shared variables get their uids now
        self._registry.first_call(fn_id)  # compiled now, in the master first
        uid = self._registry.uid  # (every distributed shared variable has one)
        ops = self._output_ops if subset is None else [self._output_ops[i] for i in subset]
        static = Prepared(
            fn_id,
            tuple(cast(int, uid(var)) for var in self._row_shareds),
            tuple(ops),
            tuple(cast(int, uid(var)) for var, _ in self._updates) if sliced else (),
            tuple(self._update_ops) if sliced else (),
        )
        prepared = self._prepared[fn_id] = PreparedCall(
            self._session, static, self._n_scattered, self._labels, self._axes)
        if key == (None, False):
            self.plain = prepared
        elif key == (None, True):
            self.sliced = prepared
        return prepared
