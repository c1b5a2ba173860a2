"""A synkhronos program that keeps data in shared memory and answers commands on stdin.

Usage: ``python isolation_program.py [--sweep-only]``

By default it forks 2 processes, fills a ``synk.data`` with values derived from its own
pid, builds and distributes one small function (``FAST_COMPILE``), calls it once, and
prints ``{"master", "workers", "prefix", "segment"}`` as one JSON line. It then answers
each line of stdin with one JSON line:

- ``check``: its Data's segment still exists under its name and holds the values
  (opened afresh, by name), a call still returns the first call's result, and a new
  Data can be made and used: ``{"ok": true}``, or ``{"ok": false, "why": ...}``;
- ``close``: ``synk.close()``, answers ``{"closed": true}`` and exits.

The test kills it from outside to see what a crashed program leaves behind.

With ``--sweep-only`` it is a third program that cleans up after dead programs:
``fork(2)`` (which sweeps), ``close()``, then ``fork(1)`` and ``close()`` (which sweeps
once more); it prints ``{"swept": true}``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import testing

BATCH = [4, 1, 3, 0, 2]


def say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def sweep_only() -> None:
    testing.skip_backend_preimport()  # nothing to compile here
    synk.fork(2)
    synk.close()
    synk.fork(1)
    synk.close()
    say({"swept": True})


def check(f, xd, values: np.ndarray, first: list) -> dict:
    # by name, afresh: fails if unlinked
    stored = np.fromfile(f"/dev/shm/{xd.ref().segment}", dtype=values.dtype,
                         count=values.size).reshape(values.shape)
    if not np.array_equal(stored, values):
        return {"ok": False, "why": "the Data's segment holds other values"}
    again = f(xd, batch=BATCH)
    if not all(np.array_equal(a, b) for a, b in zip(again, first, strict=True)):
        return {"ok": False, "why": "the function returned another result"}
    fresh = f(synk.data(values + 1), batch=BATCH)
    if not np.array_equal(fresh[0], values[BATCH] + 1):
        return {"ok": False, "why": "a new Data gave a wrong result"}
    return {"ok": True}


def serve() -> None:
    # This program compiles nothing for Numba: skip fork()'s pre-import of its backend.
    testing.skip_backend_preimport()
    synk.fork(2)
    values = np.arange(5 * 3, dtype=np.float64).reshape(5, 3) + os.getpid()
    xd = synk.data(values)
    x = pt.dmatrix("x")
    f = synk.function([x], [(x, "gather"), (x.sum(), "sum")], mode="FAST_COMPILE")
    synk.distribute()
    first = f(xd, batch=BATCH)
    say({
        "master": os.getpid(),
        "workers": testing.run_on_ranks(os.getpid)[1:],
        "prefix": testing.program_prefix(),
        "segment": xd.ref().segment,
    })
    for line in sys.stdin:
        command = line.strip()
        if command == "check":
            try:
                say(check(f, xd, values, first))
            except Exception as exc:  # report, keep serving
                say({"ok": False, "why": f"{type(exc).__name__}: {exc}"})
        elif command == "close":
            synk.close()
            say({"closed": True})
            return
        else:
            say({"ok": False, "why": f"unknown command {command!r}"})


if __name__ == "__main__":
    sweep_only() if "--sweep-only" in sys.argv[1:] else serve()
