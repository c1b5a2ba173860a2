"""``fork()`` never takes over a shared-memory name someone else created first.

A session's names carry a random token, so no other program can predict them; this
test can, by patching ``_runtime.shmem.new_session_prefix`` (the one private module it
touches) to hand out a prefix it has squatted a name under. ``fork()`` must then fail
cleanly (nothing of the session left, the squatter untouched) or pick another prefix.
Moved here from ``tests/faults/test_isolation.py``, which uses public modules only.
"""

from __future__ import annotations

import os

import posix_ipc
import pytest

import synkhronos as synk
from synkhronos._runtime import shmem
from synkhronos.testing import child_pids, program_prefix, run_on_ranks, session_open

SHM = "/dev/shm"


def _entries(prefix: str) -> list[str]:
    return sorted(e for e in os.listdir(SHM) if e.startswith((prefix, "sem." + prefix)))


def _squat(name: str) -> None:
    if name.startswith("sem."):
        posix_ipc.Semaphore("/" + name[len("sem."):], posix_ipc.O_CREX, mode=0o600,
                            initial_value=7).close()
    else:
        shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=4096)
        os.pwrite(shm.fd, b"squatter", 0)
        shm.close_fd()


def _squatter_intact(name: str) -> bool:
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry", ["control", "sem.wake1"])
def test_fork_never_takes_over_a_squatted_name(entry, monkeypatch):
    """Someone created a name fork() is about to use: fork fails cleanly or picks another."""
    squatted_prefix = shmem.new_session_prefix()
    fresh = shmem.new_session_prefix
    given: list[str] = []

    def prefix(pid=None):
        given.append(squatted_prefix if not given else fresh(pid))
        return given[-1]

    monkeypatch.setattr(shmem, "new_session_prefix", prefix)
    squatted = (f"sem.{squatted_prefix}{entry[4:]}" if entry.startswith("sem.")
                else squatted_prefix + entry)
    _squat(squatted)
    try:
        try:
            synk.fork(3)
        except Exception as exc:  # a clean failure: nothing of the session is left
            assert "exist" in str(exc).lower(), exc
            assert not session_open()
            assert child_pids() == []
        else:
            assert program_prefix() != squatted_prefix
            assert run_on_ranks(os.getpid)[0] == os.getpid()
            synk.close()
        assert _squatter_intact(squatted)
        assert _entries(squatted_prefix) == [squatted]
    finally:
        shmem.sweep_prefix(squatted_prefix)
        synk.close()
