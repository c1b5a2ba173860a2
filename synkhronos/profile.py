"""synk.profile(): where the time of each call goes, in the paper's Table 1 terms.

A ``Profile`` is an observer of the session: while a ``synk.profile()`` block is
active, the session tells it about every command, and each function call about its
phases:

- ``stage``: the master's binding, validation and copying into shared memory (for a
  call that repeats an earlier one, the refill of its arrays, as outside the block);
- ``gather``: each process's building of its rows (the parallel shuffle of a
  ``batch`` index list), per rank;
- ``function``: each process's PyTensor function time (all slices), per rank;
- ``straggler``: how long the master waited for the slowest worker after finishing
  its own share;
- ``reduce``: the master's reduction of the outputs;
- ``collective``: whole commands other than function calls (``all_reduce`` and the
  other collectives), wall time.

With no block active, nothing is recorded and a command checks one attribute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from ._call import Call
from ._core.protocol import Message, Sequence
from ._core.session import require

__all__ = ["Profile", "profile", "CallRecord"]


@dataclass
class CallRecord:
    """One command, timed."""

    kind: str  # "call", "collective" or "step"
    name: str | None
    total: float = 0.0
    stage: float = 0.0
    straggler: float = 0.0
    reduce: float = 0.0
    gather: list[float] = field(default_factory=list)  # per rank that ran
    function: list[float] = field(default_factory=list)  # per rank that ran


@dataclass
class Profile:
    """The records of one ``synk.profile()`` block.

    A step of several calls and collectives in one command (``synkhronos.steps``, a
    training step) is one ``"step"`` record, holding the command's wait for the
    slowest worker; its calls are ``"call"`` records with their own phases.
    """

    records: list[CallRecord] = field(default_factory=list)
    _calls_in_step: int = 0  # calls of the last step still to report (their wait is its)

    # -- the session's observer protocol --------------------------------------------------
    def command(self, message: Message, total: float, own: float, wait: float) -> None:
        """A command finished (function calls also report their phases, in ``call``)."""
        if isinstance(message, Call):
            return
        if isinstance(message, Sequence):
            self._calls_in_step = sum(isinstance(m, Call) for m in message.steps)
            self.records.append(CallRecord("step", None, total=total, straggler=wait))
            return
        self.records.append(CallRecord("collective", None, total=total, straggler=wait))

    def call(self, name: str | None, *, start: float, staged: float, ran: float, done: float,
             straggler: float, gather: list[float], function: list[float]) -> None:
        """A function call's phases (``perf_counter`` times, per-rank seconds)."""
        total = done - start
        if self._calls_in_step:  # part of a step: the step's record holds the command
            self._calls_in_step -= 1
            straggler = 0.0
            total = (staged - start) + (done - ran)  # its parts outside the command
        self.records.append(CallRecord(
            "call", name, total=total, stage=staged - start, straggler=straggler,
            reduce=done - ran, gather=gather, function=function,
        ))

    # -- reading ----------------------------------------------------------------------------
    def summary(self) -> dict[str, float]:
        """Totals in seconds: the per-rank phases are averaged over the ranks that ran.

        ``function_max`` sums the slowest rank's function time per call, so
        ``function_max - function`` is the imbalance between processes.
        """
        calls = [r for r in self.records if r.kind == "call"]
        collectives = [r for r in self.records if r.kind == "collective"]
        steps = [r for r in self.records if r.kind == "step"]

        def mean(values: list[float]) -> float:
            return sum(values) / len(values) if values else 0.0

        return {
            "calls": len(calls),
            "collectives": len(collectives),
            "steps": len(steps),
            "total": sum(r.total for r in self.records),
            "stage": sum(r.stage for r in calls),
            "gather": sum(mean(r.gather) for r in calls),
            "function": sum(mean(r.function) for r in calls),
            "function_max": sum(max(r.function, default=0.0) for r in calls),
            "straggler": sum(r.straggler for r in calls + steps),
            "reduce": sum(r.reduce for r in calls),
            "collective": sum(r.total for r in collectives),
        }


@contextlib.contextmanager
def profile() -> Iterator[Profile]:
    """Record where the time of every call and collective goes inside the block.

    Examples
    --------
    >>> with synk.profile() as prof:                       # doctest: +SKIP
    ...     for idx in batches:
    ...         train(x, y, batch=idx)
    >>> prof.summary()["straggler"]                        # doctest: +SKIP
    """
    session = require("synk.profile()")
    if session.observer is not None:
        raise RuntimeError("synk.profile() blocks cannot be nested")
    result = Profile()
    session.observer = result
    try:
        yield result
    finally:
        session.observer = None
