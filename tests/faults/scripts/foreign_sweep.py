"""A sweeper that cannot tell whether a program is alive, run against a private /dev/shm.

Usage: ``python foreign_sweep.py MODE``, run in its own mount namespace with a fresh
tmpfs on ``/dev/shm`` (it refuses to run if ``/dev/shm`` is not empty), so that no
other program on the machine is affected. MODE is one of

- ``pid-namespace``: starts ``isolation_program.py`` (a live program), then runs
  ``isolation_program.py --sweep-only`` in a new PID namespace, as a program in
  another container that shares ``/dev/shm`` would; then asks the live program to
  check its data, and to close;
- ``other-user``: leaves an entry named like a dead program's segment, owned by this
  user (root), then runs ``isolation_program.py --sweep-only`` as user ``nobody``
  (with only the capability to read the root-owned interpreter and sources).

It prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import posix_ipc

SHM = "/dev/shm"
PROGRAM = str(Path(__file__).parent / "isolation_program.py")
NOBODY = [
    "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
    "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
]


def entries(prefix: str) -> list[str]:
    return sorted(e for e in os.listdir(SHM) if e.startswith((prefix, "sem." + prefix)))


def pid_namespace() -> dict:
    live = subprocess.Popen(
        [sys.executable, PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    info = json.loads(live.stdout.readline())
    before = entries(info["prefix"])
    sweeper = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, PROGRAM, "--sweep-only"],
        capture_output=True, text=True, timeout=30,
    )
    after = entries(info["prefix"])
    answers = []
    for command in ("check", "close"):
        live.stdin.write(command + "\n")
        live.stdin.flush()
        answers.append(json.loads(live.stdout.readline()))
    live.wait(10)
    return {
        "before": before, "after": after, "check": answers[0], "sweeper_rc": sweeper.returncode,
        "sweeper_stderr": sweeper.stderr[-2000:], "live_rc": live.returncode,
    }


def other_user() -> dict:
    done = subprocess.Popen(["true"])
    done.wait()  # its pid is now free: the leftover below belongs to a dead program
    stale = f"synk_{done.pid}_{secrets.token_hex(8)}_s1"
    shm = posix_ipc.SharedMemory("/" + stale, posix_ipc.O_CREX, mode=0o600, size=4096)
    shm.close_fd()
    sweeper = subprocess.run(
        NOBODY + [sys.executable, PROGRAM, "--sweep-only"],
        capture_output=True, text=True, timeout=30, cwd="/",
    )
    return {
        "stale": stale, "stale_left": os.path.exists(os.path.join(SHM, stale)),
        "sweeper_rc": sweeper.returncode, "sweeper_stderr": sweeper.stderr[-2000:],
    }


def main() -> None:
    if os.listdir(SHM):
        raise SystemExit(f"refusing to run: {SHM} is not a private, empty tmpfs")
    mode = sys.argv[1]
    result = {"pid-namespace": pid_namespace, "other-user": other_user}[mode]()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
