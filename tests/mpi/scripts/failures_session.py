"""Run under mpiexec (2 machines x 2 processes): one failure, seen through the library.

``--case``:

- ``kill_worker``: the master SIGKILLs rank 3 (a worker on machine 1) while it calls a
  function in a loop; the call raises ``WorkerDiedError`` naming machine 1's host.
- ``kill_leader``: the same with rank 2, machine 1's leader (run with ULFM: Open MPI's
  ``--with-ft ulfm``; without it the MPI runtime ends the job).
- ``worker_error``: rank 3 raises inside a call: ``WorkerError`` with rank 3, and the
  session goes on.
- ``stop_worker``: rank 3 is stopped (SIGSTOP) with ``fork(timeout=1)``:
  ``WorkerTimeoutError`` naming machine 1's host.
- ``kill_master``: the master SIGKILLs itself between calls (it records nothing; the
  test checks that every machine's processes end and remove their segments).

The master writes what it saw into ``--out``/``master.json`` (exception type, message,
host, seconds from the failure to the error); after it, ``synk.close()`` ends the job.
Ctrl-C, which keeps the session, has its own cases (``interrupts.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import testing


def raise_on(rank: int) -> None:
    if testing.this_rank() == rank:
        raise ValueError(f"rank {rank} refuses")


def record(out: Path, **data) -> None:
    (out / "master.json").write_text(json.dumps(data))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", required=True)
    args = parser.parse_args()
    out, case = args.out, args.case
    synk.fork(2, timeout=1.0 if case == "stop_worker" else None)
    x = pt.dmatrix("x")
    f = synk.function([x], (x.sum(), "sum"))
    synk.distribute()
    data = synk.data(np.ones((40, 3)))
    assert f(data) == 120.0
    hosts, pids = testing.rank_hosts(), testing.process_pids()
    (out / "session.json").write_text(json.dumps({"hosts": hosts, "pids": pids}))
    failed_at = None
    try:
        if case == "worker_error":
            try:
                testing.run_on_ranks(raise_on, 3)
            except synk.WorkerError as exc:
                record(out, error=type(exc).__name__, rank=exc.rank, message=str(exc),
                       after=float(f(data)))
            synk.close()
            return
        if case in ("kill_worker", "kill_leader"):
            victim = 3 if case == "kill_worker" else 2
            failed_at = time.monotonic()
            os.kill(pids[victim], signal.SIGKILL)
        elif case == "stop_worker":
            failed_at = time.monotonic()
            os.kill(pids[3], signal.SIGSTOP)
        elif case == "kill_master":
            os.kill(os.getpid(), signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            f(data)
        record(out, error=None)
    except BaseException as exc:
        record(out, error=type(exc).__name__, message=str(exc),
               host=getattr(exc, "host", None), rank=getattr(exc, "rank", None),
               seconds=time.monotonic() - failed_at if failed_at else None,
               expected_host=hosts[3])
        if case == "stop_worker":
            os.kill(pids[3], signal.SIGCONT)
    synk.close()  # after a failure between machines: ends the job


if __name__ == "__main__":
    main()
