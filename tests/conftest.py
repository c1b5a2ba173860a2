"""Shared test fixtures: every test leaves no child process, no segment, no open session.

A test that forks a session must close it (the fixtures below do): one left open
would make the next test's ``fork()`` fail. The autouse check closes such a session
and fails the test that left it, not the next one.

Unit tests (``tests/unit``) exercise one private module each and never fork; every
other test uses only public modules (``synkhronos``, ``synkhronos.testing``,
``synkhronos.extensions``, ...): ``tests/unit/test_layering.py`` checks it.
"""

from __future__ import annotations

import gc
import os

import pytest

# PyMC imports pandas, which loads pyarrow, whose jemalloc starts a background thread:
# every later fork() of the run would then fork a multi-threaded process, and Python
# 3.12 warns at each (harmless: jemalloc has fork handlers). Off before any import.
os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")

import synkhronos as synk
from synkhronos.testing import child_pids, leftover_segments, program_prefix, session_open

__all__ = ["child_pids", "segments_of", "session_fixture", "DEVICE", "sizes_to_run"]

segments_of = leftover_segments  # the name the tests use

# The device the sessions of this run fork on. CI runs the function, collective and
# training suites a second time with SYNKHRONOS_TEST_DEVICE=gpu on JAX's CPU platform
# (SYNKHRONOS_GPU_PLATFORM=cpu, PYTENSOR_FLAGS=mode=JAX so the tests' plain reference
# functions read device values too), one pytest process per session size
# (SYNKHRONOS_TEST_SIZES): a master that ran JAX cannot fork again.
DEVICE = os.environ.get("SYNKHRONOS_TEST_DEVICE", "cpu")
# Whether repeated work is replayed in this run: CI runs the function, collective,
# step, data and failure suites a second time with SYNK_REPLAY=0, where every command
# takes the general path; the tests of replay itself then check that nothing replays.
REPLAY = os.environ.get("SYNK_REPLAY", "").strip() != "0"
_SIZES = os.environ.get("SYNKHRONOS_TEST_SIZES")


def sizes_to_run(sizes):
    """``sizes``, limited to those SYNKHRONOS_TEST_SIZES names (all when unset)."""
    if not _SIZES:
        return list(sizes)
    wanted = {int(n) for n in _SIZES.split(",")}
    return [n for n in sizes if n in wanted]


def _open_prefix() -> str | None:
    return program_prefix() if session_open() else None


@pytest.fixture(autouse=True)
def no_leaks():
    """After each test: no session it opened is left open; with none open, no worker
    and no segment of this process remains."""
    before = _open_prefix()
    yield
    after = _open_prefix()
    if after is not None and after != before:
        synk.close()
        pytest.fail("the test left a synkhronos session open (closed it now)")
    if after is None:
        assert child_pids() == [], "a test left child processes behind"
        assert segments_of() == [], "a test left shared-memory segments behind"


@pytest.fixture
def no_cyclic_gc():
    """No garbage collection of reference cycles inside the test: a test that counts
    which calls replay must not see the epoch moved on by the release of a ``Data``
    left in a cycle by an earlier test of the same session (that is correct, but it
    would make the count depend on when the collector runs)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture(params=sizes_to_run([1, 2, 3]), ids=lambda n: f"n{n}")
def forked(request):
    """A fresh session at n_parallel 1, 2 and 3 (3 gives uneven splits on 2 cores)."""
    n = synk.fork(request.param, device=DEVICE)
    try:
        yield n
    finally:
        synk.close()


@pytest.fixture(params=sizes_to_run([2, 3]), ids=lambda n: f"n{n}")
def forked_workers(request):
    """A fresh session that has workers (n_parallel 2 and 3)."""
    n = synk.fork(request.param, device=DEVICE)
    try:
        yield n
    finally:
        synk.close()


def session_fixture(build, sizes=(1, 2, 3)):
    """A module-scoped fixture: fork at each size, yield ``build()``, close.

    Compiling a graph costs seconds on a cold cache, so a module builds its functions
    once per size and its tests share them.
    """

    @pytest.fixture(scope="module", params=sizes_to_run(sizes), ids=lambda n: f"n{n}")
    def fixture(request):
        synk.fork(request.param, device=DEVICE)
        try:
            yield build()
        finally:
            synk.close()

    return fixture
