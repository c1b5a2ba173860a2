"""The reply slots: each rank's answer to a command, written in its slot, read by the master.

The control block (``control.py``) lays out the segment and the header and makes one
``ReplySlots`` over them, given the positions it needs: each rank's slot of
``REPLY_BYTES`` and its header fields (done-seq, status, reply length, reply kind,
reply description number), whom each rank wakes, and the mailbox's length field.
Every process holds its own, inherited through fork: a worker keeps what it wrote,
the master what it read.

One reply, worker -> master:

1. ``finish`` (the worker, at the end of a command): a reply of None is only said in
   the length field; a reply of arrays that fits (``wire.describe``) goes in raw,
   behind its pickled description (``wire.write_arrays``); anything else is pickled
   (``wire.write_pickled``: larger than the slot, into a one-off segment of the arena
   whose name the slot holds instead). Then ``status``, then ``done = seq``, then the
   master is woken if it sleeps: it is the one rank that waits for a done field (a
   failure wakes every rank: one may wait for this one at a barrier).
2. The master waits until every worker is done (the block's ``wait_done``), then
   ``collect`` reads each rank's ``(rank, failed, reply)``: arrays copied out of the
   slot or left as views of it, a one-off segment unlinked once read, and the
   command's own one-off segment, if any, freed (``release_message``, the block's).

Replies that repeat (a training loop calls one function with the same arguments
thousands of times) are neither described nor decoded again:

- the worker keeps the description its slot holds and the places of its arrays there
  (``written``): a reply described alike is copied into those places (and a repeated
  call's outputs, given with that description, with no description made at all);
  each new description gets a new number in the rank's header field (0: the slot
  holds no described arrays);
- the master keeps, per rank, the views it decoded of the slot with that number:
  while the number stands, they are the reply (``reply`` and ``collect`` with
  ``copy=False``, which answers a repeated command with them).
"""

from __future__ import annotations

from collections.abc import Callable

import posix_ipc

from . import wire
from .arena import Arena
from .epoch import REPLAY
from .wire import read_pickled, write_pickled

__all__ = ["ReplySlots", "REPLY_BYTES", "STATUS_OK", "STATUS_FAILED"]

REPLY_BYTES = 1 << 16
_REPLY_FITS = REPLY_BYTES - 64  # description and array bytes that surely fit (its padding)
_NONE = -(1 << 40)  # reply length that means "the reply is None" (nothing pickled)

STATUS_OK, STATUS_FAILED = 0, 1  # a rank's status field: its reply is a result, a failure

#: Per rank: its slot's offset in the segment, then the header positions of its
#: done-seq, status, reply length, reply kind and reply description number.
Fields = tuple[int, int, int, int, int, int]
#: Per rank: its sleeping field and its semaphore (how to wake it).
Sleeper = tuple[int, posix_ipc.Semaphore]


class ReplySlots:
    """The reply slots of one control block, as this process writes and reads them.

    Parameters
    ----------
    buffer
        The block's whole segment.
    header
        The block's header (int64 items).
    fields
        ``Fields`` of each rank, by rank.
    sleepers
        ``Sleeper`` of each rank, by rank.
    wake_all
        Wakes every sleeping rank but the one given (the block's).
    message_length
        The header position of the mailbox's length field (negative: the command's
        message went in a one-off segment).
    release_message
        Frees that segment once every worker has read it.
    """

    def __init__(self, buffer: memoryview, header: memoryview, fields: list[Fields],
                 sleepers: list[Sleeper], wake_all: Callable[[int], None],
                 message_length: int,
                 release_message: Callable[[Arena], None]):
        self._n = len(fields)
        self._buffer = buffer
        self._header = header
        self._fields = fields
        self._sleepers = sleepers
        self._wake_all = wake_all
        self._message_length = message_length
        self._release_message = release_message
        # Replies of arrays whose description repeats (a training loop's) reuse the
        # views of the slot made for the last one: the worker's places to write, the
        # master's decoded reply of views, per rank (``wire.py``).
        # The worker numbers each description it writes into its slot (the header's
        # reply description number): the master reuses its views while it is the same.
        #: The description of the arrays this process's slot holds (the last reply
        #: ``finish`` wrote as arrays), or None; ``_places``, where its arrays went.
        self.written: bytes | None = None
        self._places: list = []
        self._heads_written = 0
        self._replies_read: list[tuple[int, tuple]] = [(-1, ())] * self._n
        #: The workers' fields read at once, where the master is rank 0 of at least 2
        #: (``SYNK_REPLAY=0``: never, and nothing found as before).
        self._workers = _Workers(header, fields) if self._n > 1 and REPLAY else None

    def close(self) -> None:
        """Let go of the views of the slots (before the block lets go of its mapping)."""
        self.written, self._places, self._replies_read = None, [], []
        if self._workers is not None:
            self._workers.release()
            self._workers = None

    # -- the worker's side ----------------------------------------------------------------
    def finish(self, rank: int, seq: int, reply: object, failed: bool, master_rank: int,
               arena: Arena, head: bytes | None = None) -> None:
        """A worker's end of a command: write the reply, mark done, wake the master.

        ``head``: the description ``written`` held when a repeated call's reply
        ``(weight, arrays)`` was first written (its rows, its outputs' dtypes and
        shapes): while the slot still holds it and each array is like its place, the
        arrays are copied where the last ones went, and no description is made (else
        the reply is written in full)."""
        header = self._header
        at, done, status, length, kind, number = self._fields[rank]
        if head is not None and self._places_take(head, reply[1]):  # type: ignore[index]
            header[length] = len(head)
            header[kind] = wire.ARRAYS
        elif reply is None:
            if header[number]:  # (0: the slot holds no described arrays,
                self.written, self._places = None, []  # and nothing is kept of it)
                header[number] = 0
            header[length] = _NONE
        else:
            described = wire.describe(reply)
            if described is not None and (
                    len(described[0]) + described[2] <= _REPLY_FITS):  # wire.size, bounded
                head, arrays = described[0], described[1]
                if self.written is head:  # the last reply's description: its places kept
                    wire.write_places(self._places, arrays)
                else:
                    self.written, self._places = None, []  # until the slot holds ``head``
                    self._heads_written += 1
                    header[number] = self._heads_written
                    self._places = wire.write_arrays(self._buffer, at, head, arrays)
                    self.written = head
                header[length] = len(head)
                header[kind] = wire.ARRAYS
            else:
                self.written, self._places = None, []
                header[number] = 0
                pickled, _ = write_pickled(self._buffer, at, REPLY_BYTES, reply, arena)
                header[length] = pickled
                header[kind] = wire.PICKLE
        if failed:
            header[status] = STATUS_FAILED
            header[done] = seq
            self._wake_all(rank)
            return
        header[status] = STATUS_OK
        header[done] = seq
        sleeping, semaphore = self._sleepers[master_rank]
        if header[sleeping]:
            semaphore.release()

    def _places_take(self, head: bytes, arrays: object) -> bool:
        """``arrays`` copied into the places of the arrays the slot holds, if it holds
        the description ``head`` and each is like its place (one is written before the
        next is checked: if one differs, the whole slot is written anew)."""
        places = self._places
        if self.written is not head or type(arrays) is not list or len(places) != len(arrays):
            return False
        i = 0
        for a in arrays:
            place = places[i]
            if (place is None or type(a) is not type(place) or a.shape != place.shape
                    or (a.dtype is not place.dtype and a.dtype != place.dtype)):
                return False
            place[...] = a
            i += 1
        return True

    # -- the master's side ----------------------------------------------------------------
    def reply(self, rank: int, arena: Arena, copy: bool = True) -> object:
        """The master's read of ``rank``'s reply to the current command (``copy``: see
        ``collect``)."""
        header = self._header
        at, _, _, length_field, kind, number = self._fields[rank]
        length = header[length_field]
        if length == _NONE:
            return None
        if header[kind] == wire.ARRAYS:
            head = header[number]
            kept = self._replies_read[rank]
            if kept[0] == head:  # the description this rank last wrote: the same views
                reply = kept[1]
            else:
                reply = wire.read_arrays(self._buffer, at, length, copy=False)
                self._replies_read[rank] = (head, reply)
            return reply if not copy else wire.copied(reply)
        return read_pickled(self._buffer, at, length, arena, discard=True)

    def collect(self, ranks: list[int], arena: Arena, copy: bool = True,
                ) -> list[tuple[int, bool, object]]:
        """Every rank's ``(rank, failed, reply)`` for the command just done; an
        oversized message's segment freed. ``copy=False``: arrays in a reply are views
        of its slot, valid until the next command (``wire.read_arrays``), and while
        every rank answers by arrays of the description it wrote last time (a repeated
        call's) they are the views read then, nothing read again.

        When ``ranks`` are all the workers (1 to n - 1, the master being 0), a reply
        that every one of them made as last time is found in one pass over each field
        (``_Workers``): at 16 processes a loop over the ranks cost more than the rest
        of an empty command. The list it returns is then the one it returned before:
        callers read it, never change it."""
        header = self._header
        if header[self._message_length] < 0:
            self._release_message(arena)
        workers = self._workers
        if workers is not None and ranks == workers.ranks:
            kept = workers.as_before(copy)
            if kept is not None:
                return kept
        else:
            workers = None
        fields = self._fields
        parts: list[tuple[int, bool, object]] = []
        for rank in ranks:
            _, _, status, length, kind, number = fields[rank]
            failed = header[status] != STATUS_OK
            if header[length] == _NONE:
                parts.append((rank, failed, None))
                continue
            if not copy and header[kind] == wire.ARRAYS:
                read = self._replies_read[rank]  # ``reply``'s views, written out: a
                if read[0] == header[number]:  # repeated call's reply
                    parts.append((rank, failed, read[1]))
                    continue
            parts.append((rank, failed, self.reply(rank, arena, copy)))
        if workers is not None and not copy:
            workers.keep(parts)
        return parts


class _Workers:
    """The fields of ranks 1 to n - 1 as strided views of the header, each read in one
    call (``tolist``), and the parts ``collect`` last answered with views, under the
    description numbers they were read under."""

    def __init__(self, header: memoryview, fields: list[Fields]):
        n = len(fields)
        self.ranks = list(range(1, n))
        self.count = n - 1
        stride = fields[2][1] - fields[1][1] if n > 2 else 1

        def strided(position: int) -> memoryview:
            at = fields[1][position]
            return header[at : at + stride * (n - 1) : stride]

        self.status, self.length, self.number = strided(2), strided(3), strided(5)
        self._kept: tuple[list, list] | None = None  # (numbers, parts)
        self._nones = [(rank, False, None) for rank in self.ranks]

    def as_before(self, copy: bool) -> list | None:
        """``collect``'s answer when it is one of two: every worker's reply None, or
        (not ``copy``) every worker's the views kept under the numbers its slot still
        shows; None otherwise (a failure, a new reply: ``collect`` reads rank by
        rank)."""
        if any(self.status.tolist()):
            return None
        kept = self._kept
        if not copy and kept is not None and self.number.tolist() == kept[0]:
            return kept[1]
        if self.length.tolist().count(_NONE) == self.count:
            return self._nones
        return None

    def keep(self, parts: list) -> None:
        """The parts ``collect`` just answered rank by rank, with views: kept while
        the numbers of their descriptions stand, if every one is a success answered by
        described arrays (0: a reply of None or a pickle)."""
        numbers = self.number.tolist()
        if 0 not in numbers and not any(self.status.tolist()):
            self._kept = (numbers, parts)

    def release(self) -> None:
        """Let go of the views (of the header, and of the slots in kept replies)."""
        self._kept = None
        for view in (self.status, self.length, self.number):
            view.release()
