"""Unit tests for synkhronos._runtime.lowprec: the 16-bit formats of a low-precision
exchange, against ml_dtypes' bfloat16 (which the test extra brings with jax) and numpy's
float16, on every kind of float32: ties, NaNs, infinities, subnormals, overflow."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from synkhronos._runtime.lowprec import CHUNK, Exchange, encode, fold, parse_exchange

# Bit patterns where rounding is decided: ties to even both ways, the largest finite
# values (overflow to infinity), NaNs whose payload lies only in the bits dropped (a
# careless rounding makes them infinities, or carries them over into zero or -0).
SPECIAL = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF,
    0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0xBF808000, 0xBF818000,
    0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF, 0x477FEFFF, 0x477FF000,
    0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F807FFF,
    0x7FFFFFFF, 0xFF800001, 0xFFFFFFFF, 0x33800000, 0x33000000,
], dtype=np.uint32)
NUMPY_OF = {Exchange.BF16: ml_dtypes.bfloat16, Exchange.FP16: np.float16}


def _patterns(count: int, seed: int) -> np.ndarray:
    random = np.random.default_rng(seed).integers(0, 2**32, count, dtype=np.uint64)
    return np.concatenate([SPECIAL, random.astype(np.uint32)]).view(np.float32)


def _encoded(exchange: Exchange, values: np.ndarray) -> np.ndarray:
    out = np.full(len(values), 0xDEAD, np.uint16)
    encode(exchange, values, out)
    return out


def _widened(exchange: Exchange, words: np.ndarray) -> np.ndarray:
    return words.view(NUMPY_OF[exchange]).astype(np.float32)


@pytest.mark.parametrize("exchange", list(Exchange))
def test_encode_rounds_to_nearest_even_as_the_reference(exchange):
    values = _patterns(3 * CHUNK + 17, 1)  # several pieces of the bf16 kernel, one partial
    got = _encoded(exchange, values)
    with np.errstate(over="ignore", invalid="ignore"):
        want = values.astype(NUMPY_OF[exchange]).view(np.uint16)
    number = ~np.isnan(values)
    assert np.array_equal(got[number], want[number])
    back = _widened(exchange, got)
    assert np.isnan(back[~number]).all()  # NaN stays NaN (never an infinity or a zero)
    assert np.array_equal(np.signbit(back[~number]), np.signbit(values[~number]))


def test_fp16_rounds_small_magnitudes_as_numpy():
    """Below the smallest normal half (where gradients lie, and where this module rounds
    on its own rather than through numpy's slow cast): numpy's bits, ties included."""
    rng = np.random.default_rng(3)
    magnitudes = 10.0 ** rng.uniform(-10, -3, CHUNK + 100)
    values = (magnitudes * rng.choice([-1, 1], len(magnitudes))).astype(np.float32)
    ties = (np.arange(-2048, 2049) * 2.0**-25).astype(np.float32)  # halfway points too
    special = np.array([np.nan, np.inf, -7e4, 6e-8, 3e-8], np.float32)
    for chunk in (values, ties, np.concatenate([values, special])):
        with np.errstate(over="ignore"):
            want = chunk.astype(np.float16).view(np.uint16)
        assert np.array_equal(_encoded(Exchange.FP16, chunk), want)


def test_bf16_overflow_and_ties_by_hand():
    values = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x7F7F7FFF],
                      np.uint32).view(np.float32)
    assert _encoded(Exchange.BF16, values).tolist() == [0x3F80, 0x3F82, 0x7F80, 0x7F7F]


def test_encode_reads_a_strided_view_and_leaves_it_alone():
    base = np.random.default_rng(2).standard_normal(2 * CHUNK + 6).astype(np.float32)
    values = base[::2]
    kept = base.copy()
    for exchange in Exchange:
        assert np.array_equal(_encoded(exchange, values),
                              values.astype(NUMPY_OF[exchange]).view(np.uint16))
    assert np.array_equal(base, kept)


@pytest.mark.parametrize("exchange", list(Exchange))
@pytest.mark.parametrize("count", [None, 3])
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_fold_is_numpys_rank_order_float32_sum_of_the_rounded_values(exchange, count,
                                                                     ranks):
    rng = np.random.default_rng(ranks)
    size = CHUNK + 999
    values = [(rng.standard_normal(size) * 10.0 ** rng.integers(-3, 3, size))
              .astype(np.float32) for _ in range(ranks)]
    words = [_encoded(exchange, v) for v in values]
    out = np.full(size, np.nan, np.float32)
    fold(exchange, out, words, count)
    rounded = [v.astype(NUMPY_OF[exchange]).astype(np.float32) for v in values]
    want = rounded[0].copy()
    for value in rounded[1:]:
        want += value
    if count is not None:
        want /= np.float32(count)
    assert out.dtype == np.float32 and np.array_equal(out, want)


def test_fold_of_nothing_and_of_a_nan():
    for exchange in Exchange:
        fold(exchange, np.empty(0, np.float32), [np.empty(0, np.uint16)] * 2, 2)
        words = [_encoded(exchange, np.array([np.nan, 1.0], np.float32)),
                 _encoded(exchange, np.array([1.0, 2.0], np.float32))]
        out = np.empty(2, np.float32)
        fold(exchange, out, words, None)
        assert np.isnan(out[0]) and out[1] == 3.0


def test_parse_exchange():
    assert parse_exchange(None) is None
    assert parse_exchange("bf16") is Exchange.BF16
    assert parse_exchange("fp16") is Exchange.FP16
    assert parse_exchange(Exchange.FP16) is Exchange.FP16
    with pytest.raises(ValueError, match=r"exchange must be None \(exact\), 'bf16' or "
                       r"'fp16'; got 'int8'"):
        parse_exchange("int8")
    with pytest.raises(ValueError, match="got 'BF16'"):
        parse_exchange("BF16")
    with pytest.raises(TypeError, match="exchange must be None, 'bf16' or 'fp16'; got int"):
        parse_exchange(16)
