"""Run under mpiexec (2 machines x 2 local processes): one failure, and what each side saw.

``--case``:

- ``kill_leader``: machine 1's leader SIGKILLs itself while the master runs
  all-reduces in a loop.
- ``kill_worker``: machine 1's leader SIGKILLs its local child, then goes on with
  the all-reduces; its liveness check sees the death, it reports it to the master
  and aborts.
- ``timeout``: machine 1's leader never joins; the master's wait has a 1 s timeout.
- ``abort_notice``: the master aborts while machine 1's leader waits for a command.
- ``kill_master``: the master's leader SIGKILLs itself while machine 1's leader waits
  for a command.
- ``interrupt``: SIGINT (Ctrl-C) reaches the master while it waits for machine 1 in
  an all-reduce; the master aborts, and machine 1, joining late, hears of it.

Every side writes what it saw (exception type, message, notes, hosts, wall-clock
times) as JSON into ``--out``: ``master.json``, ``leader1.json``, ``victim.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _machine import LocalMachine

from synkhronos._machines import mpi


def _sigterm(signum, frame):
    raise SystemExit(128 + signum)  # what the session's handler does in the master


def record(path: Path, exc: BaseException | None = None, **extra) -> None:
    data = {"time": time.time(), "pid": os.getpid(), **extra}
    if exc is not None:
        data.update(error=type(exc).__name__, message=str(exc),
                    notes=list(getattr(exc, "__notes__", [])),
                    hosts=list(getattr(exc, "hosts", [])))
    path.write_text(json.dumps(data))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", required=True,
                        choices=["kill_leader", "kill_worker", "timeout", "abort_notice",
                                 "interrupt", "kill_master"])
    args = parser.parse_args()
    out, case = args.out, args.case
    signal.signal(signal.SIGTERM, _sigterm)

    def child_main(index, shared, channel):
        channel.wait()

    machine = LocalMachine(2, 8, child_main)
    leaders = mpi.start(2, liveness=machine.check, timeout=60)
    buffer = np.ones(1 << 16)
    try:
        # inside the try: machine 1 may leave the barrier and die before the master's
        # wait has seen the barrier complete; then the master's barrier is what fails
        leaders.barrier()
        if leaders.is_master:
            if case == "abort_notice":
                record(out / "master.json", started_abort=True)
                machine.release()
                machine.join()
                leaders.abort(f"local process 1 on {leaders.host} died")
            if case == "kill_master":
                record(out / "victim.json", host=leaders.host)
                os.kill(os.getpid(), signal.SIGKILL)
            if case == "interrupt":
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            deadline = time.monotonic() + 20  # a training loop, until something fails
            while time.monotonic() < deadline:
                leaders.all_reduce(buffer, "sum", timeout=1.0 if case == "timeout" else None)
            record(out / "master.json", completed=True)
        elif leaders.rank == 1:
            if case == "kill_leader":
                record(out / "victim.json", host=leaders.host)
                os.kill(os.getpid(), signal.SIGKILL)
            if case == "kill_worker":
                record(out / "victim.json", host=leaders.host,
                       child=machine.children[0].pid)
                os.kill(machine.children[0].pid, signal.SIGKILL)
                while True:
                    leaders.all_reduce(buffer, "sum")
            if case == "timeout":
                time.sleep(60)
            if case in ("abort_notice", "kill_master"):
                leaders.broadcast_object(None, spin=0.002)
            if case == "interrupt":
                time.sleep(1.0)  # late: the master is interrupted while it waits
                leaders.all_reduce(buffer, "sum")  # may complete: MPI can progress the
                # master's abandoned request; then the next wait hears of the abort
        machine.release()
        machine.join()
        leaders.close()
    except BaseException as exc:
        name = "master.json" if leaders.is_master else f"leader{leaders.rank}.json"
        record(out / name, exc, host=leaders.host)
        if isinstance(exc, SystemExit):
            raise  # the MPI runtime is ending the job
        if not leaders.is_master and not isinstance(exc, mpi.JobAbortedError):
            leaders.report_failure(f"{exc}")
        for child in machine.children:
            if child.status is None:
                os.kill(child.pid, signal.SIGKILL)
                os.waitpid(child.pid, 0)
                child.status = -1
        sys.stderr.flush()
        leaders.abort(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
