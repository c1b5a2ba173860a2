"""A synkhronos master that the fault tests kill from outside.

Usage: ``python master_long_command.py MARKER_DIR [--idle [--long-sleep]] [--n N]
[--threads T] [--low-priority-threads] [--busy] [--preimport]``

``fork()``'s pre-import of the Numba backend (2 s) is skipped unless ``--preimport``.

It starts ``T`` idle helper threads (default 0; ``SCHED_IDLE`` with
``--low-priority-threads``), forks ``N`` processes (default 3), creates one segment of
its own under the program prefix (as ``synk.data`` would), prints ``{"master",
"workers", "prefix"}`` as one JSON line on stdout, and then either

- runs one long command (default): every worker writes ``MARKER_DIR/started-<rank>``
  and sleeps 60 s (spins with ``--busy``); the payload is larger than the mailbox, so
  an oversized-payload segment exists while the command runs; or
- with ``--idle``: writes ``MARKER_DIR/idle`` and sleeps 60 s in the master, between
  commands (in short sleeps, as a master busy with its own Python code would be; in
  one ``time.sleep(60)`` with ``--long-sleep``).

The test then kills the master (or its process group) and checks what is left.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import synkhronos as synk
from synkhronos import session as S
from synkhronos._runtime import control, shmem


def mark_and_sleep(marker_dir: str, seconds: float, ballast: bytes, busy: bool) -> int:
    """Runs in the workers: say we started, then sleep (or spin) for ``seconds``."""
    rank = S.current().rank
    path = os.path.join(marker_dir, f"started-{rank}")
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
    args = parser.parse_args()

    # idle helper threads in the master, as a data loader or a logger would add
    never = threading.Event()
    for _ in range(args.threads):
        threading.Thread(
            target=background_thread, args=(never, args.low_priority_threads), daemon=True
        ).start()

    if not args.preimport:
        # This program compiles nothing: skip fork()'s pre-import of the Numba backend
        # (about 2 s), which only saves compile time in the workers.
        S._preimport_backend = lambda: None
    n = synk.fork(args.n)
    session = S.current()
    data = shmem.create_segment(session.prefix + "data0", 4096)
    data[:4] = b"synk"
    info = {
        "master": os.getpid(),
        "workers": [w.pid for w in session.workers],
        "prefix": session.prefix,
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
        ballast = b"x" * (control.MAILBOX_BYTES + 4096)
        workers = [r for r in range(n) if r != session.master_rank]
        work = (args.marker_dir, 60, ballast, args.busy)
        session.run(S.Opcode.CALLABLE, (mark_and_sleep, work, workers))
    synk.close()


if __name__ == "__main__":
    main()
