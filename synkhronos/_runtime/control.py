"""The control block: one shared-memory segment through which every command travels.

Layout (all in one segment, mapped by every process before the fork)::

    header   int64[16 + 9 * n]   sequence number, payload length, abort flag, payload
                                 id, cross-machine outcome, the take counter and
                                 its tag; per rank (one cache line each): done-seq,
                                 status, (spare), barrier epoch, reply length, reply
                                 format, vote, reply description number; then every
                                 rank's sleeping flag, side by side
    log      int64[1 + ring]     the arena's release log (``arena.ReleaseLog``)
    mailbox  bytes[MAILBOX]      the pickled message of the current command
    replies  bytes[n][REPLY]     each rank's reply (result or failure)

The block owns the segment, the header and the semaphores. The reply slots, and the
header's reply fields, are written and read through ``replies`` (a ``ReplySlots``,
``replies.py``), which the block makes with the positions it needs.

One command, master -> workers -> back:

1. ``post``: the master writes the message, then bumps ``seq`` and wakes every
   sleeping worker.
2. Each worker sees the new ``seq`` (spinning briefly, else woken from its semaphore),
   reads the message, runs it, and finishes it (``ReplySlots.finish``: its reply
   written, ``status`` and then ``done = seq`` set, the master woken if it sleeps).
3. The master waits until every worker's ``done`` equals ``seq`` (``wait_done``,
   ``all_done``) and reads the replies (``ReplySlots.collect``).

Waiting is spin-then-block: a rank spins on the flag for ``spin`` seconds (bounded,
yielding the CPU now and then), then announces it is sleeping and blocks on its own
semaphore with a short timeout. Posters release the semaphore of a rank that
announced sleep. Each rank writes only its own fields, so no atomic
read-modify-write is needed; data written before a flag is seen after it because
x86 keeps stores in order. The sleeping flags lie side by side so that a waker sees
in one read of n words whether anyone sleeps (``_wake``): nobody does while commands
follow each other, and the per-rank loop then costs nothing at n = 16. A worker
that finishes wakes only the master, the one rank waiting for its done field. The
sleep announcement is a store followed by a load of
the flag, which x86 may reorder with the poster's store-then-load, so a wake-up can
in principle be lost: the timeout bounds that cost (it was never seen in
measurements), and it is also when a waiter checks that its peers are alive.

Inside a command, ranks meet at ``barrier`` (epoch counters) and ``agree`` (a barrier
that also tells whether every rank voted yes: all-or-nothing checks done where the
data lives). With several machines, a meeting spans them: the local ranks agree, the
machine's leader agrees with the other leaders and writes the outcome (``set_cross``),
and a second barrier lets every local rank read it (``cross``).

Inside a command, ranks may also share out work as they go (``take``): one counter in
the header, read and bumped under a lock (a semaphore, the one read-modify-write in
the block), hands each rank the next chunk of rows until none is left. The counter
starts again for each chunked call (its tag: the command's sequence number and the
call's place in it, which only grow), so no rank has to reset it between commands,
and a rank that has moved on to the next chunked call does not disturb one still
finishing the last.

A message larger than the mailbox travels in a one-off segment of the arena whose
name is written in the mailbox instead (``wire.write_pickled``); the master frees it
once every worker has read it (``release_external_payload``).

A command that repeats (a training loop calls one function with the same arguments
thousands of times) is pickled once: a message posted with a ``key`` has its bytes kept
by the master by key, under an id; a worker keeps what it decoded by id and skips the
unpickling when the id comes again (``memo.py``, shared with the link between
machines; a message posted as the same object as the last skips its hash too). Its
replies are spared the same way (``replies.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial

import posix_ipc

from . import shmem
from .arena import Arena, ReleaseLog
from .epoch import REPLAY
from .memo import Decoded, Memo
from .remote import BarrierAborted
from .replies import REPLY_BYTES, STATUS_FAILED, STATUS_OK, ReplySlots
from .wire import one_off_name, read_pickled, write_pickled

__all__ = ["ControlBlock", "MAILBOX_BYTES", "ReleaseLog"]

MAILBOX_BYTES = 1 << 20

_SEQ, _PAYLOAD_LEN, _ABORT, _PAYLOAD_ID, _CROSS, _TAKEN, _TAKE_TAG = 0, 1, 2, 3, 4, 5, 6
_HEAD = 16
_PER_RANK = 8
_DONE, _STATUS, _SPARE, _EPOCH, _REPLY_LEN, _REPLY_KIND, _VOTE, _REPLY_HEAD = range(8)
_EPOCH_STRIDE = 1 << 20  # barrier epoch = seq * stride + barrier count in that command


class ControlBlock:
    """Shared state for one session of ``n`` ranks; created by the master before fork.

    ``poll`` is how long a blocked waiter sleeps before it re-checks liveness.
    """

    def __init__(self, prefix: str, n: int, spin: float, poll: float = 0.05):
        self.prefix = prefix
        self.n = n
        self.spin = spin
        self.poll = poll
        sleeping_at = _HEAD + _PER_RANK * n  # the sleeping flags, one word per rank
        header_bytes = 8 * (sleeping_at + n)
        log_bytes = 8 * ReleaseLog.ITEMS
        self._mailbox_at = header_bytes + log_bytes
        replies_at = self._mailbox_at + MAILBOX_BYTES
        size = replies_at + REPLY_BYTES * n
        name = prefix + "control"
        self._map = shmem.create_segment(name, size)
        shmem.unlink_segment(name)  # inherited through fork: no name needed after now
        self._buffer = memoryview(self._map)
        # A memoryview of int64: item access is several times cheaper than numpy's,
        # and the spin loops read these fields millions of times.
        self._buffer[: self._mailbox_at] = bytes(self._mailbox_at)
        self.header = self._buffer[:header_bytes].cast("q")
        self.release_log = ReleaseLog(self._buffer[header_bytes : self._mailbox_at].cast("q"))
        self._semaphores = []
        for rank in range(n):
            sem_name = f"/{prefix}wake{rank}"
            sem = posix_ipc.Semaphore(sem_name, posix_ipc.O_CREX, mode=0o600)
            sem.unlink()
            self._semaphores.append(sem)
        self._take_lock = posix_ipc.Semaphore(f"/{prefix}take", posix_ipc.O_CREX, mode=0o600,
                                              initial_value=1)
        self._take_lock.unlink()
        self._memo = Memo()  # master: key -> (id, pickle)
        self._decoded = Decoded()  # worker: id -> message
        self._last_read: tuple[int, object] = (0, None)  # worker: the last (id, message)
        self._in_mailbox = 0  # master: the id of the message the mailbox holds (0: none)
        #: The master's count of posts of the last post's message object again (a
        #: training loop's call: no hash, no pickle; ``testing.lane_runs``).
        self.reposts = 0
        #: While a timed command runs (``synk.profile``): this process's seconds of
        #: waiting at each barrier (after arriving, for the others), appended.
        self.clock: list[float] | None = None
        self._bases = [_HEAD + _PER_RANK * rank for rank in range(n)]  # each rank's fields
        self._sleeping = [sleeping_at + rank for rank in range(n)]
        #: Whether anyone sleeps, in one read: the flags' bytes against all zero.
        self._sleepers = self._buffer[8 * sleeping_at : header_bytes]
        self._nobody = bytes(8 * n)
        self._epochs = [base + _EPOCH for base in self._bases]  # (barrier's, agree's)
        self._votes = [base + _VOTE for base in self._bases]
        #: Every rank's vote, read at once (``agree``; a strided view of the header).
        self._all_votes = self.header[_HEAD + _VOTE : _HEAD + _PER_RANK * n : _PER_RANK]
        # Per rank: every other rank's sleeping field and semaphore (whom it may wake).
        self._peers = [[(self._sleeping[other], self._semaphores[other])
                        for other in range(n) if other != rank] for rank in range(n)]
        fields = [(replies_at + REPLY_BYTES * rank, base + _DONE, base + _STATUS,
                   base + _REPLY_LEN, base + _REPLY_KIND, base + _REPLY_HEAD)
                  for rank, base in enumerate(self._bases)]
        # The mailbox's clean-up goes to the slots as a function of the header and the
        # segment, not as a bound method: a cycle through the block would keep its
        # mapping alive after the block is dropped unclosed.
        release = partial(_release_message, self.header, self._buffer, self._mailbox_at)
        #: Each rank's reply slot and reply fields (``replies.py``).
        sleepers = [(field, self._semaphores[rank]) for rank, field in enumerate(self._sleeping)]
        self.replies = ReplySlots(self._buffer, self.header, fields, sleepers,
                                  self.wake_all, _PAYLOAD_LEN, release)

    def close(self) -> None:
        """Let go of the mapping and the semaphores (the master, at ``close()``; the
        names were unlinked long ago). Nothing may use the block afterwards."""
        self.replies.close()  # the views of the slots, let go
        try:
            for view in (self._all_votes, self._sleepers, self.header,
                         self.release_log.words, self._buffer):
                view.release()
            self._map.close()
        except BufferError:  # a reply's view still held somewhere (a traceback's frame):
            pass  # the mapping goes when the last view does

        for semaphore in (*self._semaphores, self._take_lock):
            semaphore.close()

    # -- fields -----------------------------------------------------------------------
    @property
    def seq(self) -> int:
        return self.header[_SEQ]

    def done(self, rank: int) -> int:
        return self.header[self._bases[rank] + _DONE]

    def failed(self, rank: int) -> bool:
        return self.header[self._bases[rank] + _STATUS] != STATUS_OK

    def epoch(self, rank: int) -> int:
        """The last barrier ``rank`` reached (barriers of later commands count higher)."""
        return self.header[self._epochs[rank]]

    # -- waking and waiting ------------------------------------------------------------
    def wake_all(self, except_rank: int) -> None:
        if self._sleepers.tobytes() != self._nobody:
            self._wake(except_rank)

    def _wake(self, except_rank: int) -> None:
        """Release the semaphore of every rank but ``except_rank`` that sleeps."""
        header = self.header
        for sleeping, semaphore in self._peers[except_rank]:
            if header[sleeping]:
                semaphore.release()

    def done_fields(self, ranks: list[int]) -> list[int]:
        """The header positions of ``ranks``' done-seq fields (for ``wait_done``)."""
        return [self._bases[rank] + _DONE for rank in ranks]

    def next_command(self, rank: int, seen: int, on_poll: Callable[[], None]) -> int:
        """A worker's wait for the command after ``seen``; returns its sequence number.

        The spin is ``wait``'s, written out: this loop is the worker's whole latency."""
        header = self.header
        if header[_SEQ] == seen and self.spin > 0:
            deadline = time.perf_counter() + self.spin
            count = 0
            while header[_SEQ] == seen:
                count += 1
                if count & 255 == 0:
                    if time.perf_counter() > deadline:
                        break
                    os.sched_yield()
        if header[_SEQ] == seen:
            self.wait(rank, lambda: header[_SEQ] != seen, on_poll, spin=0.0)
        return header[_SEQ]

    def wait_done(self, rank: int, seq: int, fields: list[int],
                  on_poll: Callable[[], None]) -> None:
        """Wait until every rank whose done field is in ``fields`` (``done_fields``) has
        finished command ``seq``; spin first, then block, as ``wait``."""
        header = self.header
        if self.spin > 0:
            deadline = time.perf_counter() + self.spin
            count = 0
            while True:
                for field in fields:  # ``ready`` written out: no call per turn
                    if header[field] != seq:
                        break
                else:
                    return
                count += 1
                if count & 255 == 0:
                    if time.perf_counter() > deadline:
                        break
                    os.sched_yield()

        def ready() -> bool:
            for field in fields:
                if header[field] != seq:
                    return False
            return True

        self.wait(rank, ready, on_poll, spin=0.0)

    def wait(
        self,
        rank: int,
        ready: Callable[[], bool],
        on_poll: Callable[[], None],
        spin: float | None = None,
    ) -> None:
        """Return once ``ready()`` holds; spin first, then block on ``rank``'s semaphore.

        ``on_poll`` runs after each blocked interval; it raises to abandon the wait
        (a dead peer, a timeout, Ctrl-C).
        """
        spin = self.spin if spin is None else spin
        if ready():
            return
        if spin > 0:
            deadline = time.perf_counter() + spin
            count = 0
            while True:
                if ready():
                    return
                count += 1
                if count & 255 == 0:
                    if time.perf_counter() > deadline:
                        break
                    os.sched_yield()
        sleeping = self._sleeping[rank]
        semaphore = self._semaphores[rank]
        self.header[sleeping] = 1
        try:
            while not ready():
                try:
                    semaphore.acquire(self.poll)
                except posix_ipc.BusyError:
                    on_poll()
                except posix_ipc.SignalError:
                    on_poll()  # EINTR: Python's own handler has run; look again
        finally:
            self.header[sleeping] = 0

    # -- one command ------------------------------------------------------------------
    def post(self, message: object, master_rank: int, arena: Arena, key=None) -> int:
        """Publish a command to every worker and wake them; return its sequence number.

        ``key``: a hashable stand-in for ``message`` (equal keys, equal messages) that
        lets a repeated message skip pickling here and unpickling in the workers.
        Pickling comes first: a message that cannot be pickled raises here, before
        anything is written.
        """
        header = self.header
        last = self._memo.last
        if key is not None and last is not None and last[0] is key and REPLAY:
            # The same object as the last command's (a training loop): no hash, no pickle.
            message_id = last[1]
            if self._in_mailbox != message_id:
                self._fill_mailbox(message_id, last[2])
            else:
                self.reposts += 1
        else:
            message_id = self._publish(message, arena, key)
        header[_PAYLOAD_ID] = message_id
        seq = header[_SEQ] + 1
        header[_SEQ] = seq
        if self._sleepers.tobytes() != self._nobody:  # wake_all, written out
            self._wake(master_rank)
        return seq

    def _publish(self, message: object, arena: Arena, key) -> int:
        """``message`` into the mailbox, from the memo or pickled; its id (0: none)."""
        memo = None
        if key is not None:
            try:
                memo = self._memo.find(key)
            except TypeError:  # not hashable after all: pickle it every time
                key = None
        if memo is not None:
            message_id, remembered = memo
            if self._in_mailbox != message_id:
                self._fill_mailbox(message_id, remembered)
            return message_id
        # The mailbox is about to change: until the post ends it holds no known message
        # (a Ctrl-C half-way must not leave a stale id that lets a later post skip it).
        self._in_mailbox = 0
        length, data = write_pickled(self._buffer, self._mailbox_at, MAILBOX_BYTES, message,
                                     arena)
        self.header[_PAYLOAD_LEN] = length
        message_id = 0
        if key is not None and data is not None:
            message_id = self._memo.add(key, data)[0]
        self._in_mailbox = message_id
        return message_id

    def _fill_mailbox(self, message_id: int, data: bytes) -> None:
        """A remembered message's bytes into the mailbox (which holds another)."""
        self._in_mailbox = 0  # until the copy is whole (a Ctrl-C half-way: see _publish)
        self._buffer[self._mailbox_at : self._mailbox_at + len(data)] = data
        self.header[_PAYLOAD_LEN] = len(data)
        self._in_mailbox = message_id

    def read_command(self, arena: Arena) -> object:
        """A worker's view of the current command's message."""
        message_id = self.header[_PAYLOAD_ID]
        if message_id:
            last = self._last_read
            if last[0] == message_id:  # the same as the last command's: a training loop
                return last[1]
            message = self._decoded.get(message_id)
            if message is not None:
                self._last_read = (message_id, message)
                return message
        message = read_pickled(self._buffer, self._mailbox_at, self.header[_PAYLOAD_LEN], arena)
        if message_id:
            self._decoded.put(message_id, message)
            self._last_read = (message_id, message)
        return message

    def release_external_payload(self, arena: Arena) -> None:
        """The master's clean-up of an oversized message once every worker read it."""
        _release_message(self.header, self._buffer, self._mailbox_at, arena)

    def mark_failed(self, rank: int, seq: int) -> None:
        """The master's own part failed: release every rank waiting at a barrier."""
        base = self._bases[rank]
        self.header[base + _STATUS] = STATUS_FAILED
        self.header[base + _DONE] = seq
        self.wake_all(rank)

    def all_done(self, seq: int, ranks: list[int]) -> bool:
        header = self.header
        for rank in ranks:
            if header[_HEAD + _PER_RANK * rank + _DONE] != seq:
                return False
        return True

    def abort(self, seq: int) -> None:
        """Tell every rank to abandon command ``seq`` (a peer died or timed out)."""
        self.header[_ABORT] = seq
        for rank in range(self.n):
            self._semaphores[rank].release()

    def aborted(self, seq: int) -> bool:
        return self.header[_ABORT] == seq

    # -- sharing out work inside a command -------------------------------------------
    def take(self, tag: int, limit: int, on_poll: Callable[[], None]) -> int:
        """The next of ``limit`` pieces of work for the caller, or ``limit`` when every
        piece has been taken.

        ``tag`` names the work being shared out: the same on every rank, and larger for
        each new piece of work (the counter starts again from 0 when a larger tag
        comes). A rank still asking under an older tag gets ``limit``: a later piece of
        work began only once every piece of the older one had been taken. The lock is
        held for a read and a write; a rank that waits for it longer than ``poll``
        runs ``on_poll`` (a dead holder is a dead peer: the watch raises).
        """
        lock = self._take_lock
        try:
            lock.acquire(0)
        except posix_ipc.BusyError:
            while True:
                try:
                    lock.acquire(self.poll)
                    break
                except (posix_ipc.BusyError, posix_ipc.SignalError):
                    on_poll()
        header = self.header
        try:
            current = header[_TAKE_TAG]
            if tag < current:  # a later piece of work began: this one was all taken
                return limit
            if tag > current:
                header[_TAKE_TAG] = tag
                header[_TAKEN] = 0
            taken = header[_TAKEN]
            if taken < limit:
                header[_TAKEN] = taken + 1
        finally:
            lock.release()
        return taken

    # -- meeting points inside a command ------------------------------------------------
    def barrier(self, rank: int, on_poll: Callable[[], None]) -> None:
        """Wait until every rank of the current command reaches this barrier.

        Raises ``BarrierAborted`` if another rank finished the command with a failure
        (it will never arrive) or the master aborted the command.
        """
        header = self.header
        seq = header[_SEQ]
        epoch_field = self._epochs[rank]
        current = header[epoch_field]
        first = seq * _EPOCH_STRIDE  # this command's first barrier arrives at first + 1
        target = (current if current >= first else first) + 1
        header[epoch_field] = target
        if self._sleepers.tobytes() != self._nobody:  # wake_all, written out
            self._wake(rank)
        epochs = self._epochs
        for field in epochs:  # (the loops of all(), written out: a small command's path)
            if header[field] < target:
                break
        else:
            return  # the last to arrive

        def arrived() -> bool:
            for field in epochs:
                if header[field] < target:
                    return False
            return True

        def ready() -> bool:
            if arrived():
                return True
            if self._peer_failed(seq):
                # Look again: a rank may have arrived, passed the barrier and failed
                # after it between the two reads above (it failed *after* the barrier,
                # so this rank passes too and raises its own error, not a secondary one).
                if arrived():
                    return True
                raise BarrierAborted("another process failed before this barrier")
            return False

        clock = self.clock
        started = time.perf_counter() if clock is not None else 0.0
        try:
            if self.spin > 0 and self._spin_arrivals(epochs, target, ready):
                return
            self.wait(rank, ready, on_poll, spin=0.0)
        finally:
            if clock is not None:
                clock.append(time.perf_counter() - started)

    def _spin_arrivals(self, epochs: list[int], target: int,
                       ready: Callable[[], bool]) -> bool:
        """The barrier's spin: True once every rank's epoch is at ``target``, False
        after ``spin`` seconds. It looks only for arrivals, and for a failed peer
        (``ready``) every 256 turns: a turn that read every rank's status slowed the
        noticing of the last arrival at 16 ranks, the barrier's whole latency."""
        header = self.header
        deadline = time.perf_counter() + self.spin
        count = 0
        while True:
            for field in epochs:
                if header[field] < target:
                    break
            else:
                return True
            count += 1
            if count & 255 == 0:
                if ready():
                    return True
                if time.perf_counter() > deadline:
                    return False
                os.sched_yield()

    def _peer_failed(self, seq: int) -> bool:
        """Whether command ``seq`` was aborted or a rank finished it with a failure."""
        header = self.header
        if header[_ABORT] == seq:
            return True
        for base in self._bases:
            if header[base + _DONE] == seq and header[base + _STATUS] != STATUS_OK:
                return True
        return False

    def set_cross(self, ok: bool) -> None:
        """The leader: the outcome of a meeting across machines (read after a barrier)."""
        self.header[_CROSS] = 1 if ok else 0

    def cross(self) -> bool:
        return self.header[_CROSS] == 1

    def agree(self, rank: int, ok: bool, on_poll: Callable[[], None]) -> bool:
        """A barrier that returns whether every rank passed ``ok=True`` to it."""
        header = self.header
        yes = 2 * header[_SEQ] + 1
        header[self._votes[rank]] = yes if ok else yes - 1
        self.barrier(rank, on_poll)
        return self._all_votes.tolist().count(yes) == self.n


def _release_message(header: memoryview, buffer: memoryview, mailbox_at: int,
                     arena: Arena) -> None:
    """``release_external_payload`` of the block whose header and segment these are."""
    length = header[_PAYLOAD_LEN]
    if length < 0:
        arena.discard(one_off_name(buffer, mailbox_at, length))
        header[_PAYLOAD_LEN] = 0
