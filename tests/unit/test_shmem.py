"""Unit tests for synkhronos._runtime.shmem: segments, names, sweeping, views (no fork)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys

import numpy as np
import posix_ipc
import pytest

from synkhronos._runtime import shmem
from synkhronos._runtime.arena import Arena


@pytest.fixture
def prefix():
    """A fresh program prefix of this process; everything under it is removed after."""
    value = shmem.new_session_prefix()
    yield value
    shmem.sweep_prefix(value)


def _entries(prefix: str) -> list[str]:
    """Entries of /dev/shm (segments and semaphores) that carry ``prefix``."""
    names = os.listdir(shmem.SHM_DIR)
    return sorted(e for e in names if e.startswith((prefix, "sem." + prefix)))


def _dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ---------------------------------------------------------------- names


def test_prefix_names_owner_and_is_random():
    a = shmem.new_session_prefix()
    b = shmem.new_session_prefix()
    assert a.startswith(f"{shmem.PREFIX}{os.getpid()}_")
    assert a.endswith("_")
    assert a != b
    assert shmem.new_session_prefix(12345).startswith(f"{shmem.PREFIX}12345_")


# ---------------------------------------------------------------- segments


def test_create_open_unlink(prefix):
    name = prefix + "seg"
    created = shmem.create_segment(name, 4096)
    assert len(created) == 4096
    created[:5] = b"hello"
    assert _entries(prefix) == [name]

    opened = shmem.open_segment(name)
    assert len(opened) == 4096
    assert opened[:5] == b"hello"
    opened[5:6] = b"!"
    assert created[:6] == b"hello!"

    assert shmem.unlink_segment(name) is True
    assert _entries(prefix) == []
    assert shmem.unlink_segment(name) is False
    # the mappings outlive the name
    created[0:1] = b"J"
    assert opened[:6] == b"Jello!"
    with pytest.raises(posix_ipc.ExistentialError):
        shmem.open_segment(name)
    created.close()
    opened.close()


def test_create_is_exclusive(prefix):
    name = prefix + "excl"
    first = shmem.create_segment(name, 64)
    first[:3] = b"abc"
    with pytest.raises(posix_ipc.ExistentialError):
        shmem.create_segment(name, 64)
    # the failed second create neither removed nor altered the first
    assert _entries(prefix) == [name]
    again = shmem.open_segment(name)
    assert again[:3] == b"abc"
    again.close()
    first.close()
    assert shmem.unlink_segment(name)


def test_create_mode_is_0600_even_with_permissive_umask(prefix):
    name = prefix + "mode"
    old = os.umask(0)
    try:
        segment = shmem.create_segment(name, 128)
    finally:
        os.umask(old)
    info = os.stat(os.path.join(shmem.SHM_DIR, name))
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.getuid()
    segment.close()
    shmem.unlink_segment(name)


def test_zero_byte_segment_maps_one_byte(prefix):
    segment = shmem.create_segment(prefix + "empty", 0)
    assert len(segment) == 1
    segment.close()
    shmem.unlink_segment(prefix + "empty")


def test_open_missing_segment_raises(prefix):
    with pytest.raises(posix_ipc.ExistentialError):
        shmem.open_segment(prefix + "missing")


# ---------------------------------------------------------------- views


def test_array_view_is_zero_copy(prefix):
    name = prefix + "view"
    segment = shmem.create_segment(name, 8 + 12 * 8)
    view = shmem.array_view(segment, np.float64, (4, 3), offset=8)
    assert view.shape == (4, 3)
    assert view.dtype == np.float64
    assert view.flags.c_contiguous
    assert view.flags.writeable
    assert not view.flags.owndata

    view[:] = np.arange(12.0).reshape(4, 3)
    raw = np.frombuffer(segment[8 : 8 + 96], dtype=np.float64)
    np.testing.assert_array_equal(raw, np.arange(12.0))
    assert segment[:8] == b"\0" * 8  # the offset was honoured

    # writes through another mapping of the segment show in the view
    other = shmem.open_segment(name)
    shmem.array_view(other, np.float64, (12,), offset=8)[5] = -1.0
    assert view[1, 2] == -1.0
    del view, raw
    other.close()
    segment.close()
    shmem.unlink_segment(name)


def test_array_view_empty_shape(prefix):
    segment = shmem.create_segment(prefix + "e", 16)
    view = shmem.array_view(segment, np.int32, (0, 5))
    assert view.shape == (0, 5)
    del view
    segment.close()
    shmem.unlink_segment(prefix + "e")


def test_a_segment_larger_than_the_free_room_is_refused_before_it_exists(prefix):
    free = shmem.shm_free()
    assert free is not None
    asked = free + (1 << 30)
    with pytest.raises(OSError) as info:
        shmem.create_segment(prefix + "huge", asked)
    assert info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert f"segment of {asked} bytes" in message and "bytes (" in message
    assert "--shm-size" in message and "/dev/shm" in message
    assert _entries(prefix) == []


# ---------------------------------------------------------------- sweeping


def test_sweep_prefix_removes_only_that_prefix(prefix):
    other = shmem.new_session_prefix()
    try:
        for suffix in ("a", "b"):
            shmem.create_segment(prefix + suffix, 16).close()
        posix_ipc.Semaphore("/" + prefix + "sem", posix_ipc.O_CREX, mode=0o600).close()
        shmem.create_segment(other + "a", 16).close()
        assert _entries(prefix) == sorted([prefix + "a", prefix + "b", "sem." + prefix + "sem"])

        assert shmem.sweep_prefix(prefix) == 3
        assert _entries(prefix) == []
        assert _entries(other) == [other + "a"]
        assert shmem.sweep_prefix(prefix) == 0
    finally:
        shmem.sweep_prefix(other)


def test_sweep_dead_programs_removes_dead_keeps_live():
    dead = shmem.new_session_prefix(_dead_pid())
    live = shmem.new_session_prefix()
    foreign = shmem.new_session_prefix(1)  # pid 1 is always alive
    try:
        shmem.create_segment(dead + "data", 16).close()
        posix_ipc.Semaphore("/" + dead + "wake0", posix_ipc.O_CREX, mode=0o600).close()
        shmem.create_segment(live + "data", 16).close()
        shmem.create_segment(foreign + "data", 16).close()

        assert shmem.sweep_dead_programs() >= 2
        assert _entries(dead) == []
        assert _entries(live) == [live + "data"]
        assert _entries(foreign) == [foreign + "data"]
    finally:
        for p in (dead, live, foreign):
            shmem.sweep_prefix(p)


def test_sweep_dead_programs_ignores_other_names():
    name = f"notsynk_{_dead_pid()}_abcd_x"
    segment = shmem.create_segment(name, 16)
    try:
        shmem.sweep_dead_programs()
        assert os.path.exists(os.path.join(shmem.SHM_DIR, name))
    finally:
        segment.close()
        shmem.unlink_segment(name)


# ---------------------------------------------------------------- the arena's mappings


def test_arena_maps_once_and_keeps_a_mapping_past_the_unlink(prefix):
    name = prefix + "cached"
    owner = shmem.create_segment(name, 32)
    owner[:4] = b"data"
    arena = Arena(prefix, 1, False, None)
    assert len(arena) == 0
    assert name not in arena

    mapped = arena.map(name)
    assert mapped[:4] == b"data"
    assert name in arena
    assert len(arena) == 1
    assert arena.map(name) is mapped  # opened once

    # a kept mapping survives the unlink of its name
    shmem.unlink_segment(name)
    assert arena.map(name) is mapped
    other = Arena("synk_other_", 1, False, None)
    with pytest.raises(posix_ipc.ExistentialError):
        other.map(name)  # another program's name is opened afresh, and it is gone
    mapped.close()
    owner.close()


def test_arena_names_and_creates_with_one_scheme(prefix):
    master, worker = Arena(prefix, 0, True, None), Arena(prefix, 2, False, None)
    made = master.create(10)
    assert made.id == 1 and made.name == prefix + "s1" and made.nbytes >= 10
    theirs = worker.create(10)
    assert theirs.id == (3 << 40) + 1 and theirs.name == worker.name_of(theirs.id)
    assert os.stat(os.path.join(shmem.SHM_DIR, made.name)).st_mode & 0o777 == 0o600
    master.release(made.id)
    assert made.name not in master and not os.path.exists(
        os.path.join(shmem.SHM_DIR, made.name))
    worker.release(theirs.id)
