"""Shared test fixtures: every test leaves no child process and no segment behind."""

from __future__ import annotations

import os

import pytest

import synkhronos as synk
from synkhronos import session as synk_session
from synkhronos._runtime import shmem


def child_pids(parent: int | None = None) -> list[int]:
    """Live (non-zombie) children of ``parent`` (default: this process), from /proc."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry))
    return found


def segments_of(pid: int | None = None) -> list[str]:
    """Entries in /dev/shm that belong to programs whose master is ``pid``."""
    pid = os.getpid() if pid is None else pid
    mark = f"{shmem.PREFIX}{pid}_"
    return [e for e in os.listdir(shmem.SHM_DIR)
            if e.startswith(mark) or e.startswith("sem." + mark)]


@pytest.fixture(autouse=True)
def no_leaks():
    """After a test that closed its session: no worker and no segment may remain."""
    yield
    if synk_session.current() is None:
        assert child_pids() == [], "a test left child processes behind"
        assert segments_of() == [], "a test left shared-memory segments behind"


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"n{n}")
def forked(request):
    """A fresh session at n_parallel 1, 2 and 3 (3 gives uneven splits on 2 cores)."""
    n = synk.fork(request.param)
    try:
        yield n
    finally:
        synk.close()


@pytest.fixture(params=[2, 3], ids=lambda n: f"n{n}")
def forked_workers(request):
    """A fresh session that has workers (n_parallel 2 and 3)."""
    n = synk.fork(request.param)
    try:
        yield n
    finally:
        synk.close()


def session_fixture(build, sizes=(1, 2, 3)):
    """A module-scoped fixture: fork at each size, yield ``build()``, close.

    Compiling a graph costs seconds on a cold cache, so a module builds its functions
    once per size and its tests share them.
    """

    @pytest.fixture(scope="module", params=list(sizes), ids=lambda n: f"n{n}")
    def fixture(request):
        synk.fork(request.param)
        try:
            yield build()
        finally:
            synk.close()

    return fixture
