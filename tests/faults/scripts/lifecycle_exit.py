"""A synkhronos program that ends without calling ``synk.close()``.

Usage: ``python lifecycle_exit.py MODE``, MODE one of

- ``no_close``: forks 3 processes, runs a command, and returns normally: the
  ``atexit`` hook must close the session (exit status 0);
- ``uncaught_died``: a worker calls ``os._exit(3)`` and the script does not catch the
  ``WorkerDiedError`` (exit status 1);
- ``uncaught_error``: a worker raises and the script does not catch the
  ``WorkerError`` (exit status 1);
- ``uncaught_sys_exit``: a worker calls ``sys.exit(5)``, a failure like any exception:
  the script does not catch the ``WorkerError`` (exit status 1, not 5).

Before the failing command it makes a ``synk.data`` (a segment the exit must remove)
and prints ``{"master", "workers", "prefix"}`` as one JSON line on stdout, so the test
can check that nothing of the program is left.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import synkhronos as synk
from synkhronos import testing


def fail(message: str):
    raise ValueError(message)


def main() -> None:
    mode = sys.argv[1]
    # This program compiles nothing: skip fork()'s pre-import of the Numba backend.
    testing.skip_backend_preimport()
    synk.fork(3)
    synk.data(np.arange(512.0))
    info = {
        "master": os.getpid(),
        "workers": testing.run_on_ranks(os.getpid)[1:],
        "prefix": testing.program_prefix(),
    }
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()
    testing.ping()
    if mode == "uncaught_died":
        testing.crash(2, "exit", code=3)
    elif mode == "uncaught_error":
        testing.run_on_ranks(fail, "not caught", ranks=[1])
    elif mode == "uncaught_sys_exit":
        testing.run_on_ranks(sys.exit, 5, ranks=[1])
    elif mode != "no_close":
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
