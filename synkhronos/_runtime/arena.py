"""The arena: the one owner of a program's shared-memory segments in each process.

Every segment a program makes after ``fork()`` (a ``Data``'s memory, a function's
staging buffers, a collective's exchange buffers, a payload or reply too large for
its slot) is created, named, mapped and released here, and nowhere else.

- **Names.** ``<program prefix>s<id in hex>``: one scheme. The master numbers its
  segments 1, 2, 3...; a worker that must create one (an oversized reply) numbers
  them from ``(rank + 1) << 40``, so no two processes ever pick the same name.
- **Create** (``create``): exclusive, mode 0600, pages reserved at once. The creating
  process keeps its mapping.
- **Map** (``map``): any process maps a segment by name the first time it needs it and
  keeps the mapping; dropping one moves the process's epoch on (``epoch.py``), so
  caches of views built on mappings know when to let go.
- **One-off segments** (a message or reply too large for its slot): created here,
  handed over (``hand_over``) to the reader, which copies it out (``take``) and
  unlinks it; never logged.
- **Release** (``release``): the creator unlinks the name, drops its own mapping, and
  appends the id to the ``ReleaseLog``, a ring of ids in the control block. Every other
  process reads the log at the start of its next command (``catch_up``) and drops its
  mapping then: releases travel beside commands, never inside a payload. A process
  that fell more than a ring behind drops every mapping it holds (all are remapped on
  demand; only released names are gone).

A mapping outlives its name: unlinking only stops new opens, so memory goes when the
last process that maps it drops it. ``close()`` of the session sweeps every name under
the prefix, whatever is left.

**Several machines.** Every machine has its own prefix (its leader's), and a replica of
every segment the master creates for all to read (a ``Data``, a collective's buffers),
under the same id. On the master the arena keeps a **journal** (``start_journal``) of
what happened to those segments -- created, copied from another, released, unlinked --
which travels to the other machines with the next command; each machine's leader
replays it (``replay``) on its own arena. Commands name the master's segments; another
machine's arena maps them under its own prefix (``alias``): the translation is a swap of
prefixes, no table.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from . import epoch, shmem

JournalEntry = tuple  # ("create", id, nbytes) | ("copy", source, target, nbytes) |
#                       ("release", id) | ("unlink", id)

__all__ = ["Arena", "ReleaseLog", "Segment", "WORKER_ID_SHIFT"]

WORKER_ID_SHIFT = 40
_RING = 512  # ids kept in the release log


@dataclass(frozen=True)
class Segment:
    """A segment this process created: its id, name and mapping."""

    id: int
    name: str
    buffer: mmap.mmap

    @property
    def nbytes(self) -> int:
        return len(self.buffer)


class ReleaseLog:
    """A ring of released segment ids in shared memory: ``int64[1 + ring]``.

    Item 0 counts the ids ever appended; id ``k`` sits at ``1 + k % ring``. Only the
    master appends (it writes the id, then the count: x86 keeps stores in order).
    """

    ITEMS = 1 + _RING

    def __init__(self, words: memoryview):
        self.words = words  # a cast("q") view of ITEMS int64

    @property
    def count(self) -> int:
        return self.words[0]

    def append(self, segment_id: int) -> None:
        count = self.words[0]
        self.words[1 + count % _RING] = segment_id
        self.words[0] = count + 1

    def since(self, seen: int) -> list[int] | None:
        """Ids appended after the first ``seen``; None if some were overwritten."""
        count = self.words[0]
        if count - seen > _RING:
            return None
        return [self.words[1 + k % _RING] for k in range(seen, count)]


class Arena:
    """One process's view of its program's segments (see the module docstring).

    Parameters
    ----------
    prefix
        The program's prefix (``synk_<pid>_<token>_``).
    rank
        This process's rank; 0-based. The master's ids are plain counts.
    is_master
        Whether this process creates ids from the master's space.
    log
        The release log shared by the program's processes (None with one process).
    """

    def __init__(self, prefix: str, rank: int, is_master: bool, log: ReleaseLog | None):
        self.prefix = prefix
        self._log = log
        self._next = 0 if is_master else (rank + 1) << WORKER_ID_SHIFT
        self._maps: dict[str, mmap.mmap] = {}
        self._seen = log.count if log is not None else 0
        self._prefixes: str | tuple[str, ...] = prefix  # names this arena maps and caches
        self.alias: str | None = None  # the master's prefix, on another machine
        self.journal: list[JournalEntry] | None = None  # the master's, with several machines

    # -- several machines ---------------------------------------------------------------
    def start_journal(self) -> None:
        """The master of several machines: record what the other machines must replay."""
        self.journal = []

    def set_alias(self, master_prefix: str) -> None:
        """Another machine: names under ``master_prefix`` are this machine's replicas."""
        self.alias = master_prefix
        self._prefixes = (self.prefix, master_prefix)

    def local_name(self, name: str) -> str:
        """The name of ``name``'s segment on this machine (the master's name swapped for
        this machine's prefix)."""
        alias = self.alias
        if alias is not None and name.startswith(alias):
            return self.prefix + name[len(alias):]
        return name

    def take_journal(self) -> tuple[JournalEntry, ...]:
        """The journal entries since the last call (the master, before each command)."""
        journal = self.journal
        if not journal:
            return ()
        count = len(journal)  # a finalizer may append meanwhile: keep what came later
        entries = tuple(journal[:count])
        del journal[:count]
        return entries

    def replay(self, entries: tuple[JournalEntry, ...]) -> None:
        """Another machine's leader: apply the master's journal to this machine's
        replicas (before the command it came with)."""
        for entry in entries:
            kind = entry[0]
            if kind == "create":
                segment_id, nbytes = entry[1], entry[2]
                name = self.name_of(segment_id)
                buffer = shmem.create_segment(name, nbytes)
                self._maps[name] = buffer
                if self.alias is not None:
                    self._maps[self.alias + name[len(self.prefix):]] = buffer
            elif kind == "copy":
                _copy_bytes(self.map(self.name_of(entry[1])),
                            self.map(self.name_of(entry[2])), entry[3])
            elif kind == "release":
                self.release(entry[1])
            elif kind == "unlink":
                shmem.unlink_segment(self.name_of(entry[1]))

    # -- names --------------------------------------------------------------------------
    def name_of(self, segment_id: int) -> str:
        return f"{self.prefix}s{segment_id:x}"

    def owns(self, name: str) -> bool:
        """Whether ``name`` belongs to this program (and so to this arena's log)."""
        return name.startswith(self._prefixes)

    # -- create, map, release -----------------------------------------------------------
    def create(self, nbytes: int, replicated: bool = True) -> Segment:
        """A new segment of ``nbytes`` (at least one page), mapped here.

        ``replicated``: with several machines, every machine gets a replica (a
        one-off segment for one machine's control block passes False).
        """
        self._next += 1
        name = self.name_of(self._next)
        buffer = shmem.create_segment(name, nbytes)
        self._maps[name] = buffer
        if self.journal is not None and replicated:
            self.journal.append(("create", self._next, nbytes))
        return Segment(self._next, name, buffer)

    def copy(self, source: Segment, target: Segment, nbytes: int) -> None:
        """The first ``nbytes`` of ``source`` into ``target`` (on every machine)."""
        _copy_bytes(source.buffer, target.buffer, nbytes)
        if self.journal is not None:
            self.journal.append(("copy", source.id, target.id, nbytes))

    def map(self, name: str) -> mmap.mmap:
        """This process's mapping of segment ``name`` (mapped on first use)."""
        buffer = self._maps.get(name)
        if buffer is None:
            if not name.startswith(self._prefixes):  # another program's: not cached
                return shmem.open_segment(name)
            buffer = self._maps[name] = shmem.open_segment(self.local_name(name))
        return buffer

    def release(self, segment_id: int) -> None:
        """Creator only: unlink the name, drop the mapping here, and log the release."""
        name = self.name_of(segment_id)
        shmem.unlink_segment(name)
        self._drop(name)
        if self._log is not None:
            self._log.append(segment_id)
        if self.journal is not None:
            self.journal.append(("release", segment_id))

    def hand_over(self, segment: Segment) -> None:
        """Drop this process's mapping of a one-off segment it created and filled: the
        process that reads it unlinks it (``take``); it is never logged."""
        self._maps.pop(segment.name, None)
        segment.buffer.close()

    def take(self, name: str, nbytes: int, unlink: bool) -> bytes:
        """The first ``nbytes`` of a one-off segment, copied out (and its name unlinked
        if ``unlink``: the reader that is the last to need it)."""
        buffer = shmem.open_segment(name)
        try:
            return bytes(buffer[:nbytes])
        finally:
            buffer.close()
            if unlink:
                shmem.unlink_segment(name)

    def discard(self, name: str, replicated: bool = False) -> None:
        """Unlink a segment whose readers all mapped it (``replicated``: one created for
        every machine, whose replicas go too), or a one-off segment once read."""
        shmem.unlink_segment(name)
        if replicated and self.journal is not None:
            self.journal.append(("unlink", int(name[len(self.prefix) + 1:], 16)))

    def catch_up(self) -> None:
        """Drop the mappings of every segment released since the last call."""
        log = self._log
        if log is None or log.words[0] == self._seen:  # nothing released: most commands
            return
        released = log.since(self._seen)
        self._seen = log.count
        if released is None:  # fell a whole ring behind: let go of everything
            if self._maps:
                self._maps.clear()
                epoch.advance()
            return
        for segment_id in released:
            self._drop(self.name_of(segment_id))

    def _drop(self, name: str) -> None:
        if self._maps.pop(name, None) is not None:
            epoch.advance()
        if self.alias is not None:  # a replica is kept under the master's name too
            if self._maps.pop(self.alias + name[len(self.prefix):], None) is not None:
                epoch.advance()

    def __contains__(self, name: str) -> bool:
        return name in self._maps

    def __len__(self) -> int:
        return len(self._maps)



def _copy_bytes(source: mmap.mmap, target: mmap.mmap, nbytes: int) -> None:
    """The first ``nbytes`` of ``source`` into ``target``, without a temporary."""
    if nbytes:
        np.copyto(np.frombuffer(target, np.uint8, nbytes), np.frombuffer(source, np.uint8,
                                                                          nbytes))
