"""Each process's typed state: ``RankContext``, and ``RankVar`` for the layers above.

A ``RankContext`` is built once per process: by ``fork()`` for the master, and by
each worker right after the fork, from the master's (so the fields a worker inherits
are rewritten before it runs anything). It holds what every layer may ask:

- who this process is: ``rank``, ``size``, ``master_rank`` (global: ranks are numbered
  machine by machine); ``node``, ``n_nodes``, ``local_rank``, ``local_size``,
  ``offsets`` and ``local_sizes`` for sessions that span machines (one machine: node 0,
  local rank = rank); ``leader_rank``, the rank of this machine's leader (the master
  on machine 0); ``exact``, the reduction mode between machines;
- the program's shared-memory owner (``arena``) and control block (``control``; local
  ranks index it), and the block's reply slots (``replies``: ``control.replies``, held
  here too for the code that only writes a reply);
- ``device`` and ``placement``: where this process's shared values live and how arrays
  move there (``_runtime.placement``: numpy in place on ``"cpu"``, JAX arrays on
  ``"gpu"``), chosen once at fork;
- ``meeting``: how this process meets the others at a point inside a command
  (``meeting.barrier(ctx)``, ``meeting.agree(ctx, ok)``), a ``Meeting`` chosen once:
  one machine's (``OneMachine``: the control block) from the start, replaced when the
  process joins several machines (``Join``: the several-machines side,
  ``_machines/transport.py``, where a meeting spans the machines and a leader's also holds
  its link to the other leaders). Code above asks the meeting, never how many
  machines there are; ``local_barrier`` meets this machine's ranks alone. Every wait
  watches that the peers are alive (``watch``).

State owned by a layer above the core (the registry of distributed functions, the
prepared calls, a collective backend's buffers) is declared by its owner as a
``RankVar`` (Trio's ``RunVar``): a typed key whose value is made on first use, one per
process. Nothing is looked up by string.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .._runtime.arena import Arena
from .._runtime.control import ControlBlock
from .._runtime.placement import HostPlacement, Placement
from .._runtime.replies import ReplySlots

__all__ = ["Meeting", "OneMachine", "RankContext", "RankVar", "current", "install", "pid"]

_pid = os.getpid()  # kept by the fork hook below: os.getpid() is a system call


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def pid() -> int:
    """This process's pid, without a system call (every command checks it)."""
    return _pid

T = TypeVar("T")


def no_watch() -> None:
    """The watch of a context with no peers to watch."""
    return None


class Meeting(Protocol):
    """How a process meets the others at a point inside a command, chosen once per
    process (``RankContext.meeting``).

    A meeting is given the context at each call rather than holding it (no cycle
    between the two): ``ctx.meeting.agree(ctx, ok)``, one call, as a method of the
    context would be.
    """

    def barrier(self, ctx: RankContext) -> None:
        """Wait until every rank reaches this point."""

    def agree(self, ctx: RankContext, ok: bool) -> bool:
        """A barrier that says whether every rank passed ``ok``."""


class OneMachine:
    """Every rank on one machine: they meet on the control block (a process alone
    passes at once). Local rank and rank are one here."""

    __slots__ = ()

    def barrier(self, ctx: RankContext) -> None:
        control = ctx.control
        if control is not None:
            control.barrier(ctx.rank, ctx.watch)

    def agree(self, ctx: RankContext, ok: bool) -> bool:
        control = ctx.control
        if control is None:
            return ok
        return control.agree(ctx.rank, ok, ctx.watch)


ONE_MACHINE = OneMachine()  # holds nothing: one for every context


@dataclass(eq=False)
class RankContext:
    """One process's view of the session (see the module docstring)."""

    rank: int
    size: int
    master_rank: int
    prefix: str
    arena: Arena
    control: ControlBlock | None
    master_pid: int
    device: str = "cpu"
    placement: Placement = field(default_factory=HostPlacement)
    node: int = 0
    n_nodes: int = 1
    local_rank: int = -1
    local_size: int = -1
    offsets: tuple[int, ...] = (0,)  # global rank of each machine's first process
    local_sizes: tuple[int, ...] = ()  # processes on each machine
    leader_rank: int = -1  # global rank of this machine's leader
    exact: bool = False  # reductions between machines bit-identical to one machine
    meeting: Meeting = ONE_MACHINE  # replaced at Join, over several machines
    watch: Callable[[], None] = no_watch  # raises to abandon a wait (dead peer, Ctrl-C)
    replies: ReplySlots | None = field(default=None, init=False, repr=False)  # set from control
    _vars: dict[RankVar[Any], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.control is not None:
            self.replies = self.control.replies
        if self.local_rank < 0:
            self.local_rank = self.rank
        if self.local_size < 0:
            self.local_size = self.size
        if not self.local_sizes:
            self.local_sizes = (self.local_size,)
        if self.leader_rank < 0:
            self.leader_rank = self.master_rank

    def machine_of(self, rank: int) -> int:
        """The machine (node) that runs global ``rank``."""
        machine = 0
        for node, offset in enumerate(self.offsets):
            if offset <= rank:
                machine = node
        return machine

    @property
    def is_master(self) -> bool:
        return self.rank == self.master_rank

    def local_barrier(self) -> None:
        """Inside a command: wait until every rank of this machine reaches this point."""
        if self.control is not None:
            self.control.barrier(self.local_rank, self.watch)


class RankVar(Generic[T]):
    """Per-process state declared by the module that owns it.

    Parameters
    ----------
    name
        For ``repr`` only.
    factory
        Builds the value for a context on first use (``factory(ctx)``).
    """

    __slots__ = ("name", "_factory")

    def __init__(self, name: str, factory: Callable[[RankContext], T]):
        self.name = name
        self._factory = factory

    def get(self, ctx: RankContext) -> T:
        try:
            return ctx._vars[self]
        except KeyError:
            value = ctx._vars[self] = self._factory(ctx)
            return value

    def __repr__(self) -> str:
        return f"<RankVar {self.name}>"


_current: RankContext | None = None


def current() -> RankContext | None:
    """This process's context while a session is open, else None."""
    return _current


def install(ctx: RankContext | None) -> None:
    """Make ``ctx`` this process's context (the session's start, a worker's start,
    and None at close)."""
    global _current
    _current = ctx
