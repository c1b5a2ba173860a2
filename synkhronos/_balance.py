"""Rows in proportion to measured speed: each process's share of a repeated call.

Public as ``synkhronos.steps.Balancer`` (its ``record`` is a step's ``timings``, its
``shares()`` the next call's ``shares``); the training step's ``balance=True`` and
``synkhronos.pymc``'s divided likelihood use it.

A synchronous step waits for its slowest process, and on a shared machine which
process is slower follows the core it sits on, not its role (the master's gradient
took 8% longer than the worker's in one run, the worker's 9% longer in the next). A
``Balancer`` watches the seconds each process takes for its rows, step after step,
and proposes ``shares`` for the next call (``f(..., shares=...)``): each process's
rows per second, so that the processes finish together.

1. ``record``: after a call run with timings (``synk.steps.call(..., timings=...)``),
   each process's seconds per row is kept, the last ``window`` of them; the first
   ``skip`` calls are left out (first-call costs: allocation, caches).
2. ``shares``: None (the even split) until every process has ``window // 2``
   measurements; then each process's speed, the inverse of the interquartile mean of
   its seconds per row (the middle half of them: a step slowed by another program
   counts for nothing, and the mean of the middle half wanders less than a median),
   normalized to sum to 1.
3. The shares in use (at first the even split) change only when some process's
   proposed share differs from its current one by more than ``tolerance``: equal
   shares give the same split, so the call's message repeats (it is pickled once), a
   process keeps the same rows while the measurements wander within their noise, and
   processes equally fast keep the even split.

Why the split converges on equal times, even with a fixed cost per call: a process
given more rows than its fair part takes longer than the others; its rows per second
are then a smaller share of the sum than its rows are of the step, so the next split
gives it fewer rows. At the fixed point every process takes the same time.

Pure Python; nothing here moves data or talks to processes.
"""

from __future__ import annotations

import statistics
from collections import deque

__all__ = ["Balancer"]


class Balancer:
    """Each process's share of the rows, from the seconds it took for its rows.

    Parameters
    ----------
    parts : int
        Number of processes, >= 2.
    window : int
        Measurements kept per process; shares are proposed once each process has
        half of them.
    skip : int
        Calls recorded before measuring starts (their timings are dropped).
    tolerance : float
        How far (as a fraction of the rows) a process's proposed share must move from
        its current one before the shares in use change.
    """

    def __init__(self, parts: int, window: int = 32, skip: int = 2,
                 tolerance: float = 0.005) -> None:
        if parts < 2:
            raise ValueError(f"a Balancer splits rows over at least 2 processes; got {parts}")
        self.parts = parts
        self._per_row: list[deque[float]] = [deque(maxlen=window) for _ in range(parts)]
        self._needed = max(1, window // 2)
        self._skip = skip
        self._tolerance = tolerance
        self._shares: tuple[float, ...] | None = None
        self.changes = 0  # times the shares in use changed

    @property
    def in_use(self) -> tuple[float, ...] | None:
        """The shares the last call of :meth:`shares` gave (None: the even split)."""
        return self._shares

    def record(self, timings: list[tuple[int, float] | None]) -> None:
        """Keep each process's seconds per row from one call's ``(rows, seconds)`` (in
        rank order; None or zero rows: that process ran nothing, no measurement)."""
        if self._skip > 0:
            self._skip -= 1
            return
        for samples, timing in zip(self._per_row, timings, strict=True):
            if timing is None:
                continue
            rows, seconds = timing
            if rows > 0 and seconds > 0:
                samples.append(seconds / rows)

    def proposed(self) -> tuple[float, ...] | None:
        """The shares the measurements give now (None until there are enough)."""
        if any(len(samples) < self._needed for samples in self._per_row):
            return None
        speeds = [1.0 / _middle_mean(samples) for samples in self._per_row]
        total = sum(speeds)
        return tuple(speed / total for speed in speeds)

    def shares(self) -> tuple[float, ...] | None:
        """The shares for the next call: None (the even split) until every process has
        been measured, then the shares in use, moved only beyond ``tolerance``."""
        proposed = self.proposed()
        if proposed is None:
            return self._shares
        current = self._shares or (1.0 / self.parts,) * self.parts  # None: even
        moved = max(abs(p - c) for p, c in zip(proposed, current, strict=True))
        if moved > self._tolerance:
            self._shares = proposed
            self.changes += 1
        return self._shares


def _middle_mean(samples: deque[float]) -> float:
    """The mean of the middle half of ``samples`` (the interquartile mean)."""
    ordered = sorted(samples)
    cut = len(ordered) // 4
    return statistics.fmean(ordered[cut:len(ordered) - cut])
