"""The one validity counter: what a process kept for replay is good while it stands.

A repeated call, a bound call, a kept plan and a cached view of a segment are each made
once by the general path and used again and again (``synkhronos/_replay.py`` in the
master; the kept plans and views of ``_shard.py`` and ``_dataref.py`` in every rank).
Each holds the value ``current`` had when it was made, and is used only while
``current`` still has it. Every event in this process that can make something kept
wrong moves ``current`` on:

- a mapping of a segment dropped (``_runtime/arena.py``): a view of it is freed memory;
- a ``Data`` given new memory, another visible shape, or freed (``data.py``): a kept
  message names its segment and shape, a kept copy goes into its memory;
- an instrument (``synk.profile()``) started or stopped: kept messages ask every
  rank for its seconds, or do not, as when they were made.

Two events move nothing, by design: functions distributed (``distribute.py``: a
function's id is never reused or given another function, and a kept message names only
functions every rank registered before it was kept), and a fault point armed by a test
(replay passes the same points as the general path, ``_core/faults.py``).

Numbers are never reused (``itertools.count``), so two threads racing to move it on
leave it at a value nothing was made under. Reading it is one attribute lookup.

``SYNK_REPLAY=0`` in the environment keeps nothing at all (``REPLAY``): every command
takes the general path, which is what the suite checks replay against.
"""

from __future__ import annotations

import itertools
import os

__all__ = ["REPLAY", "current", "advance"]

_numbers = itertools.count(1)
current = 0  # the epoch now; anything kept under another value is stale


def advance() -> None:
    """Make everything kept so far stale."""
    global current
    current = next(_numbers)


# Whether anything is kept for replay at all: ``SYNK_REPLAY=0`` keeps nothing, so every
# command takes the general path (read once, at import; workers inherit it)
REPLAY = os.environ.get("SYNK_REPLAY", "").strip() != "0"
