"""What several test modules need to watch processes and /dev/shm from outside.

Not test helpers of the library (those are ``synkhronos.testing``): these look at a
program the tests started, or at names a test squats, through /proc and /dev/shm.
"""

from __future__ import annotations

import os
import time

import posix_ipc

SHM = "/dev/shm"


def shm_entries(prefix: str) -> list[str]:
    """Entries of /dev/shm (segments and semaphores) that carry ``prefix``."""
    return sorted(e for e in os.listdir(SHM) if e.startswith((prefix, "sem." + prefix)))


def sweep(prefix: str) -> None:
    """Remove whatever a killed test program left under ``prefix`` (clean-up only)."""
    for entry in shm_entries(prefix):
        try:
            os.unlink(os.path.join(SHM, entry))
        except FileNotFoundError:
            pass


def leader_alive(pid: int) -> bool:
    """True while process ``pid`` exists and its leader thread is neither a zombie nor
    dead (whoever its parent is: no ``wait`` needed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def poll(predicate, timeout: float, step: float = 0.005) -> bool:
    """Wait for another process's state: True once ``predicate()`` holds, False at the
    deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(step)


def squat(name: str) -> None:
    """Take ``name`` in /dev/shm first, as another program might (a segment holding
    ``squatter``, or a semaphore of value 7)."""
    if name.startswith("sem."):
        posix_ipc.Semaphore("/" + name[len("sem."):], posix_ipc.O_CREX, mode=0o600,
                            initial_value=7).close()
    else:
        shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=4096)
        os.pwrite(shm.fd, b"squatter", 0)
        shm.close_fd()


def squatter_intact(name: str) -> bool:
    """Whether what ``squat`` made under ``name`` is still there, unchanged."""
    if name.startswith("sem."):
        sem = posix_ipc.Semaphore("/" + name[len("sem."):])
        try:
            return sem.value == 7
        finally:
            sem.close()
    shm = posix_ipc.SharedMemory("/" + name)
    try:
        return shm.size == 4096 and os.pread(shm.fd, 8, 0) == b"squatter"
    finally:
        shm.close_fd()
