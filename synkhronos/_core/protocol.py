"""The messages commands carry: one frozen dataclass per kind of command.

The master posts one ``Message`` per command; every process (the master included)
hands it to ``execute``, which looks its type up in the handler table. Messages are
small and picklable, and equal messages mean the same command, so a message that
repeats (a training loop) is pickled once and decoded once per worker.

The core defines the messages of the core: ``Exit``, ``Ping``, ``RunCallable``,
``Sequence`` (several messages run in order in one command: one round trip for a whole
training step), and ``Join`` (a machine's processes learn their place among several
machines, once, after MPI starts). The layers above define theirs as subclasses of
``Message`` beside their handlers (a function call in ``_call.py``, collectives in
``collectives/fused.py``, distribution in ``distribute.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["Message", "Exit", "Ping", "RunCallable", "Sequence", "Join"]


@dataclass(frozen=True)
class Message:
    """Base class of every command's message."""

    #: The master reduces the replies at once, before the next command: the workers'
    #: arrays are read in place from their reply slots, not copied out.
    replies_reduced_at_once: ClassVar[bool] = False


@dataclass(frozen=True)
class Exit(Message):
    """Workers leave their loop (the master closes the session)."""


@dataclass(frozen=True)
class Ping(Message):
    """The empty command: measures the cost of one round trip."""


@dataclass(frozen=True)
class RunCallable(Message):
    """Run a picklable ``fn(*args)`` on ``ranks`` (None: every rank); reply its result.

    The public entry is :func:`synkhronos.testing.run_on_ranks`.
    """

    fn: Callable[..., Any]
    args: tuple = ()
    ranks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Sequence(Message):
    """Several messages run in order, in one command; the reply is their replies.

    A rank whose step raises stops there; every other rank stops at its next meeting
    point (``BarrierAborted``), so all leave the command together.

    ``timed`` (``synk.profile``'s): each rank's reply ends with one more item, per
    step its ``(seconds, waited, cpu)``: the step's time on that rank, the part of it
    spent at meeting points waiting for the others, and the process's CPU seconds in
    it (``Executor``).
    """

    steps: tuple[Message, ...]
    timed: bool = False


@dataclass(frozen=True)
class Join(Message):
    """Every process of one machine learns its place in a session over several
    machines (the first command after MPI started; the processes were forked before).

    Global ranks are ``offsets[node] + local rank``; ``master_prefix`` names the
    master's segments, which this machine holds as replicas under its own prefix.
    """

    node: int
    offsets: tuple[int, ...]
    local_sizes: tuple[int, ...]
    master_rank: int
    leader_rank: int
    master_prefix: str
    exact: bool
