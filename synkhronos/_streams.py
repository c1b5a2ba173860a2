"""Each process's random streams: independent by default, identical on request.

A compiled function that draws random numbers (``RandomStream``, a shared generator)
holds its generator in a shared variable. ``distribute`` pickles it with the
function, so without this module every worker would unpickle the master's generator
and draw the very numbers the master draws: every process's rows would get the same
dropout mask. Instead, when a worker unpickles a generator it has not seen
(``reseed``), it replaces it with a generator of the same kind seeded by a child of
the master's ``SeedSequence``, keyed by the worker's rank:

- the master keeps the serial program's generator, so ``n_parallel=1`` draws exactly
  what the serial program draws;
- the streams depend only on the program's seeds and the rank, so a run repeats;
- with ``random_streams="identical"`` (``synk.distribute``'s keyword) the workers keep
  the master's generator as unpickled, and draw what the master draws.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np

from . import _pytensor

__all__ = ["Streams", "STREAMS", "check_streams", "reseed", "spawn_for_rank"]

Streams = Literal["independent", "identical"]
STREAMS: tuple[str, ...] = ("independent", "identical")

# Mixed into the children's spawn keys, so that a worker's stream is not a child the
# program itself would spawn from the same SeedSequence (``RandomStream`` spawns
# (0,), (1,), ... for its generators).
_TAG = 0x53594E4B  # "SYNK"


def check_streams(random_streams: Any) -> Streams | None:
    """``random_streams`` as given to ``distribute``; ValueError if not a choice."""
    if random_streams is None or random_streams in STREAMS:
        return random_streams
    raise ValueError(f"random_streams must be one of {STREAMS}; got {random_streams!r}")


def spawn_for_rank(generator: np.random.Generator, rank: int) -> np.random.Generator:
    """A generator of the same bit generator kind, seeded by a child of ``generator``'s
    ``SeedSequence`` keyed by ``rank`` (a generator made from a state, without one:
    a ``SeedSequence`` of its state's digest)."""
    bits = generator.bit_generator
    seq = getattr(bits, "seed_seq", None)
    if isinstance(seq, np.random.SeedSequence):
        child = np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, _TAG, rank),
                                       pool_size=seq.pool_size)
    else:
        digest = hashlib.sha256(repr(bits.state).encode()).digest()
        child = np.random.SeedSequence(int.from_bytes(digest, "little"),
                                       spawn_key=(_TAG, rank))
    return np.random.Generator(type(bits)(child))


def reseed(variables: Iterable[Any], rank: int) -> int:
    """A worker: give each random generator among ``variables`` (just unpickled) this
    rank's own stream; returns how many it reseeded."""
    count = 0
    for var in variables:
        value = _pytensor.value(var)
        if _pytensor.is_random_generator(var) and isinstance(value, np.random.Generator):
            var.set_value(spawn_for_rank(value, rank), borrow=True)
            count += 1
    return count
