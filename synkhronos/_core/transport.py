"""The transport: how a command reaches every process and its replies come back.

``fork()`` chooses the transport once and the session holds it; the session's run path
never asks which one it has. A transport answers four things:

- **run** (``run``): this message on every process, this process's own share
  included; the replies by global rank, and the root-cause failure among the other
  processes, if any;
- **publish** (``publish_values``, ``publish_rows``, ``publish_item``): a ``Data``
  segment's new values to every other copy of the session's memory (``replica_groups``
  says whether there is any, and which ranks share each copy);
- **watch** (``watch``): the liveness check while waiting;
- **settle** (``settle``, while ``group.pending`` or ``pending_elsewhere`` says a
  command is pending): a command that Ctrl-C abandoned in the master is finished or
  abandoned by every process, before anything else may run (SPEC 6);
  ``interrupt_breaks`` says whether an interrupt broke the session instead;
- **close** (``begin_close`` before the local group stops, ``end_close`` after it is
  gone), and what a failure means to the caller (``error``).

``Transport`` itself is one machine: its local group (``_core/group.py``) is every
process, and there is nothing to publish. The several-machines transport
(``_machines/transport.py``) wraps it: the message goes to the other machines first, the
local round runs as here, and the other machines' replies join at the end.
"""

from __future__ import annotations

from typing import Any

from .._runtime.remote import RemoteFailure
from .execute import Outcome
from .group import LocalGroup, Share
from .protocol import Message

__all__ = ["Transport", "First", "merge", "root_failure"]

First = tuple[int, Outcome] | None  # the root-cause failure so far: (rank, outcome)


class Transport:
    """One machine's transport: the local group alone (see the module docstring).

    Parameters
    ----------
    group
        This machine's processes.
    """

    #: Per copy of the session's memory other than this one's: (first rank, ranks);
    #: None when every process maps the same memory (nothing to publish).
    replica_groups: tuple[tuple[int, int], ...] | None = None
    #: A command that Ctrl-C abandoned may still be pending on another machine
    #: (``settle`` then finds out); never on one machine.
    pending_elsewhere = False
    #: A failure closes the session at once (True), or only at ``close()`` (False:
    #: the exception goes up first).
    close_on_failure = True

    def __init__(self, group: LocalGroup):
        self.group = group
        self._size = group.ctx.size

    def run(self, message: Message, own_share: Share, key: Any
            ) -> tuple[list[Any], Outcome, First]:
        """``message`` on every process (``own_share(message)`` here): the replies by
        rank, this process's outcome, and the other processes' root-cause failure."""
        local, own, parts = self.group.round(message, own_share, key)
        replies: list[Any] = [None] * self._size
        replies[local] = own.reply
        return replies, own, merge(replies, parts, None, 0) if parts else None

    @property
    def interrupt_breaks(self) -> bool:
        """Whether the Ctrl-C just raised broke the session (here never: it leaves the
        command pending, and the session usable, SPEC 6)."""
        return False

    def settle(self) -> None:
        """Wait until every process is done with the command Ctrl-C left pending, and
        throw its replies away (``LocalGroup.settle``). Ctrl-C here raises again and
        leaves it pending."""
        if self.group.pending is not None:
            self.group.settle()

    def error(self, exc: BaseException) -> BaseException:
        """What a failure during a command means to the caller (here: itself)."""
        return exc

    def publish_values(self, segment: str, buffer: Any) -> None:
        """``buffer``'s bytes into every other copy of ``segment`` (none here)."""

    def publish_rows(self, segment: str, view: Any, bounds: list[tuple[int, int]]) -> None:
        """Each other copy's rows (``bounds``, per copy) of ``view``, the array held
        in ``segment`` (none here)."""

    def publish_item(self, segment: str, view: Any, key: Any, value: Any) -> bool:
        """``copy[key] = value`` on every other copy of ``segment``; False when that
        cannot travel (the caller publishes the values instead)."""
        return True

    def watch(self) -> None:
        """The liveness check while waiting."""
        self.group.watch()

    def begin_close(self, orderly: bool) -> None:
        """Before the local group stops: tell whoever must know (nobody here)."""

    def end_close(self, broken: BaseException | None) -> None:
        """After the local group is gone (nothing more here)."""


def merge(replies: list[Any], parts: list[tuple[int, bool, Any]], first: First,
          offset: int) -> First:
    """One machine's workers' replies (a round's ``parts``) into ``replies`` (by global
    rank, the machine's first at ``offset``); returns the root-cause failure among them
    so far (``first`` is earlier)."""
    for rank, failed, value in parts:
        if failed:
            assert isinstance(value, RemoteFailure)
            first = root_failure(first, offset + rank, value)
        else:
            replies[offset + rank] = value
    return first


def _secondary(outcome: Outcome) -> bool:
    return outcome.failure is not None and outcome.failure.secondary


def root_failure(first: First, rank: int, failure: RemoteFailure) -> tuple[int, Outcome]:
    """The failure to report of ``first`` and ``rank``'s: the one seen first, unless it
    is secondary (a rank that gave up because another failed) and this one is not."""
    if first is None or (_secondary(first[1]) and not failure.secondary):
        return (rank, Outcome(None, failure))
    return first
