"""Unit tests for synkhronos._reducers: op parsing, Accumulator, in-place kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synkhronos._reducers import (
    Accumulator,
    ReduceOp,
    combine_into,
    combined,
    parse_op,
    reduce_pairs,
    reduce_values,
    ufunc_of,
)
from synkhronos._scatter import split_bounds
from synkhronos.collectives.backend import column

FAST = settings(max_examples=200, deadline=None)


# ---------------------------------------------------------------- parse_op


@pytest.mark.parametrize("op", list(ReduceOp))
def test_parse_op_strings_and_members(op):
    assert parse_op(op.value) is op
    assert parse_op(op) is op
    assert parse_op(op.value.upper()) is op


def test_parse_op_none_is_no_reduction_and_c_ops_are_aliases():
    assert parse_op(None) is ReduceOp.NONE
    for name in ("avg", "sum", "prod", "max", "min", "gather"):
        assert parse_op("c_" + name) is ReduceOp(name)
    with pytest.raises(ValueError, match="gather and None are for function outputs"):
        parse_op(None, allow_gather=False)


@pytest.mark.parametrize(
    ("op", "kwargs", "exc", "match"),
    [
        ("mean", {}, ValueError, r"one of avg, sum, prod, max, min, gather or None; got 'mean'"),
        ("mean", {"allow_gather": False}, ValueError, r"one of avg, sum, prod, max, min; got"),
        ("gather", {"allow_gather": False}, ValueError, r"function outputs\); got 'gather'"),
        (ReduceOp.GATHER, {"allow_gather": False}, ValueError, r"are for function outputs"),
        (None, {"allow_gather": False}, ValueError, r"gather and None are for function.*got None"),
        (3, {}, TypeError, r"op must be a string, a ReduceOp or None; got int"),
        (np.add, {}, TypeError, r"got ufunc"),
    ],
)
def test_parse_op_errors(op, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        parse_op(op, **kwargs)


# ---------------------------------------------------------------- Accumulator


def test_empty_accumulator():
    acc = Accumulator("sum")
    assert acc.result() is None and acc.total_weight == 0 and acc.count == 0
    assert acc.op is ReduceOp.SUM
    assert reduce_values(ReduceOp.MAX, [], []) is None


@pytest.mark.parametrize(
    ("op", "expected"),
    [("sum", [5, 7, 3]), ("prod", [4, 10, 0]), ("max", [4, 5, 3]), ("min", [1, 2, 0])],
)
def test_elementwise_ops_keep_dtype(op, expected):
    a = np.array([1, 5, 0], dtype=np.int32)
    b = np.array([4, 2, 3], dtype=np.int32)
    out = reduce_values(op, [a, b], [3, 1])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(a, [1, 5, 0])  # inputs untouched
    np.testing.assert_array_equal(b, [4, 2, 3])
    assert not np.shares_memory(out, a)


def test_elementwise_result_dtype_is_first_values():
    out = reduce_values("sum", [np.float32(1.5), 2.25], [1, 1])
    assert out.dtype == np.float32 and out.shape == () and out == 3.75


def test_result_then_add_does_not_change_returned_array():
    acc = Accumulator("sum")
    acc.add(np.ones(3), 1)
    first = acc.result()
    acc.add(np.ones(3), 1)
    np.testing.assert_array_equal(first, [1, 1, 1])
    np.testing.assert_array_equal(acc.result(), [2, 2, 2])


def test_readonly_input_is_fine():
    a = np.arange(3.0)
    a.flags.writeable = False
    out = reduce_values("sum", [a, a], [1, 1])
    np.testing.assert_array_equal(out, [0, 2, 4])


def test_avg_weighted_and_dtypes():
    out = reduce_values("avg", [np.float32(1.0), np.float32(4.0)], [2, 1])
    assert out.dtype == np.float32 and out.shape == ()
    assert out == pytest.approx(2.0)
    out = reduce_values("avg", [np.array([1, 2]), np.array([3, 5])], [1, 3])
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [2.5, 4.25])
    out = reduce_values("avg", [True, False, True], [1, 1, 2])
    assert out.dtype == np.float64 and out == pytest.approx(0.75)
    out = reduce_values("avg", [1.0 + 2j, np.complex64(3.0)], [1, 1])
    assert out.dtype == np.complex128 and out == pytest.approx(2.0 + 1j)
    out = reduce_values("avg", [np.float32(1.0), 1j], [1, 1])
    assert out.dtype == np.complex64 and out == pytest.approx(0.5 + 0.5j)


def test_avg_does_not_overflow_integers():
    big = np.array([2**62], dtype=np.int64)
    out = reduce_values("avg", [big, big], [3, 5])
    np.testing.assert_allclose(out, [2.0**62])


def test_avg_zero_weights():
    assert reduce_values("avg", [1.0, 3.0], [0, 0]) == pytest.approx(2.0)
    assert reduce_values("avg", [100.0, 1.0, 3.0], [0, 1, 1]) == pytest.approx(2.0)
    assert reduce_values("avg", [1.0, 100.0, 3.0], [1, 0, 3]) == pytest.approx(2.5)
    acc = Accumulator(ReduceOp.AVG)
    acc.add(np.array([2.0, 4.0]), 0)
    assert acc.total_weight == 0
    np.testing.assert_allclose(acc.result(), [2.0, 4.0])


def test_result_can_be_read_twice():
    acc = Accumulator("avg")
    acc.add(np.array([1.0, 3.0]), 1)
    acc.add(np.array([3.0, 5.0]), 1)
    np.testing.assert_allclose(acc.result(), [2.0, 4.0])
    np.testing.assert_allclose(acc.result(), [2.0, 4.0])
    assert acc.total_weight == 2 and acc.count == 2


@FAST
@given(st.integers(1, 300), st.integers(1, 16), st.integers(0, 2**31 - 1))
def test_weighted_avg_of_parts_is_mean_of_whole(rows, parts, seed):
    data = np.random.default_rng(seed).standard_normal((rows, 3))
    acc = Accumulator("avg")
    for start, stop in split_bounds(rows, parts):
        piece = data[start:stop]
        acc.add(piece.mean(axis=0) if stop > start else np.zeros(3), stop - start)
    assert acc.total_weight == rows
    np.testing.assert_allclose(acc.result(), data.mean(axis=0), rtol=1e-10, atol=1e-12)


@FAST
@given(st.lists(st.lists(st.integers(-1000, 1000), max_size=6), min_size=1, max_size=8))
def test_gather_preserves_order(chunks):
    values = [np.array(c, dtype=np.int64) for c in chunks]
    out = reduce_values("gather", values, [len(c) for c in chunks])
    np.testing.assert_array_equal(out, np.array(sum(chunks, []), dtype=np.int64))


def test_gather_scalars_and_rows():
    out = reduce_values("gather", [1.5, np.float64(2.5), np.array(3.5)], [1, 1, 1])
    assert out.shape == (3,)
    np.testing.assert_array_equal(out, [1.5, 2.5, 3.5])
    a = np.arange(6).reshape(3, 2)
    out = reduce_values("gather", [a, a[:1]], [3, 1])
    assert out.shape == (4, 2)
    a[0, 0] = 99  # gathered values are copies
    assert out[0, 0] == 0 and out[3, 0] == 0


@FAST
@given(st.sampled_from(["sum", "prod", "max", "min"]),
       st.lists(st.lists(st.integers(-5, 5), min_size=4, max_size=4), min_size=1, max_size=6))
def test_elementwise_ops_match_numpy(op, rows):
    values = [np.array(r, dtype=np.int64) for r in rows]
    expected = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](
        np.stack(values), axis=0)
    np.testing.assert_array_equal(reduce_values(op, values, [1] * len(values)), expected)


@pytest.mark.parametrize(
    ("op", "values", "weights", "exc", "match"),
    [
        ("sum", [np.zeros(2), np.zeros(3)], [1, 1], ValueError,
         r"value shape \(3,\) does not match the first value's shape \(2,\)"),
        ("avg", [np.zeros(2), 1.0], [1, 1], ValueError, r"value shape \(\) does not match"),
        ("gather", [np.zeros((2, 2)), np.zeros((2, 3))], [1, 1], ValueError,
         r"value shape \(2, 3\) cannot be gathered with the first value's shape \(2, 2\)"),
        ("gather", [1.0, np.zeros(2)], [1, 1], ValueError, r"cannot be gathered"),
        ("sum", [1.0], [-1], ValueError, r"weight must be a non-negative integer; got -1"),
        ("sum", [1.0], [1.0], TypeError, r"weight must be a non-negative integer; got float"),
        ("sum", [1.0], [True], TypeError, r"got bool"),
        ("avg", [np.array(["a"])], [1], TypeError, r"op 'avg' needs numeric values; got dtype"),
        ("sum", [1.0, 2.0], [1], ValueError,
         r"weights must have one entry per value \(2\); got 1"),
        ("median", [1.0], [1], ValueError, r"op must be one of"),
    ],
)
def test_accumulator_errors(op, values, weights, exc, match):
    with pytest.raises(exc, match=match):
        reduce_values(op, values, weights)


# ---------------------------------------------------------------- the collectives' kernels


@pytest.mark.parametrize(
    ("op", "func"),
    [("sum", np.sum), ("prod", np.prod), ("max", np.max), ("min", np.min), ("avg", np.mean)],
)
def test_combined_and_combine_into_match_numpy(op, func):
    rng = np.random.default_rng(0)
    sources = [rng.standard_normal((5, 4)) for _ in range(4)]
    copies = [s.copy() for s in sources]
    out = np.empty((5, 4))
    combine_into(out, sources[0], sources[1:], ReduceOp(op))
    np.testing.assert_allclose(out, func(np.stack(copies), axis=0))
    np.testing.assert_allclose(combined(np.stack(sources), ReduceOp(op)), out)
    for s, c in zip(sources, copies, strict=True):
        np.testing.assert_array_equal(s, c)


@pytest.mark.parametrize(("op", "dtype"), [  # (an integer avg is refused before any kernel)
    (op, dtype) for op in ("sum", "prod", "max", "min", "avg")
    for dtype in ("f8", "f4", "i4", "u1", "c8") if not (op == "avg" and dtype[0] in "iu")])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
@pytest.mark.parametrize("count", [1, 2, 3, 8, 9])
def test_combined_of_a_column_equals_a_call_per_view(op, dtype, shape, count):
    """A group's column (one variable in every slot of a segment, the slots a stride
    apart: ``backend.column``) combines in one ``ufunc.reduce`` to what a call per view
    gives (``combine_into``): the dtype kept (integers wrap as those calls wrap), the
    shape, and the values; at 8 values or more numpy sums by pairs, so floats may
    differ in the last bits, nothing more. The column stays a view."""
    size = int(np.prod(shape))
    stride = 40  # elements between slots, as a segment's pages are
    rng = np.random.default_rng(count)
    flat = (rng.standard_normal(count * stride) * 3).astype(dtype)
    views = [flat[k * stride:k * stride + size].reshape(shape) for k in range(count)]
    stack = column(views)
    assert stack.shape == (count, *shape) and np.shares_memory(stack, flat)
    got, want = combined(stack, ReduceOp(op)), np.empty(shape, dtype)
    combine_into(want, views[0], views[1:], ReduceOp(op))  # a call per value
    assert got.dtype == want.dtype == np.dtype(dtype) and got.shape == shape
    if np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype in ("f4", "c8") else 1e-12)
    flat[:] = 1  # a view: it sees the slots change
    np.testing.assert_array_equal(combined(stack, ReduceOp.MAX), np.ones(shape, dtype))


def test_a_column_needs_slots_one_stride_apart():
    flat = np.zeros(100)
    with pytest.raises(ValueError, match="one stride apart"):
        column([flat[0:2], flat[10:12], flat[30:32]])


def test_combine_into_aliasing_first_source():
    a = np.array([1.0, 2.0])
    b = np.array([3.0, 6.0])
    combine_into(a, a, [b], ReduceOp.AVG)
    np.testing.assert_array_equal(a, [2.0, 4.0])
    x = np.array([1, 2], dtype=np.int32)
    y = x.copy()
    combine_into(x, x, [y, y], ReduceOp.SUM)
    np.testing.assert_array_equal(x, [3, 6])
    assert x.dtype == np.int32


def test_combine_into_single_source_and_scalar_shape():
    out = np.zeros(3, dtype=np.float32)
    combine_into(out, np.arange(3, dtype=np.float32), [], ReduceOp.AVG)
    np.testing.assert_array_equal(out, [0, 1, 2])
    out = np.zeros((), dtype=np.complex64)
    combine_into(out, np.array(1 + 1j, np.complex64), [np.array(3j, np.complex64)],
                 ReduceOp.AVG)
    assert out == pytest.approx(0.5 + 2j)
    ufunc, mean = ufunc_of(ReduceOp.AVG)
    assert ufunc is np.add and mean


# ---------------------------------------------------------------- reduce_values' fast path


@pytest.mark.parametrize("dtype", ["f8", "f4", "i4", "i8", "u1", "?", "c16", "c8"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
@pytest.mark.parametrize("weights", [[1, 2, 3], [5, 1, 1], [1, 1, 1], [2, 7, 1], [4]])
def test_reduce_values_equals_the_accumulator_bit_for_bit(dtype, shape, weights):
    """Same-dtype arrays with positive weights take a shortcut: it must change nothing."""
    rng = np.random.default_rng(len(weights) + len(shape))
    values = [(rng.normal(size=shape) * 9).astype(dtype) for _ in weights]
    for op in ReduceOp:
        if op is ReduceOp.GATHER:
            continue
        acc = Accumulator(op)
        for value, weight in zip(values, weights, strict=True):
            acc.add(value, weight)
        want = acc.result()
        got = reduce_values(op, values, weights)
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert all(v is not got for v in values)  # never an input handed back


_PAIRS = [
    (np.arange(3.0), np.full(3, 2.5)),  # the common case: same dtype and shape
    (np.float32(1.5) * np.ones((2, 2), "f4"), np.ones((2, 2), "f4")),
    (np.array(2.0), np.array(3.5)),  # 0-d
    (np.array([1, 2], "i4"), np.array([3, 5], "i4")),
    (np.array([True, False]), np.array([True, True])),
    (np.array([1 + 2j]), np.array([3 - 1j])),
    (np.arange(3.0), np.arange(3, dtype="f4")),  # dtypes differ: the general path
    (np.arange(3.0), np.arange(4.0)),  # shapes differ: the general path raises
    (np.float64(1.5), 2.0),  # not arrays
]


@pytest.mark.parametrize("pair", range(len(_PAIRS)))
@pytest.mark.parametrize("weights", [(1, 1), (3, 2), (0, 4), (2, 0)])
def test_reduce_pairs_equals_reduce_values_bit_for_bit(pair, weights):
    """Two replies (n=2) take their own shortcut: it must change nothing, one output or
    several with different ops."""
    first, second = _PAIRS[pair]
    ops = [op for op in ReduceOp if op is not ReduceOp.GATHER]
    wants = []
    for op in ops:
        try:
            want = reduce_values(op, [first, second], list(weights))
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)):
                reduce_pairs((op,), [first], weights[0], [second], weights[1])
            continue
        wants.append((op, want))
        got = reduce_pairs((op,), [first], weights[0], [second], weights[1])[0]
        _same(got, want, first, second)
    if wants:  # the ops that succeed, as the outputs of one call
        ops = tuple(op for op, _ in wants)
        gots = reduce_pairs(ops, [first] * len(ops), weights[0], [second] * len(ops),
                            weights[1])
        for got, (_, want) in zip(gots, wants, strict=True):
            _same(got, want, first, second)


def _same(got, want, first, second):
    assert type(got) is type(want)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(got, want)
    assert got is not first and got is not second


def test_reduce_values_never_changes_its_inputs():
    values = [np.ones(3), np.full(3, 2.0)]
    before = [v.copy() for v in values]
    for op in ("avg", "sum", "prod", "max", "min"):
        reduce_values(op, values, [3, 4])
    for v, b in zip(values, before, strict=True):
        np.testing.assert_array_equal(v, b)
