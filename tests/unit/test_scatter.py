"""Unit tests for synkhronos._scatter: splitting rule and batch / batch_s validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synkhronos._scatter import (
    Batch,
    normalize_batch,
    normalize_batch_s,
    normalize_shares,
    offsets,
    part_bounds,
    split_bounds,
    split_counts,
    weighted_counts,
)

FAST = settings(max_examples=200, deadline=None)
lengths = st.integers(min_value=0, max_value=10_000)
part_counts = st.integers(min_value=1, max_value=64)


# ---------------------------------------------------------------- splitting rule


def test_split_counts_examples():
    assert split_counts(10, 3) == [4, 3, 3]
    assert split_counts(11, 3) == [4, 4, 3]
    assert split_counts(2, 4) == [1, 1, 0, 0]
    assert split_counts(0, 2) == [0, 0]
    assert split_counts(5, 1) == [5]
    assert split_counts(np.int64(7), np.int32(2)) == [4, 3]


def test_split_bounds_examples():
    assert split_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_bounds(1, 3) == [(0, 1), (1, 1), (1, 1)]


@FAST
@given(lengths, part_counts)
def test_split_bounds_tile_evenly(length, parts):
    bounds = split_bounds(length, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    for (_, stop), (start, _) in zip(bounds, bounds[1:], strict=False):
        assert stop == start
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)
    assert sizes == split_counts(length, parts)
    assert all(isinstance(x, int) for pair in bounds for x in pair)


@FAST
@given(lengths, part_counts, st.data())
def test_part_bounds_matches_split_bounds(length, parts, data):
    index = data.draw(st.integers(min_value=0, max_value=parts - 1))
    assert part_bounds(length, parts, index) == split_bounds(length, parts)[index]


def test_part_bounds_large_is_constant_time():
    assert part_bounds(10**15, 10**9, 10**9 - 1) == (10**15 - 10**6, 10**15)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: split_counts(-1, 2), ValueError, r"length must be an integer >= 0; got -1"),
        (lambda: split_counts(3, 0), ValueError, r"parts must be an integer >= 1; got 0"),
        (lambda: split_counts(3.0, 2), TypeError, r"length must be .*; got float"),
        (lambda: split_counts(3, True), TypeError, r"parts must be .*; got bool"),
        (lambda: split_bounds(3, "2"), TypeError, r"parts must be .*; got str"),
        (lambda: part_bounds(3, 2, 2), ValueError, r"index must be in 0\.\.1 for 2 parts; got 2"),
        (lambda: part_bounds(3, 2, -1), ValueError, r"index must be an integer >= 0; got -1"),
        (lambda: split_bounds(-2, 1), ValueError, r"length must be an integer >= 0; got -2"),
    ],
)
def test_split_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_a_process_rows_in_slices_split_by_the_same_rule():
    assert split_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split_bounds(0, 2) == [(0, 0), (0, 0)]
    assert split_bounds(5, np.int64(1)) == [(0, 5)]


# ---------------------------------------------------------------- Batch


def test_batch_range_part():
    b = Batch(10, 20)
    assert b.is_range and b.length == 10
    assert b.part(3, 0) == Batch(10, 14)
    assert b.part(3, 2) == Batch(17, 20)


def test_batch_indices_part_is_view():
    idx = np.arange(10, dtype=np.int64)
    b = Batch(indices=idx)
    p = b.part(3, 1)
    assert not p.is_range and p.length == 3
    assert np.shares_memory(p.indices, idx)
    np.testing.assert_array_equal(p.indices, [4, 5, 6])


def test_batch_equality_and_repr():
    assert Batch(0, 3) == Batch(0, 3)
    assert Batch(0, 3) != Batch(0, 4)
    assert Batch(indices=np.array([1, 2])) == Batch(indices=np.array([1, 2]))
    assert Batch(0, 2) != Batch(indices=np.array([0, 1]))
    assert Batch(0, 2) != (0, 2)
    assert "start=0" in repr(Batch(0, 2)) and "indices" in repr(Batch(indices=np.arange(2)))


@FAST
@given(st.one_of(
    st.tuples(st.integers(0, 500), st.integers(0, 500)).map(
        lambda t: Batch(min(t), max(t))),
    st.lists(st.integers(0, 1000), max_size=300).map(
        lambda xs: Batch(indices=np.array(xs, dtype=np.int64))),
), part_counts)
def test_batch_parts_concatenate_to_whole(batch, parts):
    pieces = [batch.part(parts, i) for i in range(parts)]
    assert sum(p.length for p in pieces) == batch.length
    if batch.is_range:
        rows = np.concatenate([np.arange(p.start, p.stop) for p in pieces])
        np.testing.assert_array_equal(rows, np.arange(batch.start, batch.stop))
    else:
        np.testing.assert_array_equal(np.concatenate([p.indices for p in pieces]),
                                      batch.indices)
    sizes = [p.length for p in pieces]
    assert sizes == split_counts(batch.length, parts)


# ---------------------------------------------------------------- normalize_batch


def test_normalize_batch_none_and_int():
    assert normalize_batch(None, 7) == Batch(0, 7)
    assert normalize_batch(3, 7) == Batch(0, 3)
    assert normalize_batch(0, 7) == Batch(0, 0)
    assert normalize_batch(np.int32(7), 7) == Batch(0, 7)


@FAST
@given(st.integers(0, 50), st.one_of(st.none(), st.integers(-60, 60)),
       st.one_of(st.none(), st.integers(-60, 60)), st.sampled_from([None, 1]))
def test_normalize_batch_slice_matches_python(length, start, stop, step):
    b = normalize_batch(slice(start, stop, step), length)
    assert b.is_range
    assert list(range(b.start, b.stop)) == list(range(length))[start:stop]


def test_normalize_batch_slice_numpy_ends():
    assert normalize_batch(slice(np.int64(2), np.int8(-1)), 10) == Batch(2, 9)


def test_normalize_batch_indices():
    b = normalize_batch([0, -1, 3, 3], 5)
    assert b.indices.dtype == np.int64 and b.indices.flags.c_contiguous
    np.testing.assert_array_equal(b.indices, [0, 4, 3, 3])
    assert not b.indices.flags.writeable
    src = np.array([4, 2, -5, 0, 1, 9], dtype=np.int16)[::2]
    b = normalize_batch(src, 5)
    np.testing.assert_array_equal(b.indices, [4, 0, 1])
    assert b.indices.dtype == np.int64 and b.indices.flags.c_contiguous
    np.testing.assert_array_equal(src, [4, -5, 1])  # caller's array untouched
    np.testing.assert_array_equal(normalize_batch((np.uint8(1), 2), 3).indices, [1, 2])
    np.testing.assert_array_equal(normalize_batch(np.array([2], np.uint64), 3).indices, [2])


@pytest.mark.parametrize("empty", [[], (), np.array([], dtype=np.int32)])
def test_normalize_batch_empty_indices(empty):
    b = normalize_batch(empty, 4)
    assert b.length == 0 and b.indices.dtype == np.int64
    assert normalize_batch(empty, 0).length == 0


@FAST
@given(st.integers(1, 200).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(-n, n - 1), max_size=100))))
def test_normalize_batch_indices_select_like_numpy(args):
    length, idx = args
    data = np.arange(length) * 10
    b = normalize_batch(idx, length)
    assert (b.indices >= 0).all()
    np.testing.assert_array_equal(data[b.indices], data[np.array(idx, dtype=np.int64)])


@pytest.mark.parametrize(
    ("batch", "length", "exc", "match"),
    [
        (1001, 1000, ValueError, r"batch row count 1001 is out of range for 1000 rows"),
        (-1, 10, ValueError, r"batch row count -1 is out of range for 10 rows \(valid: 0\.\.10\)"),
        (True, 10, TypeError, r"got bool"),
        (np.True_, 10, TypeError, r"got bool"),
        (slice(0, 4, 2), 10, ValueError, r"only step 1 is supported.*got 2"),
        (slice(None, None, -1), 10, ValueError, r"only step 1 is supported"),
        (slice(0.5, 4), 10, TypeError, r"start and stop must be integers or None; got float"),
        (slice(0, "3"), 10, TypeError, r"got str"),
        ([1000], 1000, ValueError,
         r"^batch index 1000 is out of range for 1000 rows \(valid: -1000\.\.999\)$"),
        ([0, -6], 5, ValueError, r"batch index -6 is out of range for 5 rows \(valid: -5\.\.4\)"),
        ([0], 0, ValueError, r"index 0 is out of range for 0 rows \(no rows to index\)"),
        (np.array([7], dtype=np.uint32), 5, ValueError, r"index 7 is out of range"),
        ([1.0, 2.0], 5, TypeError, r"must hold integers; got dtype float64"),
        (np.array([1, 0], dtype=bool), 5, TypeError, r"must hold integers; got dtype bool"),
        ([True], 5, TypeError, r"got dtype bool"),
        (["a"], 5, TypeError, r"must hold integers"),
        ([[0, 1]], 5, ValueError, r"must be 1-d; got 2-d with shape \(1, 2\)"),
        (np.array(3), 5, ValueError, r"must be 1-d; got 0-d"),
        ([[0], [1, 2]], 5, ValueError, r"must be 1-d; got a ragged"),
        (2.0, 5, TypeError, r"batch must be None, an int, a slice .*; got float"),
        ("0:3", 5, TypeError, r"got str"),
        (range(3), 5, TypeError, r"got range"),
    ],
)
def test_normalize_batch_errors(batch, length, exc, match):
    with pytest.raises(exc, match=match):
        normalize_batch(batch, length)


def test_normalize_batch_bad_length():
    with pytest.raises(ValueError, match=r"length must be an integer >= 0; got -1"):
        normalize_batch(None, -1)


# ---------------------------------------------------------------- normalize_batch_s


def test_batch_s_none():
    assert normalize_batch_s(None, 3, [4, 4, 3]) == [None, None, None]


def test_batch_s_shared_slice_and_indices():
    assert normalize_batch_s(slice(1, None), 2, [4, 3]) == [Batch(1, 4), Batch(1, 3)]
    out = normalize_batch_s([0, -1], 2, [4, 3])
    np.testing.assert_array_equal(out[0].indices, [0, 3])
    np.testing.assert_array_equal(out[1].indices, [0, 2])
    out = normalize_batch_s(np.array([1]), 2, [4, 3])
    assert [b.length for b in out] == [1, 1]
    out = normalize_batch_s((np.int64(2),), 1, [3])
    np.testing.assert_array_equal(out[0].indices, [2])
    assert [b.length for b in normalize_batch_s([], 2, [1, 1])] == [0, 0]


def test_batch_s_per_process():
    out = normalize_batch_s([slice(0, 2), [1, -1], np.array([0]), None], 4, [3, 3, 2, 2])
    assert out[0] == Batch(0, 2)
    np.testing.assert_array_equal(out[1].indices, [1, 2])
    np.testing.assert_array_equal(out[2].indices, [0])
    assert out[3] is None
    out = normalize_batch_s((slice(None), slice(-1, None)), 2, [5, 4])
    assert out == [Batch(0, 5), Batch(3, 4)]


@pytest.mark.parametrize(
    ("batch_s", "parts", "lengths", "exc", "match"),
    [
        ([slice(0, 1)] * 3, 2, [3, 3], ValueError,
         r"^batch_s has 3 selections but there are 2 processes$"),
        ([[0], [1]], 3, [3, 3, 3], ValueError, r"batch_s has 2 selections but there are 3"),
        ([[0], [0], [7]], 3, [5, 5, 5], ValueError,
         r"^batch_s for rank 2: index 7 is out of range for 5 rows \(valid: -5\.\.4\)$"),
        ([3, 1], 2, [5, 2], ValueError, r"batch_s for rank 1: index 3 is out of range for 2 rows"),
        (slice(0, 3, 3), 2, [5, 5], ValueError, r"batch_s for rank 0: .*only step 1"),
        ([slice(0, 1), [0.5]], 2, [5, 5], TypeError, r"batch_s for rank 1: .*got dtype float64"),
        ([slice(0, 1), 3], 2, [5, 5], TypeError, r"mix of both"),
        ([slice(0, 1), "x"], 2, [5, 5], TypeError,
         r"batch_s for rank 1: expected a slice, a 1-d index list or None; got str"),
        (3, 2, [5, 5], TypeError, r"batch_s must be None, a slice.*; got int"),
        ({0: 1}, 2, [5, 5], TypeError, r"got dict"),
        (np.zeros((2, 2), dtype=int), 2, [5, 5], ValueError, r"rank 0: index array must be 1-d"),
        (None, 2, [5], ValueError, r"lengths must have one entry per process \(2\); got 1"),
        (None, 0, [], ValueError, r"parts must be an integer >= 1; got 0"),
        (None, 2, [1, -3], ValueError, r"lengths\[1\] must be an integer >= 0; got -3"),
    ],
)
def test_batch_s_errors(batch_s, parts, lengths, exc, match):
    with pytest.raises(exc, match=match):
        normalize_batch_s(batch_s, parts, lengths)


@FAST
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.data())
def test_batch_s_per_process_property(lengths, data):
    sels = [data.draw(st.lists(st.integers(-n, n - 1), max_size=10)) if n else []
            for n in lengths]
    out = normalize_batch_s(sels, len(lengths), lengths)
    for sel, b, n in zip(sels, out, lengths, strict=True):
        expected = [i % n for i in sel] if n else []
        np.testing.assert_array_equal(b.indices, np.array(expected, dtype=np.int64))


# ---------------------------------------------------------------- weighted split (shares)


def test_weighted_counts_examples():
    assert weighted_counts(10, (1.0, 1.0, 1.0)) == [4, 3, 3]
    assert weighted_counts(10, (3.0, 1.0)) == [8, 2]  # 7.5 / 2.5: the tie to rank 0
    assert weighted_counts(512, (1.08, 1.0)) == [266, 246]
    assert weighted_counts(6, (5.0, 1.0, 0.001)) == [4, 1, 1]  # at least one row each
    assert weighted_counts(2, (1.0, 1.0, 1.0)) == [1, 1, 0]  # fewer rows than parts
    assert weighted_counts(0, (2.0, 1.0)) == [0, 0]
    assert weighted_counts(7, (4, 3)) == [4, 3]  # row counts given as shares: kept


@FAST
@given(lengths, st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=16))
def test_weighted_counts_sum_and_follow_the_shares(length, shares):
    shares = tuple(shares)
    counts = weighted_counts(length, shares)
    assert sum(counts) == length
    assert all(isinstance(c, int) and c >= 0 for c in counts)
    if length >= len(shares):
        assert min(counts) >= 1
    exact = [length * s / sum(shares) for s in shares]
    moved = [abs(c - e) for c, e in zip(counts, exact, strict=True)]
    # largest remainders are within one row of the exact share, unless rows were moved
    # to give every part one (each such move takes one row from the largest part)
    assert max(moved) < 1 + len(shares)


@FAST
@given(lengths, part_counts)
def test_equal_shares_are_the_even_split(length, parts):
    assert weighted_counts(length, (2.5,) * parts) == split_counts(length, parts)


@FAST
@given(st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=12))
def test_row_counts_given_as_shares_are_kept(counts):
    if sum(counts) == 0 or 0 in counts:
        return  # shares must be positive
    assert weighted_counts(sum(counts), tuple(counts)) == counts


def test_offsets():
    assert offsets([4, 3, 3]) == (0, 4, 7, 10)
    assert offsets([]) == (0,)


def test_normalize_shares_accepts_and_refuses():
    assert normalize_shares(None, 2) is None
    assert normalize_shares([2, 1], 2) == (2.0, 1.0)
    assert normalize_shares(np.array([0.5, 0.25, 0.25]), 3) == (0.5, 0.25, 0.25)
    with pytest.raises(ValueError, match="shares has 3 numbers but there are 2 processes"):
        normalize_shares([1, 1, 1], 2)
    with pytest.raises(ValueError, match="finite and positive; got 0.0 for process 1"):
        normalize_shares([1, 0], 2)
    with pytest.raises(ValueError, match="finite and positive; got nan for process 0"):
        normalize_shares([float("nan"), 1], 2)
    with pytest.raises(ValueError, match="finite and positive; got -1.0"):
        normalize_shares([1, -1], 2)
    with pytest.raises(TypeError, match="shares must be a sequence of 2 positive numbers"):
        normalize_shares(1.5, 2)
    with pytest.raises(TypeError, match="shares must be a sequence"):
        normalize_shares("ab", 2)
    with pytest.raises(TypeError, match="1-d sequence of real numbers"):
        normalize_shares(["a", "b"], 2)
    with pytest.raises(TypeError, match="1-d sequence of real numbers"):
        normalize_shares([[1, 2], [3, 4]], 2)
