"""A synkhronos master that spends its time in its own share of each call, in
compiled code of one of PyTensor's backends.

Usage: ``python master_busy_in_share.py BACKEND N ROUNDS``

``BACKEND`` is ``c`` (PyTensor's C virtual machine, ``Mode(linker="cvm")``), ``numba``
(mode ``"NUMBA"``) or ``jax`` (mode ``"JAX"``); ``N`` the number of processes; the test
interrupts the program ``ROUNDS`` times.

Ctrl-C is made deliverable first (Python's default SIGINT handler), whatever this
process inherited: a test suite started in the background has SIGINT ignored.

Forks ``N`` processes and builds one function whose every call runs a long compiled
kernel on each process's rows: a sort (Numba, JAX) or a fused elementwise loop with
its sum (the C backend, where PyTensor's sort is Python code calling numpy). The
master is given most of the rows (``shares``), so that it spends nearly all of each
call inside its own share's kernel, not waiting for the workers. Before the loop it
prints ``{"master", "workers", "prefix"}`` as one JSON line on stdout. Then, per
round, it prints ``{"ready": k}`` and calls the function again and again (for up to
60 s) until the test's SIGINT arrives. That must come back as ``KeyboardInterrupt``,
never a ``WorkerError``, and the session must stay usable: the program catches it,
calls once more (which first waits for the workers still in the interrupted call) and
prints ``{"round", "raised", "again", "expected", "state", "cause", "links"}``: when
it was raised (``time.monotonic()``), the result, what numpy gives, the session's
state, the type of the exception the interruption was raised from inside the call
(None: the handler's own ``KeyboardInterrupt``, raised in Python code) and the length
of the chain its traceback shows. After the last round it raises the interruption
again, so that it ends by ``KeyboardInterrupt`` (the exit handler closes the
session).
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
from pytensor.compile.mode import Mode  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos import testing  # noqa: E402

# Rows per call: the master's share takes 0.05-0.2 s here (JAX's sort on the CPU is
# slower than Numba's)
ROWS = {"c": 2_000_000, "numba": 2_000_000, "jax": 400_000}


def build(backend: str):
    """The function, and what numpy gives for it on the whole rows."""
    x = pt.dvector("x")
    if backend == "c":
        kernel = (pt.tanh(x) * pt.exp(-x * x)).sum()
        mode: object = Mode(linker="cvm")

        def expected(values):
            return float(np.sum(np.tanh(values) * np.exp(-values * values)))
    else:
        kernel = pt.sort(x).sum()
        mode = "NUMBA" if backend == "numba" else "JAX"

        def expected(values):
            return float(np.sort(values).sum())
    return synk.function([x], (kernel, "sum"), mode=mode), expected


def links(exc: BaseException) -> int:
    """How many exceptions the traceback of ``exc`` shows (its chain, as Python prints
    it: a context raised ``from None`` is not shown)."""
    count, seen, current = 0, set(), exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        count += 1
        context = None if current.__suppress_context__ else current.__context__
        current = current.__cause__ or context
    return count


def main() -> None:
    backend, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    synk.fork(n)
    f, expected = build(backend)
    synk.distribute()
    rows = synk.data(np.random.default_rng(0).random(ROWS[backend]))
    shares = None if n == 1 else [4.0 * n] + [1.0] * (n - 1)  # the master: most rows
    f(rows, shares=shares)  # compiled and warm
    f(rows, shares=shares)
    info = {"master": os.getpid(), "workers": testing.run_on_ranks(os.getpid)[1:],
            "prefix": testing.program_prefix()}
    print(json.dumps(info), flush=True)
    for k in range(rounds):
        print(json.dumps({"ready": k}), flush=True)
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                f(rows, shares=shares)
        except KeyboardInterrupt as exc:
            raised = time.monotonic()  # (the same clock in every process)
            again = float(f(rows, shares=shares))  # waits for the workers first
            # (the session raises the interruption afresh, ``from None``: the one it
            # caught is the context it does not show)
            caught = exc.__context__ if exc.__suppress_context__ else exc
            cause = caught.__cause__ if caught is not None else None
            print(json.dumps({
                "round": k, "raised": raised, "again": again,
                "expected": expected(rows.data),
                "state": testing.session_state(),
                "cause": None if cause is None else type(cause).__name__,
                "links": links(exc)}), flush=True)
            if k == rounds - 1:
                raise
        else:
            sys.exit("no interrupt came")


if __name__ == "__main__":
    main()
