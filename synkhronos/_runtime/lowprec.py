"""The 16-bit formats of a low-precision exchange: float32 values rounded for the trip
between processes, and summed again in float32.

It owns the formats (:class:`Exchange`), the parsing of the user's ``exchange=``
argument, and the two kernels every backend's low-precision exchange is made of, in
the order a collective runs them:

1. ``encode``: each process rounds its float32 values to 16 bits (round to nearest,
   ties to even), into 16-bit words that travel in place of the values;
2. ``fold``: the processes' words, widened back to float32 (exactly: every bf16 and
   every fp16 value is a float32), summed in float32 in rank order, and divided by
   their count for an average. A rank-order fold of the rounded values in numpy gives
   the same bits.

The formats:

- **bf16** (bfloat16): the upper half of a float32 (sign, 8-bit exponent, 7 stored
  mantissa bits), so it keeps float32's range. numpy has no dtype for it: the rounding
  runs on ``uint32`` views of the values (add ``0x7FFF`` plus the lowest kept bit, keep
  the upper 16 bits); a NaN stays a NaN (a quiet one, of its sign), a value beyond the
  largest bf16 rounds to infinity, as IEEE rounding does.
- **fp16** (IEEE half): numpy's ``float16`` rounding. 10 stored mantissa bits, but its
  range ends at 65504 (a larger magnitude becomes infinity) and its subnormals at 6e-8
  (smaller magnitudes become zero): gradients outside that range are lost. numpy's
  cast is scalar code, slow below the normal halves (where small gradients lie), so
  the same bits are computed here on ``uint32`` views; halves are widened through a
  table of all 65536, made by numpy's cast.

The kernels work through ``CHUNK`` elements at a time, so that their temporaries stay
in the cache. numpy only: it lives in ``_runtime`` so that any layer, the MPI layer
included, can fold with it.
"""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["CHUNK", "Exchange", "encode", "fold", "parse_exchange"]

# Elements per piece of the bf16 kernels: a 256 KiB uint32 temporary, which stays in the
# cache (measured on 64 MiB here: 16K to 128K elements were within 10% of each other;
# 4K and 1M were 1.5 to 2 times slower)
CHUNK = 1 << 16

_ROUND = 0x7FFF  # added with the lowest kept bit: round to nearest, ties to even
_UPPER = 1 if sys.byteorder == "little" else 0  # the upper uint16 of a uint32
_HALF_NORMAL_BITS = 0x38800000  # float32 bits of 2**-14, the smallest normal half
_HALF_REBASE = (0xFFF - 0x38000000) % (1 << 32)  # round, and exponent bias 127 -> 15
_HALF_INFINITY = 0x7C00
_HALF_GRID = np.float32(2.0**24)  # subnormal halves are multiples of 2**-24
_QUIET = 0x0040  # the quiet bit of a bf16 NaN (the top stored mantissa bit)


class Exchange(enum.Enum):
    """The 16-bit format values are rounded to for a low-precision exchange."""

    BF16 = "bf16"
    FP16 = "fp16"

    __hash__ = object.__hash__  # (members are singletons: hashed in C, as ReduceOp's)


def parse_exchange(exchange: Any) -> Exchange | None:
    """The user's ``exchange`` argument as an :class:`Exchange` (None: the exact exchange).

    Raises
    ------
    TypeError
        If ``exchange`` is neither None, a string nor an ``Exchange``.
    ValueError
        If it names no format.
    """
    if exchange is None or isinstance(exchange, Exchange):
        return exchange
    if not isinstance(exchange, str):
        raise TypeError(f"exchange must be None, 'bf16' or 'fp16'; got "
                        f"{type(exchange).__name__}")
    try:
        return Exchange(exchange)
    except ValueError:
        raise ValueError(f"exchange must be None (exact), 'bf16' or 'fp16'; got "
                         f"{exchange!r}") from None


def encode(exchange: Exchange, values: np.ndarray, out: np.ndarray) -> None:
    """Round float32 ``values`` (1-d) into the 16-bit words ``out`` (uint16, as long)."""
    if exchange is Exchange.FP16:
        _encode_fp16(values, out)
        return
    bits = values.view(np.uint32)
    size = len(values)
    temp = np.empty(min(CHUNK, size), np.uint32)
    upper = temp.view(np.uint16)[_UPPER::2]  # each rounded word's upper half, in place
    nan = np.empty(len(temp), np.bool_)
    for lo in range(0, size, CHUNK):
        hi = min(lo + CHUNK, size)
        word, t, is_nan = bits[lo:hi], temp[:hi - lo], nan[:hi - lo]
        np.right_shift(word, 16, out=t)
        np.bitwise_and(t, 1, out=t)
        np.add(t, _ROUND, out=t)
        np.add(t, word, out=t)  # (no carry out of 32 bits but from a NaN, mended below)
        out[lo:hi] = upper[:hi - lo]  # (a strided copy: a quarter faster than a shift)
        np.isnan(values[lo:hi], out=is_nan)
        if is_nan.any():
            out[lo:hi][is_nan] = (word[is_nan] >> 16) | _QUIET


def _encode_fp16(values: np.ndarray, out: np.ndarray) -> None:
    """IEEE half rounding on the values' bits, the bits numpy's float16 cast gives (NaN
    payloads included). numpy's cast is scalar code, 3 ns a value here, and 0.1 us for
    each value below the smallest normal half (it raises the underflow flag by an
    underflowing float operation, slow on x86), which is where small gradients lie.

    Normal halves: the 13 dropped bits rounded to nearest even into the kept ones and
    the exponent rebased (a carry out of the largest half makes it infinity); below the
    smallest normal half, the magnitude on the subnormals' grid of 2**-24 (``rint``:
    to nearest even); then the sign, and NaN as numpy writes it."""
    bits = values.view(np.uint32)
    size = len(values)
    length = min(CHUNK, size)
    magnitude = np.empty(length, np.uint32)
    temp = np.empty(length, np.uint32)
    scaled = np.empty(length, np.float32)
    small = np.empty(length, np.bool_)
    lower = temp.view(np.uint16)[1 - _UPPER::2]
    for lo in range(0, size, CHUNK):
        hi = min(lo + CHUNK, size)
        k = hi - lo
        word, mag, t, tiny = bits[lo:hi], magnitude[:k], temp[:k], small[:k]
        np.bitwise_and(word, 0x7FFFFFFF, out=mag)
        np.right_shift(mag, 13, out=t)
        np.bitwise_and(t, 1, out=t)
        np.add(t, mag, out=t)
        np.add(t, _HALF_REBASE, out=t)  # (wraps below the normal halves: replaced next)
        np.right_shift(t, 13, out=t)
        np.minimum(t, _HALF_INFINITY, out=t)
        np.less(mag, _HALF_NORMAL_BITS, out=tiny)
        if tiny.any():
            grid = scaled[:k]
            with np.errstate(over="ignore", invalid="ignore"):  # (the others: discarded)
                np.multiply(mag.view(np.float32), _HALF_GRID, out=grid)  # exact
                np.rint(grid, out=grid)  # 0 to 1024 (1024: the smallest normal half)
                t[...] = np.where(tiny, grid.astype(np.uint32), t)
        np.right_shift(word, 16, out=mag)
        np.bitwise_and(mag, 0x8000, out=mag)
        np.bitwise_or(t, mag, out=t)
        out[lo:hi] = lower[:k]
        np.isnan(values[lo:hi], out=tiny)
        if tiny.any():  # numpy's NaN: the payload's top bits, never zero
            payload = (word[tiny] & 0x7FFFFF) >> 13
            out[lo:hi][tiny] = ((word[tiny] >> 16) & 0x8000) | 0x7C00 | np.maximum(payload, 1)


@functools.cache
def _half_to_float() -> np.ndarray:
    """Every half's float32 value, by its 16 bits: numpy's conversion, made once (a
    lookup costs the same for every value, where numpy's cast of a subnormal half
    takes a loop)."""
    table = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    return table.astype(np.float32)


def fold(exchange: Exchange, out: np.ndarray, words: Sequence[np.ndarray],
         count: int | None) -> None:
    """``out`` (float32, 1-d) = the sum in rank order of ``words`` (each process's 16-bit
    words for these elements, by rank) widened to float32; divided by ``count`` if one
    is given (an average)."""
    size = len(out)
    if exchange is Exchange.FP16:
        table = _half_to_float()
        temp = np.empty(min(CHUNK, size), np.float32)
        for lo in range(0, size, CHUNK):  # (each piece of out stays in the cache)
            hi = min(lo + CHUNK, size)
            piece, widened = out[lo:hi], temp[:hi - lo]
            np.take(table, words[0][lo:hi], out=piece)
            for word in words[1:]:
                np.take(table, word[lo:hi], out=widened)
                np.add(piece, widened, out=piece)
            if count is not None:
                np.true_divide(piece, count, out=piece)
        return
    bits = out.view(np.uint32)
    temp = np.empty(min(CHUNK, size), np.uint32)
    widened = temp.view(np.float32)
    for lo in range(0, size, CHUNK):
        hi = min(lo + CHUNK, size)
        piece = out[lo:hi]
        np.left_shift(words[0][lo:hi], 16, out=bits[lo:hi], dtype=np.uint32)
        t, wide = temp[:hi - lo], widened[:hi - lo]
        for word in words[1:]:
            np.left_shift(word[lo:hi], 16, out=t, dtype=np.uint32)
            np.add(piece, wide, out=piece)
        if count is not None:
            np.true_divide(piece, count, out=piece)
