"""Run under mpiexec (2 machines x ``--processes``): Ctrl-C (SIGINT to the master) keeps
the session over several machines as on one (SPEC section 6).

Ctrl-C is made deliverable first (Python's default SIGINT handler), whatever this
process inherited: a test suite started in the background has SIGINT ignored. A
thread of the master sends the SIGINT to it (``os.kill``) and records when.

``--case``:

- ``calls``: a compiled function of a few hundred ms per call on every machine (40
  nested sines over 1M rows) is called in a loop, interrupted after 4 delays, so that
  Ctrl-C lands at various points of a call (the master's own share, its wait for its
  workers, its wait for the other machine); then a loop of collectives (``broadcast``
  and ``all_reduce`` of a 1.6 MB variable, moved between the machines), interrupted
  after 4 delays. After each interrupt the next call must equal numpy's result, and
  the collectives must give every process ``n`` times ones.
- ``in_transfer``: machine 1's leader is stopped inside an all-reduce, after the vote,
  before it moves data (``testing.fault_at("exchange", "stop")``); the master waits
  for it at the exchange between machines when the SIGINT comes, and 0.1 s later the
  leader goes on: the interrupt waits for the transfer, then is raised, and the
  session goes on.
- ``past_grace``: the same, but the leader goes on only 3 s later: the interrupt is
  raised after ``INTERRUPT_GRACE`` (1 s) with a note saying that the session is
  broken; ``close()`` then ends the job.
- ``remote_busy``: the last rank (on machine 1) sleeps 4 s inside a command; the
  master, waiting for it, is interrupted, then interrupted again while the next call
  waits for that command to end there; the call after waits it out and is right.
  Then a last interrupt between commands ends the program: ``close()`` at exit ends
  the session as usual, with no command pending.
- ``close_pending``: the same with a 2 s sleep, and ``synk.close()`` right after the
  interrupt: it waits for machine 1 to end the command, then closes as usual (the
  program goes on after it).
- ``exit_pending``: the same with a 30 s sleep, and the program ends on the
  interrupt: ``close()`` at exit waits up to 5 s for machine 1, then ends the job.

The master writes ``session.json`` (pids, by rank) first, and ``master.json`` (what it
saw: each interrupt's latency from the SIGINT, the results after it, the session's
state) at the end; every wait of the script has a deadline.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos import testing  # noqa: E402

ROWS = 1_000_000
SINES = 40  # per row: a call takes a few hundred ms on every machine
BIG = 200_000  # float64: 1.6 MB, over the 1 MiB from which all_reduce sends chunks
DEADLINE = 60.0  # seconds any loop waits for the interrupt


def chain(values, lib):
    for _ in range(SINES):
        values = lib.sin(values) + 0.5
    return values


def slow_on(rank: int, seconds: float) -> None:
    if testing.this_rank() == rank:
        time.sleep(seconds)


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


class Interrupter:
    """A thread that sends SIGINT to this process after ``delay`` seconds (or once
    ``ready()`` is true), then runs ``after``; ``sent`` holds when it sent it."""

    def __init__(self, delay: float, ready: Callable[[], bool] | None = None,
                 after: Callable[[], None] | None = None):
        self.delay, self.ready, self.after = delay, ready, after
        self.sent: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.ready is not None:
            end = time.monotonic() + DEADLINE
            while not self.ready() and time.monotonic() < end:
                time.sleep(0.01)
        time.sleep(self.delay)
        self.sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
        if self.after is not None:
            self.after()

    def latency(self, raised: float) -> float:
        self.thread.join(DEADLINE)
        assert self.sent is not None
        return raised - self.sent


def interrupted(step: Callable[[], object], interrupter: Interrupter) -> float:
    """Run ``step`` until the interrupt comes; its latency (seconds from the SIGINT)."""
    end = time.monotonic() + DEADLINE
    try:
        while time.monotonic() < end:
            step()
    except KeyboardInterrupt:
        return interrupter.latency(time.monotonic())
    raise AssertionError(f"no KeyboardInterrupt within {DEADLINE} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", required=True)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    out, case = args.out, args.case
    n = synk.fork(args.processes, timeout=DEADLINE)
    x = pt.dvector("x")
    f = synk.function([x], (chain(x, pt).sum(), "sum"))
    big = pytensor.shared(np.zeros(BIG), name="big")
    use = synk.function([], (big.sum(), "sum"))  # (big is a distributed variable)
    synk.distribute()
    values = np.random.default_rng(0).random(ROWS)
    data = synk.data(values)
    expected = float(chain(values, np).sum())
    ones = np.ones(BIG)
    pids = testing.process_pids()
    (out / "session.json").write_text(json.dumps({"pids": pids, "n": n}))
    other = testing.rank_machines().index(1)  # machine 1's leader

    def call_is_right() -> bool:
        return bool(np.isclose(float(f(data)), expected, rtol=1e-9))

    def collectives_are_right() -> bool:
        synk.broadcast(big, ones)
        synk.all_reduce(big, "sum")
        use()
        return all(np.array_equal(synk.get_value(r, big), n * ones) for r in (0, n - 1))

    def collectives() -> None:
        synk.broadcast(big, ones)
        synk.all_reduce(big, "sum")

    assert call_is_right() and collectives_are_right()  # compiled, warm
    seen: dict = {"n": n}
    try:
        if case == "calls":
            rounds = []
            for phase, step, check in (("calls", lambda: f(data), call_is_right),
                                       ("collectives", collectives, collectives_are_right)):
                for delay in (0.05, 0.3, 0.55, 0.8):
                    latency = interrupted(step, Interrupter(delay))
                    rounds.append({"phase": phase, "delay": delay, "latency": latency,
                                   "right": check(), "state": testing.session_state()})
            seen.update(rounds=rounds, after=call_is_right() and collectives_are_right())
        elif case in ("in_transfer", "past_grace"):
            goes_on = 0.1 if case == "in_transfer" else 3.0

            def resume() -> None:
                time.sleep(goes_on)
                os.kill(pids[other], signal.SIGCONT)

            with testing.fault_at("exchange", "stop", [other]):
                interrupter = Interrupter(0.5, lambda: state_of(pids[other]) == "T", resume)
                try:
                    synk.all_reduce(big, "sum")
                    raise AssertionError("no KeyboardInterrupt")
                except KeyboardInterrupt as exc:
                    seen.update(latency=interrupter.latency(time.monotonic()),
                                notes=getattr(exc, "__notes__", []),
                                state=testing.session_state())
            if case == "in_transfer":
                seen.update(after=call_is_right() and collectives_are_right(),
                            state_after=testing.session_state())
            else:
                try:
                    f(data)
                except RuntimeError as exc:
                    seen.update(next_error=str(exc))
        elif case in ("remote_busy", "close_pending", "exit_pending"):
            seconds = {"remote_busy": 4.0, "close_pending": 2.0, "exit_pending": 30.0}[case]
            start = time.monotonic()
            interrupter = Interrupter(0.5)
            seen["latency"] = interrupted(
                lambda: testing.run_on_ranks(slow_on, n - 1, seconds), interrupter)
            seen["state"] = testing.session_state()
            if case == "close_pending":
                synk.close()
                seen["closed_after"] = time.monotonic() - start
                seen["open"] = testing.session_open()
            elif case == "exit_pending":
                seen["raised_after"] = time.monotonic() - start
                seen["raised_at"] = time.time()  # (the test's clock: the job's end)
                (out / "master.json").write_text(json.dumps(seen))
                raise KeyboardInterrupt  # the program ends on it; close() runs at exit
            else:
                seen["again"] = interrupted(lambda: f(data), Interrupter(0.5))  # its wait
                waited = time.monotonic()
                seen["right"] = call_is_right()  # waits for the sleep to end, then runs
                seen["waited"] = time.monotonic() - waited
                seen["since_start"] = time.monotonic() - start
                seen["after"] = collectives_are_right()
                os.kill(os.getpid(), signal.SIGINT)  # between commands: the program
                time.sleep(DEADLINE)  # ends on it, and close() at exit is orderly
        else:
            raise SystemExit(f"unknown case {case!r}")
    finally:
        if case != "exit_pending":
            (out / "master.json").write_text(json.dumps(seen))
    synk.close()  # past_grace: ends the job (close_pending: closed already)


if __name__ == "__main__":
    main()
