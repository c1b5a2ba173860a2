"""synk.data in real sessions: every process maps the same memory, and none of it leaks.

Workers read and write through ``DataRef.view()`` inside commands of
``synkhronos.testing.run_on_ranks``; the master checks what they saw and what they left.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.resource_tracker
import os
import pickle
import stat

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.data import DataRef
from synkhronos.testing import mapped, program_prefix, run_on_ranks, session_open, this_rank

pytestmark = pytest.mark.timeout(60)


# -- what each process runs (module level, so commands can pickle them) ---------------------
def _read(ref: DataRef) -> np.ndarray:
    return ref.view().copy()


def _write_row(ref: DataRef) -> None:
    """Rank r writes r + 1 into row r."""
    rank = this_rank()
    ref.view()[rank] = rank + 1


def _is_mapped(segment: str) -> bool:
    return mapped(segment)


def _read_pickled(x: synk.Data) -> tuple[bool, list]:
    """Receives a pickled Data (not a ref): a non-owner handle in this process."""
    return x.is_owner, x.data.tolist()


def _free_pickled(x: synk.Data) -> None:
    x.free_memory()


def _make_data_in_worker() -> None:
    synk.data(np.zeros(3))


def _spawn_child(x: synk.Data) -> None:
    """Runs in a process started with "spawn": no session, only the pickled handle."""
    assert not x.is_owner
    assert x.dtype == np.float32 and x.shape == (4, 3)
    assert x.data.sum() == 66.0  # arange(12)
    x[...] = x.data * 2 + 1
    x.set_value(np.full((4, 3), 7, dtype=np.float32))  # same shape: a plain write
    x[0, 0] = -1.0
    try:
        x.set_length(8)
    except RuntimeError as exc:
        assert "owns its memory" in str(exc)
    else:
        raise AssertionError("a non-owner resized")


# -- helpers --------------------------------------------------------------------------------
def _everywhere(fn, *args) -> list:
    return run_on_ranks(fn, *args)


def _on_workers(fn, *args) -> list:
    """Replies of the workers only (the master runs its handler on unpickled arguments)."""
    ranks = [r for r in range(synk.n_parallel()) if r != synk.master_rank()]
    replies = run_on_ranks(fn, *args, ranks=ranks)
    return [replies[rank] for rank in ranks]


def _exists(segment: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", segment))


# -- attributes and numpy behaviour ---------------------------------------------------------
def test_attributes(forked):
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = synk.data(value, name="x", minibatch=True, oversize=1.5)
    assert isinstance(x, synk.Data) and x.is_owner
    assert x.dtype == np.float32 and x.ndim == 2 and x.shape == (4, 3)
    assert x.size == 12 and x.alloc_size == 18 and len(x) == 4
    assert x.name == "x" and x.minibatch is True
    np.testing.assert_array_equal(x.data, value)
    assert not np.shares_memory(x.data, value)  # the value was copied in
    np.testing.assert_array_equal(x[1], value[1])
    x[2] = -1
    x[0, 0] = 5
    assert x.data[2].tolist() == [-1, -1, -1] and x.data[0, 0] == 5
    assert np.shares_memory(np.asarray(x), x.data)
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert "alloc_size=18" in repr(x) and "'x'" in repr(x)
    ref = x.ref()
    assert ref.dtype == "<f4" and ref.shape == (4, 3)
    assert ref.segment.startswith(program_prefix())
    view = ref.view()
    assert view.flags.c_contiguous and view.flags.writeable
    assert np.shares_memory(view, x.data)
    plain = synk.data(np.zeros(2))
    assert plain.name is None and plain.minibatch is False and plain.alloc_size == 2


def test_segment_mode_is_0600(forked):
    x = synk.data(np.ones(10, dtype=np.int32))
    mode = os.stat(os.path.join("/dev/shm", x.ref().segment)).st_mode
    assert stat.S_IMODE(mode) == 0o600


# -- values move both ways, zero copy -------------------------------------------------------
def test_workers_see_master_values(forked):
    x = synk.data(np.arange(20, dtype=np.float64).reshape(5, 4))
    for seen in _everywhere(_read, x.ref()):
        np.testing.assert_array_equal(seen, x.data)
    x[...] = 7.5  # a later write in place: no new ref needed
    for seen in _everywhere(_read, x.ref()):
        assert (seen == 7.5).all()


def test_master_sees_worker_writes(forked):
    x = synk.data(np.zeros((forked, 3), dtype=np.int64))
    _everywhere(_write_row, x.ref())
    expected = np.repeat(np.arange(1, forked + 1)[:, None], 3, axis=1)
    np.testing.assert_array_equal(x.data, expected)


# -- growing, shrinking, oversize -----------------------------------------------------------
def test_growth_past_allocation_reaches_workers(forked):
    x = synk.data(np.ones((2, 2), dtype=np.float32))
    old = x.ref().segment
    _everywhere(_read, x.ref())  # every process has mapped it now
    bigger = np.arange(30, dtype=np.float32).reshape(15, 2)
    x.set_value(bigger)
    new = x.ref().segment
    assert new != old and x.alloc_size == 30
    assert not _exists(old) and _exists(new)
    for seen in _everywhere(_read, x.ref()):
        np.testing.assert_array_equal(seen, bigger)
    assert _everywhere(_is_mapped, old) == [False] * forked


def test_shrink_within_allocation_keeps_segment(forked):
    x = synk.data(np.arange(10, dtype=np.int32))
    segment = x.ref().segment
    x.set_value(np.array([3, 2, 1], dtype=np.int32))
    assert x.ref().segment == segment and x.alloc_size == 10 and x.shape == (3,)
    for seen in _everywhere(_read, x.ref()):
        assert seen.tolist() == [3, 2, 1]
    x.set_length(10)
    assert x.ref().segment == segment and x.data[:3].tolist() == [3, 2, 1]


def test_oversize_reserves_room(forked):
    x = synk.data(np.ones((10, 2), dtype=np.float32), oversize=1.5)
    segment = x.ref().segment
    assert x.alloc_size == 30
    x.set_length(15)  # 30 items: still fits
    assert x.ref().segment == segment and x.shape == (15, 2)
    x.set_value(np.zeros((12, 2), dtype=np.float32), oversize=2)  # fits: oversize unused
    assert x.ref().segment == segment and x.alloc_size == 30
    x.set_value(np.full((20, 2), 3, dtype=np.float32), oversize=2)
    assert x.ref().segment != segment and x.alloc_size == 80
    for seen in _everywhere(_read, x.ref()):
        assert seen.shape == (20, 2) and (seen == 3).all()


def test_set_shape_beyond_allocation_keeps_leading_values(forked):
    x = synk.data(np.arange(6, dtype=np.float64).reshape(2, 3))
    _everywhere(_read, x.ref())
    x.set_shape((4, 3))
    assert x.alloc_size == 12
    expected = np.concatenate([np.arange(6.0), np.zeros(6)]).reshape(4, 3)
    np.testing.assert_array_equal(x.data, expected)
    for seen in _everywhere(_read, x.ref()):
        np.testing.assert_array_equal(seen, expected)
    x.set_shape([3, 2])  # within: leading items, reinterpreted in C order
    np.testing.assert_array_equal(x.data, np.arange(6.0).reshape(3, 2))
    x.set_length(5, oversize=2)  # 10 items fit in 12: oversize is not used
    assert x.alloc_size == 12 and x.shape == (5, 2)
    x.set_length(7, oversize=2)
    assert x.alloc_size == 28 and x.data[:3].tolist() == [[0, 1], [2, 3], [4, 5]]


# -- freeing --------------------------------------------------------------------------------
def test_free_memory_then_set_value(forked):
    x = synk.data(np.ones((6, 2), dtype=np.float32))
    old = x.ref().segment
    _everywhere(_read, x.ref())
    x.free_memory()
    assert x.alloc_size == 0 and x.shape == (0, 2) and x.size == 0 and len(x) == 0
    assert not _exists(old) and x.ref().segment == ""
    for seen in _everywhere(_read, x.ref()):
        assert seen.shape == (0, 2)
    assert _everywhere(_is_mapped, old) == [False] * forked
    x.free_memory()  # twice is harmless
    x.set_value(np.full((3, 2), 4, dtype=np.float32))
    assert x.alloc_size == 6 and x.ref().segment not in ("", old)
    for seen in _everywhere(_read, x.ref()):
        assert (seen == 4).all() and seen.shape == (3, 2)
    x.free_memory()
    x.set_length(2)
    assert x.shape == (2, 2) and x.alloc_size == 4 and (x.data == 0).all()


def test_garbage_collection_unlinks(gc_of_this_test, forked):
    x = synk.data(np.ones(100, dtype=np.float32))
    segment = x.ref().segment
    _everywhere(_read, x.ref())
    del x
    gc.collect()
    assert not _exists(segment)
    assert _everywhere(_is_mapped, segment) == [False] * forked


def test_close_removes_segments_and_stops_resizing(forked):
    x = synk.data(np.arange(5, dtype=np.int64), oversize=2)
    segment = x.ref().segment
    _everywhere(_read, x.ref())
    synk.close()
    assert not _exists(segment)
    assert not session_open()
    assert x.data.tolist() == [0, 1, 2, 3, 4]  # still readable here
    x.set_value(np.arange(8, dtype=np.int64))  # fits: a local write
    with pytest.raises(RuntimeError, match="closed by synk.close"):
        x.set_length(20)
    with pytest.raises(RuntimeError, match="closed by synk.close"):
        x.ref()
    x.free_memory()
    assert x.alloc_size == 0


# -- zero items, zero dimensions ------------------------------------------------------------
def test_zero_size(forked):
    x = synk.data(np.zeros((0, 3), dtype=np.float32))
    assert x.shape == (0, 3) and x.alloc_size == 0 and x.ref().segment == ""
    for seen in _everywhere(_read, x.ref()):
        assert seen.shape == (0, 3) and seen.dtype == np.float32
    x.set_length(2)
    assert x.alloc_size == 6 and x.ref().segment != ""
    x.set_value(np.zeros((0, 3), dtype=np.float32))  # fits in what is held
    assert x.alloc_size == 6 and x.shape == (0, 3)
    empty = synk.data(dtype="int16", ndim=2)
    assert empty.shape == (0, 0) and empty.alloc_size == 0 and empty.data.dtype == np.int16


def test_zero_dimensional(forked):
    x = synk.data(np.float32(2.5))
    assert x.shape == () and x.size == 1 and x.alloc_size == 1
    with pytest.raises(TypeError):
        len(x)
    assert _everywhere(_read, x.ref()) == [2.5] * forked
    x.set_value(np.float32(4))
    assert float(x.data) == 4.0
    with pytest.raises(ValueError, match="0-dimensional"):
        x.free_memory()
    with pytest.raises(ValueError, match="0-dimensional"):
        x.set_length(3)
    y = synk.data(dtype="float64", ndim=0)
    assert y.shape == () and float(y.data) == 0.0 and y.ref().segment != ""


# -- creation -------------------------------------------------------------------------------
def test_data_in_a_worker_is_refused(forked_workers):
    with pytest.raises(synk.WorkerError, match=r"synk.data\(\) can only be called in the master"):
        _on_workers(_make_data_in_worker)
    with pytest.raises(synk.WorkerError, match="commands cannot be nested"):
        _everywhere(_make_data_in_worker)  # the master's own part: inside a command


# -- pickling -------------------------------------------------------------------------------
def test_pickled_into_workers_is_a_non_owner_handle(gc_of_this_test, forked):
    x = synk.data(np.arange(4, dtype=np.int16), name="x")
    if forked > 1:
        for is_owner, values in _on_workers(_read_pickled, x):
            assert is_owner is False and values == [0, 1, 2, 3]
        with pytest.raises(synk.WorkerError, match="owns its memory"):
            _on_workers(_free_pickled, x)
    copy = pickle.loads(pickle.dumps(x))
    assert not copy.is_owner and np.shares_memory(copy.data, x.data)
    copy[0] = 9
    assert x.data[0] == 9
    with pytest.raises(RuntimeError, match="owns its memory"):
        copy.set_value(np.zeros(10, dtype=np.int16))
    with pytest.raises(RuntimeError, match="owns its memory"):
        copy.free_memory()
    del copy
    gc.collect()
    assert _exists(x.ref().segment)  # a non-owner never unlinks


@pytest.fixture
def two_processes():
    """One size is enough where a test starts a slow "spawn" interpreter."""
    synk.fork(2)
    try:
        yield 2
    finally:
        synk.close()


def test_spawned_process_opens_pickled_data(two_processes):
    x = synk.data(np.arange(12, dtype=np.float32).reshape(4, 3))
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_spawn_child, args=(x,))
    try:
        child.start()
        child.join(50)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        # "spawn" starts multiprocessing's resource tracker as our child; stop it so
        # that the no-leftover-children check holds.
        tracker = getattr(multiprocessing.resource_tracker, "_resource_tracker", None)
        if tracker is not None and hasattr(tracker, "_stop"):
            tracker._stop()
    expected = np.full((4, 3), 7, dtype=np.float32)
    expected[0, 0] = -1
    np.testing.assert_array_equal(x.data, expected)
