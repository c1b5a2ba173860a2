"""The repeated-message memo: a message that comes again travels as its id.

A training loop posts the same message thousands of times. The sender keeps each
message it was asked to remember (``Memo``: by a hashable key, the message itself or a
stand-in) with an id and what it made of it once (its pickle, or nothing); a receiver
keeps what it decoded by id (``Decoded``), so a repeated message is neither pickled
nor unpickled again. Ids are never reused, so an id a receiver knows always names
the same message. The control block (one machine: ``control.py``) and the leaders'
link between machines (``_machines/link.py``) both use it.

The sender's hot path is the same object posted again: ``Memo.last`` holds the last
entry found or made, which the caller compares by identity before it hashes anything.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Memo", "Decoded", "SIZE"]

SIZE = 256  # messages remembered (sender) and decoded messages kept (receiver)


class Memo:
    """The sender's side: key -> (id, payload).

    Parameters
    ----------
    size
        Entries kept; the memo is emptied when full (``add`` says so, for receivers
        that are told rather than left to empty their own side).
    """

    __slots__ = ("last", "_entries", "_next_id", "size")

    def __init__(self, size: int = SIZE) -> None:
        self.last: tuple | None = None  # (key, id, payload) of the last entry found or made
        self._entries: dict[Any, tuple[int, Any]] = {}
        self._next_id = 0
        self.size = size

    def find(self, key: Any) -> tuple[int, Any] | None:
        """``(id, payload)`` remembered for ``key``, or None. Raises TypeError when
        ``key`` is not hashable (then the caller sends the message in full)."""
        last = self.last
        if last is not None and last[0] is key:
            return last[1], last[2]
        entry = self._entries.get(key)
        self.last = None if entry is None else (key, *entry)
        return entry

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: Any, payload: Any = None) -> tuple[int, bool]:
        """Remember ``key`` with ``payload``: its new id, and whether the memo was
        emptied first (every id given before is forgotten)."""
        reset = len(self._entries) >= self.size
        if reset:
            self._entries.clear()
        self._next_id += 1
        self._entries[key] = (self._next_id, payload)
        self.last = (key, self._next_id, payload)
        return self._next_id, reset


class Decoded:
    """The receiver's side: id -> the message decoded from it.

    Parameters
    ----------
    size
        Messages kept; when full the receiver empties it itself (``put``), which is
        safe because ids are never reused: a forgotten id is decoded again from the
        message, which its sender then still sends in full. A receiver that only ever
        gets an id without the message (``_machines/link.py``) passes None and
        empties it when the sender says (``clear``).
    """

    __slots__ = ("_by_id", "size")

    def __init__(self, size: int | None = SIZE) -> None:
        self._by_id: dict[int, Any] = {}
        self.size = size

    def get(self, ident: int) -> Any:
        """The message decoded for ``ident``, or None."""
        return self._by_id.get(ident)

    def __getitem__(self, ident: int) -> Any:
        """The message decoded for ``ident`` (KeyError: never decoded here)."""
        return self._by_id[ident]

    def put(self, ident: int, message: Any) -> None:
        if self.size is not None and len(self._by_id) >= self.size:
            self._by_id.clear()
        self._by_id[ident] = message

    def __len__(self) -> int:
        return len(self._by_id)

    def clear(self) -> None:
        self._by_id.clear()
