"""A synkhronos program that ends without calling ``synk.close()``.

Usage: ``python lifecycle_exit.py MODE``, MODE one of

- ``no_close``: forks 3 processes, runs a command, and returns normally: the
  ``atexit`` hook must close the session (exit status 0);
- ``uncaught_died``: a worker calls ``os._exit(3)`` and the script does not catch the
  ``WorkerDiedError`` (exit status 1);
- ``uncaught_error``: a worker raises and the script does not catch the
  ``WorkerError`` (exit status 1).

Before the failing command it prints ``{"master", "workers", "prefix"}`` as one JSON
line on stdout, so the test can check that nothing of the program is left.
"""

from __future__ import annotations

import json
import os
import sys

import synkhronos as synk
from synkhronos import session as S
from synkhronos._runtime import shmem


def fail(message: str):
    raise ValueError(message)


def main() -> None:
    mode = sys.argv[1]
    # This program compiles nothing: skip fork()'s pre-import of the Numba backend.
    S._preimport_backend = lambda: None
    synk.fork(3)
    session = S.current()
    shmem.create_segment(session.prefix + "data0", 4096)
    info = {
        "master": os.getpid(),
        "workers": [w.pid for w in session.workers],
        "prefix": session.prefix,
    }
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()
    session.run(S.Opcode.PING)
    if mode == "uncaught_died":
        session.run(S.Opcode.CALLABLE, (os._exit, (3,), [2]))
    elif mode == "uncaught_error":
        session.run(S.Opcode.CALLABLE, (fail, ("not caught",), [1]))
    elif mode != "no_close":
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
