"""A synkhronos master that the fault tests kill from outside.

Usage: ``python master_long_command.py MARKER_DIR [--idle [--long-sleep]] [--n N]
[--threads T] [--low-priority-threads] [--busy] [--preimport] [--no-watcher]``

Ctrl-C is made deliverable first (Python's default SIGINT handler), whatever this
process inherited: a test suite started in the background has SIGINT ignored.
``fork()``'s pre-import of the Numba backend (a second or two) is skipped unless
``--preimport``. ``--no-watcher``: no watcher process sweeps after the session (as
before there was one), so that what a dead program leaves can be seen.

It starts ``T`` idle helper threads (default 0; ``SCHED_IDLE`` with
``--low-priority-threads``), forks ``N`` processes (default 3), makes one ``synk.data``
(a segment under the program prefix), prints ``{"master", "workers", "prefix",
"data"}`` as one JSON line on stdout, and then either

- runs one long command (default): every worker writes ``MARKER_DIR/started-<rank>``
  and sleeps 60 s (spins with ``--busy``); the payload is larger than the mailbox of the
  control block, so a one-off payload segment exists while the command runs; or
- with ``--idle``: writes ``MARKER_DIR/idle`` and sleeps 60 s in the master, between
  commands (in short sleeps, as a master busy with its own Python code would be; in
  one ``time.sleep(60)`` with ``--long-sleep``).

The test then kills the master (or its process group) and checks what is left.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos import testing  # noqa: E402

BALLAST = 2 << 20  # larger than the control block's 1 MiB mailbox


def mark_and_sleep(marker_dir: str, seconds: float, ballast: bytes, busy: bool) -> int:
    """Runs in the workers: say we started, then sleep (or spin) for ``seconds``."""
    path = os.path.join(marker_dir, f"started-{testing.this_rank()}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    if busy:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass
    else:
        time.sleep(seconds)
    return len(ballast)


def background_thread(never: threading.Event, low_priority: bool) -> None:
    if low_priority:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
    never.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("marker_dir")
    parser.add_argument("--idle", action="store_true")
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--low-priority-threads", action="store_true")
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--preimport", action="store_true")
    parser.add_argument("--long-sleep", action="store_true")
    parser.add_argument("--no-watcher", action="store_true")
    args = parser.parse_args()
    if args.no_watcher:
        testing.skip_watcher()

    # idle helper threads in the master, as a data loader or a logger would add
    never = threading.Event()
    for _ in range(args.threads):
        threading.Thread(
            target=background_thread, args=(never, args.low_priority_threads), daemon=True
        ).start()

    if not args.preimport:
        # This program compiles nothing: skip fork()'s pre-import of the Numba backend,
        # which only saves compile time in the workers.
        testing.skip_backend_preimport()
    n = synk.fork(args.n)
    data = synk.data(np.frombuffer(b"synk" * 1024, dtype=np.uint8))
    pids = testing.run_on_ranks(os.getpid)
    master = synk.master_rank()
    info = {
        "master": os.getpid(),
        "workers": [pid for rank, pid in enumerate(pids) if rank != master],
        "prefix": testing.program_prefix(),
        "data": data.ref().segment,
    }
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()
    if args.idle:
        with open(os.path.join(args.marker_dir, "idle"), "w") as f:
            f.write("idle")
        if args.long_sleep:  # one blocking call, as input() or a long C routine would be
            time.sleep(60)
        else:
            # Short sleeps: a signal that the kernel hands to another thread of the
            # master does not interrupt a long sleep of the main thread, only its next
            # bytecode (see --long-sleep).
            for _ in range(1200):
                time.sleep(0.05)
    else:
        ballast = b"x" * BALLAST
        workers = [r for r in range(n) if r != master]
        testing.run_on_ranks(mark_and_sleep, args.marker_dir, 60, ballast, args.busy,
                             ranks=workers)
    synk.close()


if __name__ == "__main__":
    main()
