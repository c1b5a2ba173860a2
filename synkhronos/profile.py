"""synk.profile(): where the time of each call goes, in the paper's Table 1 terms.

A ``Profile`` is an instrument of the session (``Session.instrument``, as Trio's
instruments watch its run): while a ``synk.profile()`` block is active, the session
hands it every command to run (``command``: it times the whole command and the
master's own share in it, and reads each rank's seconds from the replies of a call),
and each function call hands it the whole call (``call``: it times the master's work
before and after the command). The phases of a call:

- ``stage``: the master's binding, validation and copying into shared memory (for a
  call that replays an earlier one, the copy of its arrays, as outside the block);
- ``gather``: each process's building of its rows (the parallel shuffle of a
  ``batch`` index list), per rank;
- ``function``: each process's PyTensor function time (all slices), per rank;
- ``straggler``: how long the master waited for the slowest worker after finishing
  its own share;
- ``reduce``: the master's reduction of the outputs;
- ``collective``: whole commands other than function calls (``all_reduce`` and the
  other collectives), wall time.

A step (``synkhronos.steps``: a training step's calls and collectives in one command)
is timed on every rank (a ``timed`` ``Sequence``): its ``phases`` give, per rank,

- ``compute``: the function time of its calls, the update's left out;
- ``gather``: the building of its rows;
- ``update``: the function time of the update (calls compiled as ``train_apply*``);
- ``exchange``: its collectives' time, less its waits;
- ``wait``: time at meeting points waiting for the slowest rank (with the master's
  wait for the slowest worker at the end of the command);
- ``other``: the rest of its calls (partition, reply: the Python path);

and beside them ``cpu`` and ``cpu_exchange``, the process's CPU seconds in the step
and in its collectives: with more processes than cores, wall times say who waited for
a core, CPU times what each rank's work cost (a spinning wait counts as CPU time, a
blocked one does not).

``Profile.per_rank()`` sums them over the block's steps, ``Profile.step_phases()``
gives them step by step. Waits between machines (the leaders' exchange over MPI) count
as ``exchange``.

Starting or ending a block moves the epoch on (``_runtime/epoch.py``): the calls kept
for replay are made again, with messages that ask every rank for its seconds (or no
longer ask), so that a profiled call takes the path it takes unprofiled. With no
block active, nothing is recorded and a command checks one attribute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ._call import Call
from ._core.protocol import Message, Sequence
from ._core.session import Run, require
from ._runtime import epoch
from .distribute import REGISTRY

__all__ = ["Profile", "profile", "CallRecord", "PHASES"]

#: A step's phases per rank, in the order they are drawn (``Profile.per_rank``).
PHASES = ("compute", "gather", "update", "exchange", "wait", "other")
#: Beside them, the rank's CPU seconds in the step and in its collectives.
CPU = ("cpu", "cpu_exchange")


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
    phases: list[dict[str, float]] = field(default_factory=list)  # a step's, by rank


@dataclass
class Profile:
    """The records of one ``synk.profile()`` block.

    A step of several calls and collectives in one command (``synkhronos.steps``, a
    training step) is one ``"step"`` record, holding the command's wait for the
    slowest worker; each of its calls is a ``"call"`` record with its ranks' phases.
    """

    records: list[CallRecord] = field(default_factory=list)
    # Function names by compiled function id (the registry's, in the master)
    names: Callable[[int], str | None] = lambda fn_id: None
    master: int = 0  # the master's rank (its wait for the slowest worker is its own)
    # (start, end, record) of the last command that was one call, for ``call``
    _command: tuple[float, float, CallRecord] | None = None

    # -- the session's instrument protocol -------------------------------------------------
    def command(self, message: Message, run: Run, share: Any, key: Any) -> Any:
        """Run one command (``run``), timing it and the master's own share in it."""
        marks = [0.0, 0.0]

        def timed(message: Message) -> Any:  # the master's own share
            marks[0] = time.perf_counter()
            try:
                return share(message)
            finally:
                marks[1] = time.perf_counter()

        if isinstance(message, Sequence):  # every rank times each step
            message = dataclasses.replace(message, timed=True)
            key = None if key is None else message
        start = time.perf_counter()
        result = run(message, timed, key)
        end = time.perf_counter()
        replies, wait = result[0], end - max(marks[1], start)
        if isinstance(message, Call):
            record = self._call_record(message, replies, total=end - start, straggler=wait)
            self._command = (start, end, record)
        elif isinstance(message, Sequence):
            record = CallRecord("step", None, total=end - start, straggler=wait)
            self.records.append(record)
            for i, step in enumerate(message.steps):
                if isinstance(step, Call):  # (a rank that failed replied otherwise)
                    self._call_record(step, [reply[i] if isinstance(reply, (tuple, list))
                                             else None for reply in replies])
            record.phases = self._phases(message, replies, wait)
        else:
            self.records.append(CallRecord("collective", None, total=end - start,
                                           straggler=wait))
        return result

    def _call_record(self, call: Call, replies: list, total: float = 0.0,
                     straggler: float = 0.0) -> CallRecord:
        """A call's record, with each rank's (gather, function) seconds from its reply."""
        timings = [t for t in map(_call_timings, replies) if t is not None]
        record = CallRecord("call", self.names(call.prepared_id), total=total,
                            straggler=straggler, gather=[t[0] for t in timings],
                            function=[t[1] for t in timings])
        self.records.append(record)
        return record

    def _phases(self, message: Sequence, replies: list, straggler: float,
                ) -> list[dict[str, float]]:
        """Each rank's phases of one timed step (see the module's docstring)."""
        kinds = []
        for step in message.steps:
            if isinstance(step, Call):
                name = self.names(step.prepared_id) or ""
                kinds.append("update" if name.startswith("train_apply") else "compute")
            else:
                kinds.append("exchange")
        phases = []
        count = len(message.steps)
        for rank, reply in enumerate(replies):
            if not isinstance(reply, tuple) or len(reply) != count + 1:
                continue  # (a rank that failed)
            times = dict.fromkeys(PHASES + CPU, 0.0)
            for kind, step_reply, (seconds, waited, cpu) in zip(kinds, reply, reply[count],
                                                                strict=False):
                times["wait"] += waited
                times["cpu"] += cpu
                if kind == "exchange":
                    times["exchange"] += seconds - waited
                    times["cpu_exchange"] += cpu
                    continue
                gather, function = _call_timings(step_reply) or (0.0, 0.0)
                times["gather"] += gather
                times[kind] += function
                times["other"] += seconds - waited - gather - function
            if rank == self.master:
                times["wait"] += straggler
            phases.append({"rank": rank, **times})
        return phases

    def call(self, run: Callable[..., Any], *args: Any) -> Any:
        """Run one function call (``run(*args)``): its command's record gets the
        master's staging before the command and reduction after it."""
        start = time.perf_counter()
        self._command = None
        result = run(*args)
        done = time.perf_counter()
        if self._command is not None:
            began, ended, record = self._command
            record.stage, record.reduce, record.total = began - start, done - ended, done - start
        return result

    # -- reading ----------------------------------------------------------------------------
    def step_phases(self) -> list[list[dict[str, float]]]:
        """Per step of the block (``"step"`` records), each rank's phases, in seconds."""
        return [r.phases for r in self.records if r.kind == "step"]

    def per_rank(self) -> list[dict[str, float]]:
        """Per rank, its phases summed over the block's steps, in seconds (``rank``:
        which; ``steps``: how many it ran)."""
        totals: dict[int, dict[str, float]] = {}
        for step in self.step_phases():
            for entry in step:
                rank = int(entry["rank"])
                into = totals.setdefault(rank, {"rank": rank, "steps": 0,
                                                **dict.fromkeys(PHASES + CPU, 0.0)})
                into["steps"] += 1
                for phase in PHASES + CPU:
                    into[phase] += entry[phase]
        return [totals[rank] for rank in sorted(totals)]

    def summary(self) -> dict[str, float]:
        """Totals in seconds: the per-rank phases are averaged over the ranks that ran.

        ``function_max`` sums the slowest rank's function time per call, so
        ``function_max - function`` is the imbalance between processes. The steps'
        phases (``per_rank``) come as ``step_<phase>`` (``step_compute``,
        ``step_update``, ``step_exchange``, ``step_wait``, ...: averaged over the
        ranks), and ``step_compute_max`` sums the slowest rank's compute per step: at
        any number of processes, one process included (all zero without steps).
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
            **self._step_summary(),
        }

    def _step_summary(self) -> dict[str, float]:
        """``summary``'s step phases (see there)."""
        ranks = self.per_rank()
        out = {f"step_{phase}": (sum(entry[phase] for entry in ranks) / len(ranks)
                                 if ranks else 0.0) for phase in PHASES + CPU}
        out["step_compute_max"] = sum(max((entry["compute"] for entry in step), default=0.0)
                                      for step in self.step_phases())
        return out


def _call_timings(reply: Any) -> tuple[float, float] | None:
    """A rank's (gather, function) seconds from its reply to a timed call, or None (a
    rank that ran nothing, or failed)."""
    if isinstance(reply, (tuple, list)) and len(reply) > 2:
        return float(reply[2][0]), float(reply[2][1])
    return None


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
    if session.instrument is not None:
        raise RuntimeError("synk.profile() blocks cannot be nested")
    functions = REGISTRY.get(session.ctx).functions
    result = Profile(names=lambda fn_id: getattr(functions.get(fn_id), "name", None),
                     master=session.ctx.master_rank)
    session.instrument = result
    epoch.advance()  # what was kept for replay is made again, timed
    try:
        yield result
    finally:
        session.instrument = None
        epoch.advance()
