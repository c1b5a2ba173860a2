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
  cast is used where the half is normal; below that (where small gradients lie) it
  costs about 0.1 us a value on x86, so those are rounded on the subnormals' grid
  here, to the same bits; halves are widened through a table of all 65536.

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
_HALF_NORMAL = np.float32(2.0**-14)  # the smallest normal half
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
    """numpy's float16 cast, but for the magnitudes below the smallest normal half
    (2**-14), which it rounds at about 0.1 us each (it raises the underflow flag with
    an underflowing float operation, slow on x86): small gradients are mostly there.
    Those are rounded here to the subnormal halves' grid of 2**-24 (to nearest, ties to
    even, as ``rint``), the same bits."""
    halves = out.view(np.float16)
    bits = values.view(np.uint32)
    size = len(values)
    length = min(CHUNK, size)
    magnitude = np.empty(length, np.float32)
    small = np.empty(length, np.bool_)
    kept = np.empty(length, np.float32)
    grid = np.empty(length, np.uint32)
    sign = np.empty(length, np.uint32)
    for lo in range(0, size, CHUNK):
        hi = min(lo + CHUNK, size)
        k = hi - lo
        value, mag, tiny = values[lo:hi], magnitude[:k], small[:k]
        np.absolute(value, out=mag)
        np.less(mag, _HALF_NORMAL, out=tiny)
        with np.errstate(over="ignore"):  # beyond 65504: infinity, as documented
            if not tiny.any():
                np.copyto(halves[lo:hi], value, casting="same_kind")
                continue
            np.copyto(kept[:k], value)
            np.copyto(kept[:k], 0.0, where=tiny)
            np.copyto(halves[lo:hi], kept[:k], casting="same_kind")
        # (only where tiny: the others may be infinite or NaN, and are numpy's already)
        np.multiply(mag, _HALF_GRID, out=mag, where=tiny)  # exact: a power of two
        np.rint(mag, out=mag, where=tiny)  # 0 to 1024 (1024: the smallest normal half)
        units, signs = grid[:k], sign[:k]
        np.copyto(units, mag, casting="unsafe", where=tiny)
        np.right_shift(bits[lo:hi], 16, out=signs)
        np.bitwise_and(signs, 0x8000, out=signs)
        np.bitwise_or(units, signs, out=units)
        np.copyto(out[lo:hi], units, where=tiny, casting="unsafe")


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
