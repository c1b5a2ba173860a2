"""The reading of givens that slice shared variables (synkhronos._givens); no fork."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos._givens import find_slices, shared_of
from synkhronos._scatter import split_bounds

DATA = pytensor.shared(np.arange(40.0).reshape(20, 2), name="data")
LABELS = pytensor.shared(np.arange(20.0), name="labels")


def test_elementwise_views_count_as_their_shared_variable():
    assert shared_of(DATA) is DATA
    assert shared_of(pt.cast(LABELS, "int32")) is LABELS
    assert shared_of(DATA / 255.0) is DATA
    assert shared_of(pt.exp(pt.cast(DATA, "float32") * 2)) is DATA
    assert shared_of(DATA * pt.dmatrix("m")) is None  # another variable's rows
    assert shared_of(DATA.T) is None  # rows are no longer rows
    assert shared_of(DATA + np.ones((20, 2))) is None  # a constant with rows of its own
    assert shared_of(pt.dmatrix("x")) is None


def _pattern(value, inputs):
    x = pt.dmatrix("x") if value.ndim == 2 else pt.dvector("x")
    return find_slices([(x, value)], inputs, [])


@pytest.mark.parametrize("make", [
    lambda i: DATA[i * 3:(i + 1) * 3],
    lambda i: DATA[i * 3:],
    lambda i: DATA[:i],
    lambda i: DATA[i:i + 3:1],
    lambda i: pt.cast(LABELS, "int32")[i:i + 3],
    lambda i: pt.cast(LABELS[i:i + 3], "int32"),
    lambda i: (DATA / 2.0)[i:i + 3] * 3.0,
], ids=["start-stop", "start", "stop", "step-1", "cast-then-slice", "slice-then-cast",
        "views-around"])
def test_row_slices_are_found(make):
    i = pt.lscalar("i")
    pattern = _pattern(make(i), [i])
    assert pattern is not None and len(pattern.shareds) == 1
    assert pattern.scalars == [i]


@pytest.mark.parametrize("make", [
    lambda i: DATA[i:i + 3:2],
    lambda i: DATA[i],
    lambda i: DATA[i:i + 3, 0],
    lambda i: DATA[:, i:i + 1],
    lambda i: DATA[pt.arange(i, i + 3)],
    lambda i: DATA.T[i:i + 1],
    lambda i: (DATA * pt.dmatrix("m"))[i:i + 3],
], ids=["step-2", "one-row", "two-axes", "axis-1", "advanced", "transposed", "not-a-view"])
def test_other_givens_are_left_alone(make):
    i = pt.lscalar("i")
    assert _pattern(make(i), [i]) is None


@pytest.mark.parametrize(("index", "size", "parts"),
                         [(0, 7, 2), (2, 7, 3), (2, 7, 1), (3, 7, 2), (5, 7, 2), (0, 1, 3)])
def test_rows_divide_the_clipped_slice_by_the_split_rule(index, size, parts):
    i, n = pt.lscalar("i"), pt.lscalar("n")
    pattern = _pattern(DATA[i * n:(i + 1) * n], [i, n])
    pattern.compile([i, n])
    rows, length = pattern.rows([np.int64(index), np.int64(size)], parts)
    want = np.arange(20)[index * size:(index + 1) * size]
    assert length == len(want)
    got = [np.arange(20)[start:stop] for ((start, stop),) in rows]
    assert [len(r) for r in got] == [hi - lo for lo, hi in split_bounds(len(want), parts)]
    np.testing.assert_array_equal(np.concatenate(got), want)


def test_negative_and_open_bounds_clip_as_numpy_does():
    i = pt.lscalar("i")
    pattern = _pattern(DATA[-i:], [i])
    pattern.compile([i])
    assert pattern.whole([np.int64(5)]) == [(15, 20)]
    assert pattern.whole([np.int64(50)]) == [(0, 20)]


def test_the_first_minibatch_is_known_at_build_where_the_bounds_allow():
    """``first_rows``: the slice's rows with every input 0, the tutorials' batch size
    (the build-time check of a hard-coded batch size reads it); None where that
    cannot be told, and the call's own rows are checked then."""
    i, n = pt.lscalar("i"), pt.lscalar("n")
    cases = [
        (DATA[i * 6:(i + 1) * 6], [i], 6),  # the tutorials' form
        (DATA[i * n:(i + 1) * n], [i, n], 0),  # a size given at the call: 0 rows at 0
        (DATA[i * 30:(i + 1) * 30], [i], 20),  # clipped as numpy clips
        (DATA[20 // n:], [n], None),  # no sense at 0: a division by an input
        (DATA[i:i + 4], [i, pt.dvector("v")], None),  # an input that is not a scalar
    ]
    for value, inputs, first in cases:
        pattern = _pattern(value, [var for var in inputs if var.ndim == 0])
        pattern.compile(inputs)  # (the function's broadcast inputs)
        assert pattern.first_rows() == first, value
