"""A synkhronos master that spends its time in its own share of each call.

Usage: ``python master_busy_in_share.py``

Ctrl-C is made deliverable first (Python's default SIGINT handler), whatever this
process inherited: a test suite started in the background has SIGINT ignored.

Forks 2 processes, then calls a function whose every call sorts a million rows per
process in a Numba kernel, again and again for up to 60 s. Before the loop it prints
``{"master", "workers", "prefix"}`` as one JSON line on stdout. The test sends SIGINT
to the master alone: it nearly always lands while the master runs its share inside
the kernel, where Python's handler can only leave its ``KeyboardInterrupt`` behind a
``SystemError``. That must still be ``KeyboardInterrupt``, not a ``WorkerError``, and
the session must stay usable: the program catches it, calls once more, prints
``{"again", "expected", "state"}`` as a second JSON line, and raises it again, so that
it ends by ``KeyboardInterrupt`` (the exit handler closes the session).
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos import testing  # noqa: E402


def main() -> None:
    synk.fork(2)
    x = pt.dvector("x")
    f = synk.function([x], (pt.sort(x).sum(), "sum"))
    synk.distribute()
    rows = synk.data(np.random.default_rng(0).random(2_000_000))
    f(rows)  # compiled and warm
    info = {"master": os.getpid(), "workers": testing.run_on_ranks(os.getpid)[1:],
            "prefix": testing.program_prefix()}
    print(json.dumps(info), flush=True)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            f(rows)
    except KeyboardInterrupt:
        again = float(f(rows))  # waits for the worker still in the interrupted call
        print(json.dumps({"again": again, "expected": float(np.sort(rows.data).sum()),
                          "state": testing.session_state()}), flush=True)
        raise


if __name__ == "__main__":
    main()
