"""synk.profile(): where the time of each call goes, in the paper's Table 1 terms.

While a ``Profile`` is active, every command records:

- ``stage``: the master's binding, validation and copying into shared memory;
- ``gather``: each process's building of its rows (the parallel shuffle of a
  ``batch`` index list), per rank;
- ``function``: each process's PyTensor function time (all slices), per rank;
- ``straggler``: how long the master waited for the slowest worker after finishing
  its own share;
- ``reduce``: the master's reduction of the outputs;
- ``collective``: whole collectives (``all_reduce`` and the others), wall time.

When no profile is active, the library checks one attribute per command and records
nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from .session import require

__all__ = ["Profile", "profile"]


@dataclass
class CallRecord:
    """One command, timed."""

    kind: str  # "call" or "collective" or another opcode name
    name: str | None
    total: float = 0.0
    stage: float = 0.0
    straggler: float = 0.0
    reduce: float = 0.0
    gather: list[float] = field(default_factory=list)  # per rank that ran
    function: list[float] = field(default_factory=list)  # per rank that ran


@dataclass
class Profile:
    """The records of one ``synk.profile()`` block."""

    records: list[CallRecord] = field(default_factory=list)

    def record_command(self, kind: str, total: float) -> None:
        """The session's record of a command other than a function call."""
        self.records.append(CallRecord(kind, None, total=total))

    def summary(self) -> dict[str, float]:
        """Totals in seconds: the per-rank phases are averaged over the ranks that ran.

        ``function_max`` sums the slowest rank's function time per call, so
        ``function_max - function`` is the imbalance between processes.
        """
        calls = [r for r in self.records if r.kind == "call"]
        collectives = [r for r in self.records if r.kind == "collective"]

        def mean(values: list[float]) -> float:
            return sum(values) / len(values) if values else 0.0

        return {
            "calls": len(calls),
            "collectives": len(collectives),
            "total": sum(r.total for r in self.records),
            "stage": sum(r.stage for r in calls),
            "gather": sum(mean(r.gather) for r in calls),
            "function": sum(mean(r.function) for r in calls),
            "function_max": sum(max(r.function, default=0.0) for r in calls),
            "straggler": sum(r.straggler for r in calls),
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
    if session.profile is not None:
        raise RuntimeError("synk.profile() blocks cannot be nested")
    result = Profile()
    session.profile = result
    try:
        yield result
    finally:
        session.profile = None
