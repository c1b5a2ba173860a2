"""A synkhronos program whose whole process group the test kills with SIGKILL.

Usage: ``python group_kill.py N MODE MARK`` (MODE ``idle`` or ``in_command``; MARK a
file path this program may write).

It forks ``N`` processes, makes a ``synk.data`` of 4 MiB, and prints ``{"master",
"workers", "prefix", "data"}`` as one JSON line. Then, with ``idle``, it writes MARK
and sleeps; with ``in_command``, it runs one command whose payload is larger than the
control block's mailbox (a one-off segment exists while it runs) and in which every
worker writes MARK-<rank> and sleeps. Nothing in it ever gets to clean up: the test
sends SIGKILL to the whole group, as Jupyter does when it restarts a busy kernel.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import synkhronos as synk
from synkhronos import testing

BALLAST = 2 << 20  # larger than the control block's 1 MiB mailbox


def mark_and_sleep(mark: str, ballast: bytes) -> int:
    with open(f"{mark}-{testing.this_rank()}", "w") as f:
        f.write("started")
    time.sleep(60)
    return len(ballast)


def main() -> None:
    n, mode, mark = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    testing.skip_backend_preimport()  # this program compiles nothing
    synk.fork(n)
    data = synk.data(np.ones(1 << 19))  # 4 MiB
    pids = testing.run_on_ranks(os.getpid)
    print(json.dumps({"master": os.getpid(), "workers": pids[1:],
                      "prefix": testing.program_prefix(), "data": data.ref().segment}),
          flush=True)
    if mode == "idle":
        with open(mark, "w") as f:
            f.write("idle")
        time.sleep(60)
    else:
        testing.run_on_ranks(mark_and_sleep, mark, b"x" * BALLAST, ranks=list(range(1, n)))


if __name__ == "__main__":
    main()
