"""The master's ``set_value`` between commands, brought to every process first.

A serial program changes a shared variable with ``set_value`` and the next call sees
it. After ``synk.distribute()`` every process holds its own copy, and the master's
``set_value`` changes the master's alone: the Deep Learning Tutorials' LSTM switches
dropout on with ``use_noise.set_value(1.)`` and restores its best parameters with
``set_value``, and its workers went on without either, silently. As torch's DDP
broadcasts buffers before a forward pass, the session's ``Fresh`` (installed at
``fork`` where there are workers, held as ``Session.fresh`` once a shared variable is
distributed) does so as each call or collective takes the session (``Session.enter``,
before anything is staged):

- as a call or collective gives the session back (``after``), it notes the object
  each distributed variable's storage cell holds in the master: whatever the library
  changed there (a function's updates, a collective's result, values moved into an
  exchange buffer) is its own doing;
- as the next one takes the session (``before``), a cell that holds another object
  was given new storage by the program in between (``set_value``, with
  ``borrow=True`` too): those variables are broadcast from the master first, in one
  command of their own. A variable that holds each process's own rows
  (``sliceable_shareds``) has no one value for all: the call is refused with a
  ``ValueError`` naming it, before any process moves (its fix, ``synk.scatter`` or
  ``synk.broadcast``, writes every process and is let through: ``overwritten``).

What it cannot see: a write into the master's array in place
(``get_value(borrow=True)[...] = v``) keeps the object; and only tensors are watched,
not random generators (each process draws its own stream: ``_streams``) nor other
kinds of shared variable (collectives move tensors only). Both are documented. The
cost is two passes over the watched cells per call, in C (``map``): 0.1-0.15 us a
watched variable at each call on 2 cores here, nothing without one.
"""

from __future__ import annotations

import operator
from typing import Any

from pytensor.tensor.type import TensorType

from .. import _pytensor
from ._checks import FRONT, _resolve
from .fused import broadcast_step, run_step

__all__ = ["Fresh"]

_HELD = operator.itemgetter(0)  # a storage cell's value


class Fresh:
    """The distributed shared variables' storage in the master, as the last command
    left it (see the module docstring)."""

    def __init__(self, rows: set[int]) -> None:
        self._variables: list = []
        self._cells: list[list] = []  # each variable's storage cell
        self._seen: list = []  # what each cell held when the last command ended
        self._rows = rows  # id() of the variables holding each process's rows (the
        # registry's set, filled as functions are built)

    def watch(self, variables: Any, session: Any) -> None:
        """Watch newly distributed ``variables`` from now on (their values now are the
        workers'); the session calls this from its first watched variable on (before
        it, a call pays nothing)."""
        for var in variables:
            if not isinstance(var.type, TensorType):  # (random generators among them:
                continue  # each process draws its own stream)
            self._variables.append(var)
            self._cells.append(_pytensor.storage(var))
        self.after()
        if self._cells:
            session.fresh = self

    def before(self, session: Any) -> None:
        """Broadcast the variables the program gave new storage since the session was
        last given back (or refuse, for rows); the caller has just taken it."""
        if not any(map(operator.is_not, map(_HELD, self._cells), self._seen)):
            return
        stale = [var for var, cell, seen in zip(self._variables, self._cells, self._seen,
                                                strict=True) if cell[0] is not seen]
        for var in stale:
            if id(var) in self._rows:
                name = repr(var.name) if var.name else "a sliceable shared variable"
                raise ValueError(
                    f"the master's {name} was given new storage (set_value) after "
                    "synk.distribute(), but it holds each process's own rows "
                    "(sliceable_shareds), so no one value reaches every process: give "
                    "every process its rows with synk.scatter, or the master's value "
                    "with synk.broadcast")
        front = FRONT.get(session.ctx)
        targets = _resolve(front.registry, tuple(stale), False)
        # (a command of its own, run under the session the caller took: ``enter`` is
        # not called again, so this is not either)
        run_step(session, front.backend, broadcast_step(session, front.backend, targets,
                                                        None))

    def after(self) -> None:
        """The session is given back: what the cells hold now is the library's
        doing."""
        self._seen = list(map(_HELD, self._cells))

    def overwritten(self, variables: Any) -> None:
        """A collective is about to give ``variables`` a value in every process: the
        master's value now needs no broadcast."""
        for var in variables:
            for i, watched in enumerate(self._variables):
                if watched is var:
                    self._seen[i] = self._cells[i][0]

