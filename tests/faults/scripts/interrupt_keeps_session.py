"""A master that the test interrupts with Ctrl-C again and again, and that goes on.

Usage: ``python interrupt_keeps_session.py MARK_DIR``

Ctrl-C is made deliverable first (Python's default SIGINT handler), whatever this
process inherited: a test suite started in the background has SIGINT ignored.

It builds a small function (a sum of squares, and ``x`` times the sum of a shared
variable ``w``, gathered) and its plain PyTensor twin, forks 3 processes (``spin=0``),
distributes, prints ``{"master", "workers", "prefix"}`` as one JSON line, and then,
phase by phase, writes a marker file ``MARK_DIR/<name>`` (holding ``CLOCK_MONOTONIC``,
the same clock in every process) for the test, which sends SIGINT (to this process or
its whole group) when it sees it:

1. ``busy-1``: rank 1 sleeps ``BUSY_S`` inside a command;
2. ``loop-<k>`` (``LOOPS`` times): the master calls the function in a loop (the test
   waits a different moment each time, so that Ctrl-C lands at various points of a
   call), on inputs of every size in turn, or (odd ``k``) on one input again and
   again, whose command is posted again as it stood (the master's lane);
3. ``busy-2``: rank 2 sleeps ``BUSY_S`` inside a command, then ``settling``: the next
   call waits for it, and the test interrupts that wait too.

Each interrupt must raise ``KeyboardInterrupt`` here; after each, the function gives
the plain function's values and an ``all_reduce`` of ``w`` is right. The
last JSON line holds, per interrupt, the time it was raised (``raised``), whether the
checks after it held (``checks``: a list of failures), how long the first call after
the busy phases waited (``waited``), and, after ``close()``, ``children`` and ``left``.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos import testing  # noqa: E402

BUSY_S = 2.0
N = 3
LOOPS = 4  # loops of calls interrupted, each after another delay
MARKS = sys.argv[1]


def mark(name: str) -> None:
    path = os.path.join(MARKS, name)
    with open(path + ".tmp", "w") as f:
        f.write(repr(time.monotonic()))
    os.replace(path + ".tmp", path)


def busy(seconds: float) -> int:
    """The long command, on the rank it is sent to."""
    mark(f"busy-{testing.this_rank()}")
    time.sleep(seconds)
    return testing.this_rank()


def main() -> None:
    testing.skip_backend_preimport()
    x = pt.dvector("x")
    w = pytensor.shared(np.zeros(3), name="w")
    outputs = [pt.sum(x ** 2), x * w.sum()]
    plain = pytensor.function([x], outputs, mode="FAST_COMPILE")
    synk.fork(N, spin=0)
    f = synk.function([x], [(outputs[0], "sum"), (outputs[1], "gather")], mode="FAST_COMPILE")
    synk.distribute()
    pids = testing.run_on_ranks(os.getpid)
    print(json.dumps({"master": os.getpid(), "workers": pids[1:],
                      "prefix": testing.program_prefix()}), flush=True)
    rng = np.random.default_rng(7)
    inputs = [rng.normal(size=11 + k) for k in range(4)]
    failures: list[str] = []

    def check(when: str) -> None:
        testing.set_rank_values(w, [np.full(3, r + 1.0) for r in range(N)])
        synk.all_reduce(w, op="sum")  # every rank's w, the master's included: 6.0s
        if [v.tolist() for v in testing.rank_values(w)] != [[6.0] * 3] * N:
            failures.append(f"{when}: all_reduce gave {testing.rank_values(w)}")
        for k, value in enumerate(inputs):
            got, want = f(value), plain(value)
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                if not np.allclose(a, b, rtol=1e-12, atol=0):
                    failures.append(f"{when}: input {k} output {i}: {a} != {b}")

    check("before")
    raised: dict[str, float | str] = {}
    waited: dict[str, float] = {}

    def interrupted(name: str, action) -> None:
        try:
            action()
            raised[name] = "not interrupted"
        except KeyboardInterrupt:
            raised[name] = time.monotonic()

    interrupted("busy-1", lambda: testing.run_on_ranks(busy, BUSY_S, ranks=[1]))
    start = time.monotonic()
    check("after busy-1")
    waited["busy-1"] = time.monotonic() - start

    for k in range(LOOPS):
        def loop(k: int = k) -> None:
            mark(f"loop-{k}")
            for i in range(1_000_000):
                f(inputs[i % len(inputs) if k % 2 == 0 else 0])

        interrupted(f"loop-{k}", loop)
        check(f"after loop {k}")

    interrupted("busy-2", lambda: testing.run_on_ranks(busy, BUSY_S, ranks=[2]))
    mark("settling")
    interrupted("settling", lambda: f(inputs[0]))
    start = time.monotonic()
    check("after settling")
    waited["settling"] = time.monotonic() - start
    state = testing.session_state()
    synk.close()
    print(json.dumps({"raised": raised, "checks": failures, "waited": waited,
                      "state": state, "children": testing.child_pids(),
                      "left": testing.leftover_segments()}), flush=True)


if __name__ == "__main__":
    main()
