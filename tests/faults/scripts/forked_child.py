"""A synkhronos master whose process forks a child (``os.fork``) that tries to use it.

Usage: ``python forked_child.py``

The master forks 3 processes, builds and distributes one function over a shared
variable, makes a ``synk.data``, and calls the function once. It then forks a child,
as a sampler running chains in processes would. The child tries a function call, a
collective, ``synk.data``, ``synk.distribute`` and a command of
``synkhronos.testing``; each must raise ``RuntimeError``. It then calls ``synk.close()``
(which must do nothing there) and exits normally, through the interpreter's exit, so
its ``atexit`` hooks and finalizers run: none of them may close or sweep the master's
session.

Once the child is gone the master checks its session: still open and ready, the same
workers, the same shared-memory entries, the function and a collective still right.
It prints one JSON line: ``{"master", "workers", "prefix", "child": [[what, error type,
message], ...], "child_status": <its exit status>, "state", "same_workers",
"same_segments", "call_ok", "collective_ok"}``, then closes.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import testing


def child(f, w, xd, write_fd: int) -> None:
    seen = []
    attempts = {
        "call": lambda: f(xd),
        "all_reduce": lambda: synk.all_reduce(w),
        "data": lambda: synk.data(np.ones(3)),
        "distribute": synk.distribute,
        "ping": testing.ping,
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            seen.append([what, None, ""])
        except Exception as exc:  # noqa: BLE001 - reported to the master
            seen.append([what, type(exc).__name__, str(exc)])
    synk.close()  # not this process's session: nothing happens
    with os.fdopen(write_fd, "w") as out:
        out.write(json.dumps(seen))


def main() -> None:
    testing.skip_backend_preimport()  # FAST_COMPILE: nothing for Numba to compile
    synk.fork(3)
    w = pytensor.shared(np.ones(4), name="w")
    x = pt.dvector("x")
    f = synk.function([x], (x.sum() + w.sum(), "sum"), mode="FAST_COMPILE")
    synk.distribute()
    xd = synk.data(np.arange(6.0))
    assert f(xd) == 15.0 + 3 * 4.0
    pids = testing.run_on_ranks(os.getpid)
    segments = sorted(testing.leftover_segments())
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        child(f, w, xd, write_fd)
        sys.exit(0)  # the interpreter's normal exit: atexit hooks and finalizers run
    os.close(write_fd)
    with os.fdopen(read_fd) as inbox:
        seen = json.loads(inbox.read() or "[]")
    _, status = os.waitpid(pid, 0)
    synk.broadcast(w, np.full(4, 2.0))
    synk.all_reduce(w, op="sum")
    result = {
        "master": os.getpid(),
        "workers": pids[1:],
        "prefix": testing.program_prefix(),
        "child": seen,
        "child_status": status,
        "state": testing.session_state(),
        "same_workers": testing.run_on_ranks(os.getpid) == pids,
        "same_segments": sorted(testing.leftover_segments()) == segments,
        "call_ok": bool(f(xd) == 15.0 + 3 * 4 * 6.0),
        "collective_ok": all(np.array_equal(v, np.full(4, 6.0))
                             for v in testing.rank_values(w)),
    }
    print(json.dumps(result), flush=True)
    synk.close()


if __name__ == "__main__":
    main()
