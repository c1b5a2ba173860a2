"""Unit tests for synkhronos._runtime.control and its reply slots (``replies.py``): the
control block in one process (no fork).

One process plays both the master (``post``, ``replies.reply``, ``all_done``) and a
worker (``read_command``, ``replies.finish``) on the same block, each with its own arena
(the master's and rank 1's), as the processes of a session would.
"""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time

import pytest

from synkhronos._runtime import control as C
from synkhronos._runtime import epoch, shmem
from synkhronos._runtime import replies as R
from synkhronos._runtime.arena import Arena
from synkhronos._runtime.memo import SIZE as MEMO_SIZE
from synkhronos._runtime.remote import BarrierAborted, RemoteFailure

BIG = C.MAILBOX_BYTES + 12345  # larger than the mailbox (and than a reply slot)


def _entries(prefix: str) -> list[str]:
    """Entries of /dev/shm (segments and semaphores) that carry ``prefix``."""
    names = os.listdir(shmem.SHM_DIR)
    return sorted(e for e in names if e.startswith((prefix, "sem." + prefix)))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def make_block(gc_of_this_test):
    """Build control blocks; afterwards drop them and check that nothing is left."""
    made: list[tuple[str, C.ControlBlock]] = []

    def make(n: int = 2, spin: float = 0.0, poll: float = 0.01) -> C.ControlBlock:
        prefix = shmem.new_session_prefix()
        block = C.ControlBlock(prefix, n, spin, poll)
        block.master_arena = Arena(prefix, 0, True, block.release_log)
        block.worker_arena = Arena(prefix, 1, False, block.release_log)
        made.append((prefix, block))
        return block

    yield make
    prefixes = [p for p, _ in made]
    for _, block in made:
        for semaphore in (*block._semaphores, block._take_lock):
            semaphore.close()
    made.clear()
    gc.collect()
    leftovers = [e for p in prefixes for e in _entries(p)]
    for p in prefixes:
        shmem.sweep_prefix(p)
    assert leftovers == []


def _no_poll():
    raise AssertionError("on_poll should not run")


# ---------------------------------------------------------------- construction


def test_block_leaves_no_names_behind(make_block):
    block = make_block(3)
    # segment and semaphores are unlinked at once: they live on through fork only
    assert _entries(block.prefix) == []
    assert block.seq == 0
    assert [block.done(r) for r in range(3)] == [0, 0, 0]
    assert not any(block.failed(r) for r in range(3))


def test_block_releases_its_fd_when_dropped(gc_of_this_test):
    # (earlier tests' garbage, frozen, cannot close fds during the measurement)
    before = _open_fds()
    prefix = shmem.new_session_prefix()
    block = C.ControlBlock(prefix, 2, 0.0)
    for semaphore in (*block._semaphores, block._take_lock):
        semaphore.close()
    del block
    gc.collect()
    assert _open_fds() == before
    assert _entries(prefix) == []


# ---------------------------------------------------------------- sharing out work


def test_take_hands_out_each_piece_once_and_starts_again_for_a_new_tag(make_block):
    block = make_block(2)
    assert [block.take(7, 3, _no_poll) for _ in range(5)] == [0, 1, 2, 3, 3]
    assert [block.take(8, 2, _no_poll) for _ in range(3)] == [0, 1, 2]  # a new tag
    assert block.take(7, 3, _no_poll) == 3  # a rank late on the older tag: all taken
    assert block.take(8, 2, _no_poll) == 2  # (and the newer one is not disturbed)


def test_take_from_threads_never_hands_a_piece_out_twice(make_block):
    block = make_block(2)
    got: list[list[int]] = [[], [], []]

    def taker(mine: list[int]) -> None:
        while (k := block.take(11, 500, _no_poll)) < 500:
            mine.append(k)

    threads = [threading.Thread(target=taker, args=(mine,)) for mine in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(k for mine in got for k in mine) == list(range(500))


def test_a_held_take_lock_runs_the_watch(make_block):
    block = make_block(2, poll=0.01)
    block._take_lock.acquire()  # a holder that never lets go (a dead process)

    def watch():
        raise BarrierAborted("a peer died")

    with pytest.raises(BarrierAborted):
        block.take(12, 4, watch)
    block._take_lock.release()


# ---------------------------------------------------------------- one command


def test_round_trip_small(make_block):
    block = make_block(2)
    message = ("fn", (1, 2.5, "x"), None)
    seq = block.post(message, 0, block.master_arena)
    assert seq == 1 and block.seq == 1
    assert block.all_done(seq, [1]) is False

    assert block.read_command(block.worker_arena) == message

    block.replies.finish(1, seq, {"answer": 42}, False, 0, block.worker_arena)
    assert block.done(1) == seq
    assert block.all_done(seq, [1]) is True
    assert block.failed(1) is False
    assert block.replies.reply(1, block.master_arena) == {"answer": 42}
    block.release_external_payload(block.master_arena)  # nothing external: a no-op
    assert _entries(block.prefix) == []


def test_sequence_numbers_increase_and_replies_are_per_rank(make_block):
    block = make_block(3)
    for expected in range(1, 6):
        seq = block.post(expected, 0, block.master_arena)
        assert seq == expected
        assert block.read_command(block.worker_arena) == expected
        block.replies.finish(1, seq, ("r1", expected), False, 0, block.worker_arena)
        assert not block.all_done(seq, [1, 2])
        block.replies.finish(2, seq, ("r2", expected), False, 0, block.worker_arena)
        assert block.all_done(seq, [1, 2])
        assert block.replies.reply(1, block.master_arena) == ("r1", expected)
        assert block.replies.reply(2, block.master_arena) == ("r2", expected)


def test_master_rank_other_than_zero(make_block):
    block = make_block(3)
    seq = block.post("p", 2, block.master_arena)
    block.replies.finish(0, seq, "zero", False, 2, block.worker_arena)
    block.replies.finish(1, seq, "one", False, 2, block.worker_arena)
    assert block.all_done(seq, [0, 1])
    replies = (block.replies.reply(0, block.master_arena),
               block.replies.reply(1, block.master_arena))
    assert replies == ("zero", "one")


def test_oversized_message_travels_in_its_own_segment(make_block):
    block = make_block(2)
    message = os.urandom(BIG)
    seq = block.post(message, 0, block.master_arena)
    extra = _entries(block.prefix)
    assert extra == [block.master_arena.name_of(1)]  # the arena's one naming scheme
    assert os.stat(os.path.join(shmem.SHM_DIR, extra[0])).st_mode & 0o777 == 0o600

    assert block.read_command(block.worker_arena) == message
    # a second reader (another worker) still finds it
    assert block.read_command(block.worker_arena) == message

    block.replies.finish(1, seq, None, False, 0, block.worker_arena)
    block.release_external_payload(block.master_arena)
    assert _entries(block.prefix) == []

    # the next, small command uses the mailbox again
    block.post("small", 0, block.master_arena)
    assert block.read_command(block.worker_arena) == "small"
    block.release_external_payload(block.master_arena)
    assert _entries(block.prefix) == []


def test_oversized_reply_is_unlinked_once_read(make_block):
    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    reply = os.urandom(R.REPLY_BYTES * 20)
    block.replies.finish(1, seq, reply, False, 0, block.worker_arena)
    extra = _entries(block.prefix)
    # a worker's ids never meet the master's
    assert extra == [block.worker_arena.name_of((2 << 40) + 1)]
    assert block.replies.reply(1, block.master_arena) == reply
    assert _entries(block.prefix) == []


def test_reply_exactly_at_slot_size_stays_inline(make_block):
    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    overhead = len(pickle.dumps(b"", protocol=pickle.HIGHEST_PROTOCOL))
    # a bytes object's pickle grows with its length; find one that fills the slot
    size = R.REPLY_BYTES - overhead
    while len(pickle.dumps(b"x" * size, protocol=pickle.HIGHEST_PROTOCOL)) > R.REPLY_BYTES:
        size -= 1
    block.replies.finish(1, seq, b"x" * size, False, 0, block.worker_arena)
    assert _entries(block.prefix) == []
    assert block.replies.reply(1, block.master_arena) == b"x" * size


def test_failed_reply(make_block):
    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    try:
        raise KeyError("nope")
    except KeyError as exc:
        failure = RemoteFailure.from_exception(exc)
    block.replies.finish(1, seq, failure, True, 0, block.worker_arena)
    assert block.all_done(seq, [1])
    assert block.failed(1)
    got = block.replies.reply(1, block.master_arena)
    assert got.exc_type == "KeyError"
    assert "nope" in got.message
    assert "Traceback" in got.traceback
    rebuilt = got.exception()
    assert isinstance(rebuilt, KeyError) and "nope" in rebuilt.__cause__.text
    # the status is per command: a later success clears it
    seq = block.post(None, 0, block.master_arena)
    block.replies.finish(1, seq, "ok", False, 0, block.worker_arena)
    assert not block.failed(1)


def test_failure_of_an_exception_that_does_not_pickle():
    class Local(Exception):  # a local class cannot be pickled by reference
        pass

    try:
        raise Local("inner")
    except Local as exc:
        failure = RemoteFailure.from_exception(exc)
    assert failure.pickled is None and failure.exception() is None
    assert "inner" in failure.message and "Local" in failure.exc_type


# ---------------------------------------------------------------- the release log


def test_released_segments_are_dropped_by_every_arena(make_block):
    block = make_block(2)
    master, worker = block.master_arena, block.worker_arena
    kept, gone = master.create(100), master.create(100)
    worker.map(kept.name)
    worker.map(gone.name)
    before = epoch.current
    master.release(gone.id)
    assert gone.name not in master and _entries(block.prefix) == [kept.name]
    worker.catch_up()
    assert gone.name not in worker and kept.name in worker
    assert epoch.current > before  # a mapping dropped moves the epoch on
    master.release(kept.id)
    worker.catch_up()
    assert len(worker) == 0 and _entries(block.prefix) == []


def test_an_arena_a_whole_ring_behind_drops_every_mapping(make_block):
    block = make_block(2)
    master, worker = block.master_arena, block.worker_arena
    kept = master.create(10)
    worker.map(kept.name)
    for _ in range(C.ReleaseLog.ITEMS + 3):
        master.release(master.create(10).id)
    worker.catch_up()
    assert len(worker) == 0  # everything dropped; still mapped again on demand
    assert worker.map(kept.name) is not None
    master.release(kept.id)


# ---------------------------------------------------------------- abort


def test_abort_flag(make_block):
    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    assert not block.aborted(seq)
    block.abort(seq)
    assert block.aborted(seq)
    assert not block.aborted(seq + 1)


def test_barrier_raises_when_aborted(make_block):
    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    block.abort(seq)
    with pytest.raises(BarrierAborted):
        block.barrier(0, _no_poll)


def test_barrier_raises_when_a_peer_failed(make_block):
    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    block.replies.finish(1, seq, "failure", True, 0, block.worker_arena)
    with pytest.raises(BarrierAborted):
        block.barrier(0, _no_poll)


def test_barrier_passes_when_the_peer_failed_after_passing_it(make_block):
    """Rank 1 arrives, passes and fails *after* the barrier, all between rank 0's read
    of its arrival and rank 0's read of its failure: rank 0 passes too (its own work
    goes on; an abort here made the error it reported a secondary one, seen under MPI)."""
    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    arrival = block._bases[1] + C._EPOCH
    real = block.header

    class Interleaved:  # rank 1 runs right after rank 0's first read of its arrival
        reads = 0

        def __getitem__(self, index):
            value = real[index]
            if index == arrival:
                Interleaved.reads += 1
                if Interleaved.reads == 1:
                    real[arrival] = seq * C._EPOCH_STRIDE + 1  # rank 1 arrives ...
                    block.replies.finish(1, seq, "failure", True, 0, block.worker_arena)  # fails
            return value

        def __setitem__(self, index, value):
            real[index] = value

    block.header = Interleaved()
    try:
        block.barrier(0, _no_poll)  # before the fix: BarrierAborted
    finally:
        block.header = real
    assert Interleaved.reads >= 2


# ---------------------------------------------------------------- barriers and waits


def test_barrier_with_one_rank(make_block):
    block = make_block(1)
    block.barrier(0, _no_poll)
    block.barrier(0, _no_poll)
    block.post(None, 0, block.master_arena)
    for _ in range(3):
        block.barrier(0, _no_poll)


def test_barrier_two_ranks_in_threads(make_block):
    block = make_block(2, poll=0.01)
    block.post(None, 0, block.master_arena)
    passed = []

    def rank1():
        for i in range(20):
            block.barrier(1, lambda: None)
            passed.append(i)

    thread = threading.Thread(target=rank1)
    thread.start()
    for _ in range(20):
        block.barrier(0, lambda: None)
    thread.join(10)
    assert not thread.is_alive()
    assert passed == list(range(20))


def test_wait_returns_at_once_when_ready(make_block):
    block = make_block(2, spin=0.001)
    block.wait(0, lambda: True, _no_poll)


def test_wait_polls_until_ready(make_block):
    block = make_block(2, poll=0.005)
    polls = []
    block.wait(0, lambda: len(polls) >= 3, lambda: polls.append(1))
    assert len(polls) == 3


def test_wait_abandoned_by_on_poll_clears_sleeping(make_block):
    block = make_block(2, poll=0.005)

    class Stop(Exception):
        pass

    def stop():
        raise Stop

    with pytest.raises(Stop):
        block.wait(1, lambda: False, stop)
    assert block.header[block._sleeping[1]] == 0


def test_post_wakes_a_sleeping_waiter(make_block):
    """A waiter blocked on its semaphore returns well before its poll interval."""
    block = make_block(2, poll=10.0)
    sleeping_at = block._sleeping[1]
    returned = threading.Event()

    def waiter():
        block.wait(1, lambda: block.seq == 1, lambda: None)
        returned.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 5
    while block.header[sleeping_at] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert block.header[sleeping_at] == 1
    start = time.monotonic()
    block.post(None, 0, block.master_arena)
    assert returned.wait(5)
    assert time.monotonic() - start < 1.0
    thread.join(5)


# ---------------------------------------------------------------- votes


def test_agree_is_a_barrier_that_counts_votes(make_block):
    block = make_block(2, poll=0.01)
    block.post(None, 0, block.master_arena)
    votes = {}

    def rank1(vote):
        votes[1] = block.agree(1, vote, lambda: None)

    for vote in (True, False):
        thread = threading.Thread(target=rank1, args=(vote,))
        thread.start()
        votes[0] = block.agree(0, True, lambda: None)
        thread.join(10)
        assert votes == {0: vote, 1: vote}
    block.post(None, 0, block.master_arena)  # a new command: old votes do not count
    thread = threading.Thread(target=rank1, args=(True,))
    thread.start()
    assert block.agree(0, True, lambda: None) is True
    thread.join(10)


# ---------------------------------------------------------------- repeated messages, raw replies


def test_keyed_message_is_decoded_once_per_worker(make_block):
    block = make_block(2)
    arena = block.master_arena
    message = ("plan", (1, 2, 3))
    first = block.post(message, 0, arena, key=message)
    got_first = block.read_command(block.worker_arena)
    block.replies.finish(1, first, None, False, 0, block.worker_arena)
    block.post("something else", 0, arena)
    assert block.read_command(block.worker_arena) == "something else"
    block.post(message, 0, arena, key=message)
    got_again = block.read_command(block.worker_arena)
    assert got_again == message
    assert got_again is got_first  # kept by id, not unpickled again
    other = ("plan", (1, 2, 4))
    block.post(other, 0, arena, key=other)
    assert block.read_command(block.worker_arena) == other


def test_a_post_interrupted_half_way_leaves_no_stale_mailbox_id(make_block, monkeypatch):
    """Ctrl-C while a post writes the mailbox: the message it held before is gone, so
    posting that message again must write it again, not trust the id it had."""
    block = make_block(2)
    arena = block.master_arena
    message = ("plan", (1, 2, 3))
    block.post(message, 0, arena, key=message)
    assert block.read_command(block.worker_arena) == message

    def half_written(buffer, at, capacity, obj, arena):
        buffer[at : at + 7] = b"garbage"
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "write_pickled", half_written)
    with pytest.raises(KeyboardInterrupt):
        block.post("another message", 0, arena)
    monkeypatch.undo()
    block.post(message, 0, arena, key=message)
    block._decoded.clear()  # a worker that never decoded it reads the mailbox
    assert block.read_command(block.worker_arena) == message


def test_unhashable_key_falls_back_to_pickling(make_block):
    block = make_block(2)
    message = {"a": [1, 2]}
    block.post(message, 0, block.master_arena, key=message)
    assert block.read_command(block.worker_arena) == message


def test_memo_is_bounded_and_ids_stay_unique(make_block):
    block = make_block(2)
    for i in range(MEMO_SIZE * 2 + 3):
        plan = ("p", i % (MEMO_SIZE + 7))  # more distinct plans than are kept
        block.post(plan, 0, block.master_arena, key=plan)
        assert block.read_command(block.worker_arena) == plan
        assert len(block._memo) <= MEMO_SIZE and len(block._decoded) <= MEMO_SIZE


def test_reply_of_arrays_round_trips_without_pickle(make_block):
    import numpy as np

    block = make_block(2)
    seq = block.post(None, 0, block.master_arena)
    reply = (5, [np.arange(6.0).reshape(2, 3), np.asarray(2.5)])
    block.replies.finish(1, seq, reply, False, 0, block.worker_arena)
    got = block.replies.reply(1, block.master_arena)
    assert got[0] == 5
    np.testing.assert_array_equal(got[1][0], reply[1][0])
    assert got[1][1].shape == () and got[1][1] == 2.5
    big = (1, [np.zeros(R.REPLY_BYTES // 8 + 1)])  # too big for the slot: pickled outside
    seq = block.post(None, 0, block.master_arena)
    block.replies.finish(1, seq, big, False, 0, block.worker_arena)
    np.testing.assert_array_equal(block.replies.reply(1, block.master_arena)[1][0], big[1][0])
    assert _entries(block.prefix) == []


def test_a_repeated_reply_goes_where_the_last_went(make_block):
    """A repeated call's reply given with the description the slot holds (``finish``'s
    ``head``): the arrays where the last reply's went, the master reading the same
    views; anything else written in full, as without it."""
    import numpy as np

    block = make_block(2)
    slots = block.replies
    assert slots.written is None  # nothing written yet
    seq = block.post(None, 0, block.master_arena)
    slots.finish(1, seq, (4, [np.zeros((2, 3)), np.zeros(3, "f4")]), False, 0,
                 block.worker_arena)
    head = slots.written
    first = slots.reply(1, block.master_arena, copy=False)
    for k in range(1, 4):
        seq = block.post(None, 0, block.master_arena)
        arrays = [np.full((2, 3), float(k)), np.arange(3, dtype="f4") + k]
        slots.finish(1, seq, (4, arrays), False, 0, block.worker_arena, head)
        assert block.done(1) == seq and not block.failed(1) and slots.written is head
        got = slots.reply(1, block.master_arena, copy=False)
        assert got[0] == 4 and got[1][0] is first[1][0]  # the master's views, kept
        for a, b in zip(got[1], arrays, strict=True):
            np.testing.assert_array_equal(a, b)
    others = [[np.zeros((3, 3)), np.zeros(3, "f4")],  # another shape
              [np.zeros((2, 3)), np.zeros(3, "f8")],  # another dtype
              [np.zeros((2, 3))],  # fewer arrays
              [np.zeros((2, 3)), [0.0, 0.0, 0.0]]]  # not an array
    like = [np.zeros((2, 3)), np.zeros(3, "f4")]
    for arrays in others:
        seq = block.post(None, 0, block.master_arena)
        slots.finish(1, seq, (4, like), False, 0, block.worker_arena)
        head = slots.written  # (a new one each time: the last reply was another)
        seq = block.post(None, 0, block.master_arena)
        slots.finish(1, seq, (4, arrays), False, 0, block.worker_arena, head)
        assert block.done(1) == seq and slots.written is not head  # written in full
        got = slots.reply(1, block.master_arena)
        for a, b in zip(got[1], arrays, strict=True):
            np.testing.assert_array_equal(a, b)
    seq = block.post(None, 0, block.master_arena)
    slots.finish(1, seq, (5, like), False, 0, block.worker_arena, head)  # another head
    assert slots.reply(1, block.master_arena)[0] == 5
    slots.finish(1, seq, "pickled", False, 0, block.worker_arena)
    assert slots.written is None  # the slot holds a pickle now


def test_memo_same_object_is_found_without_hashing():
    """The last key posted again is found by identity: its hash is never asked."""
    from synkhronos._runtime.memo import Decoded, Memo

    class Counted:
        hashes = 0

        def __hash__(self):
            Counted.hashes += 1
            return 1

    memo, key = Memo(size=2), Counted()
    ident, reset = memo.add(key, b"pickle")
    assert (ident, reset) == (1, False) and Counted.hashes == 1
    assert memo.find(key) == (1, b"pickle") and Counted.hashes == 1
    memo.add(("other",))
    _, reset = memo.add(("third",))  # full: emptied first, and says so
    assert reset and len(memo) == 1
    decoded = Decoded(size=None)
    decoded.put(3, "message")
    assert decoded[3] == "message" and decoded.get(4) is None


def test_a_message_posted_again_and_replies_as_before_take_only_what_still_stands(
        make_block):
    """The last post's message posted again (the same object, keyed by itself) is
    counted as a repost; ``collect``'s answer with views is the very list it gave the
    last time only once the worker answered, with success, arrays described as last
    time (or None): never after a reply of None, a pickled reply or a failure, even
    when the arrays that follow are described alike, and never when copying.
    ``SYNK_REPLAY=0``: neither, ever."""
    import numpy as np

    from synkhronos._runtime.epoch import REPLAY

    block = make_block(2)
    slots, arena, worker = block.replies, block.master_arena, block.worker_arena
    message = ("call", 1)
    seq = block.post(message, 0, arena, key=message)
    assert block.reposts == 0  # (the first post of it)
    like = (4, [np.zeros(3)])
    slots.finish(1, seq, like, False, 0, worker)
    first = slots.collect([1], arena, copy=False)
    seq = block.post(message, 0, arena, key=message)
    assert block.reposts == int(REPLAY) and seq == block.seq
    assert block.read_command(worker) == message
    slots.finish(1, seq, (4, [np.ones(3)]), False, 0, worker)
    got = slots.collect([1], arena, copy=False)
    assert (got is first) == REPLAY  # as before: nothing read again
    np.testing.assert_array_equal(got[0][2][1][0], np.ones(3))
    copied = slots.collect([1], arena, copy=True)
    assert copied is not first and copied[0][2][1][0].base is None  # a copy
    for other in (None, "pickled", RuntimeError("failed")):
        seq = block.post(message, 0, arena, key=message)
        failed = isinstance(other, Exception)
        slots.finish(1, seq, other, failed, 0, worker)
        got = slots.collect([1], arena, copy=False)
        assert got is not first and got[0][1] == failed, other
        if other is None:
            assert got == [(1, False, None)]
        seq = block.post(message, 0, arena, key=message)
        slots.finish(1, seq, like, False, 0, worker)  # described as before, written anew
        again = slots.collect([1], arena, copy=False)
        assert again is not first, other
        first = again
        np.testing.assert_array_equal(first[0][2][1][0], np.zeros(3))
    reposts = block.reposts
    block.post(("other",), 0, arena, key=("other",))
    block.post(message, 0, arena, key=message)  # another message went since
    block.post(message, 0, arena)  # unkeyed: pickled again, no id
    assert block.reposts == reposts
