"""Unit tests for synkhronos._runtime.wire: replies of arrays written raw, read back."""

from __future__ import annotations

import mmap
import pickle

import numpy as np
import pytest

from synkhronos._runtime import wire


def _round_trip(obj):
    described = wire.describe(obj)
    assert described is not None
    head, arrays, data_bytes = described
    buffer = memoryview(mmap.mmap(-1, 1 << 16))
    at = 128  # anywhere in the slot
    assert wire.size(head, data_bytes) <= len(buffer) - at
    wire.write_arrays(buffer, at, head, arrays)
    return wire.read_arrays(buffer, at, len(head)), buffer


def _same(got, want):
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    else:
        assert got == want


@pytest.mark.parametrize("dtype", ["f8", "f4", "i8", "i4", "u1", "?", "c16", ">f8", "<i2"])
def test_arrays_of_every_numeric_dtype_round_trip(dtype):
    values = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    reply = (7, [values, values[0], np.asarray(values[0, 0])])
    got, _ = _round_trip(reply)
    assert got[0] == 7
    for g, w in zip(got[1], reply[1], strict=True):
        _same(g, w)


def test_scalars_arrays_and_empty_arrays_in_one_reply():
    reply = (3, 2.5, None, True, np.zeros((0, 5)), [np.ones(3), np.empty((2, 0), np.int32)], [])
    got, _ = _round_trip(reply)
    for g, w in zip(got, reply, strict=True):
        _same(g, w)


def test_non_contiguous_arrays_are_written_in_order():
    base = np.arange(40.0).reshape(5, 8)
    reply = (1, [base[:, ::3], base.T, base[::-1]])
    got, _ = _round_trip(reply)
    for g, w in zip(got[1], reply[1], strict=True):
        _same(g, w)
        assert g.flags.c_contiguous


def test_decoded_arrays_are_copies_of_the_slot():
    got, buffer = _round_trip((1, [np.ones(4)]))
    buffer[:] = bytes(len(buffer))  # the next command overwrites the slot
    np.testing.assert_array_equal(got[1][0], np.ones(4))


@pytest.mark.parametrize(
    "obj",
    [
        [1, np.ones(2)],  # not a tuple
        (1, (np.ones(2),)),  # a tuple inside
        (1, [np.ones(2), 3]),  # a list with a non-array
        (np.array(["a", "b"]),),  # not numeric
        (np.array([object()]),),
        (np.float64(1.0),),  # a numpy scalar
        ({"a": 1},),
        (np.arange(3).view(np.recarray),),  # an ndarray subclass
    ],
)
def test_other_shapes_are_left_to_pickle(obj):
    assert wire.describe(obj) is None
    pickle.dumps(obj)  # the control block's fallback


def test_array_data_is_aligned():
    head, arrays, data_bytes = wire.describe((1, [np.ones(3), np.ones(5, np.float32)]))
    assert data_bytes % 64 == 0 and data_bytes >= 64 * 2


def test_a_repeated_description_keeps_its_scalar_types():
    """The writer reuses the last description's pickle only for an identical one:
    1, 1.0 and True are equal but must come back as sent."""
    for obj in [(1, np.ones(2)), (1.0, np.ones(2)), (True, np.ones(2)), (1, np.ones(2))]:
        got, _ = _round_trip(obj)
        assert type(got[0]) is type(obj[0]) and got[0] == obj[0]
        np.testing.assert_array_equal(got[1], obj[1])


def test_views_share_the_slot_and_copies_do_not():
    obj = (3, [np.arange(4.0)])
    head, arrays, _ = wire.describe(obj)
    buffer = memoryview(bytearray(1024))
    wire.write_arrays(buffer, 0, head, arrays)
    view = wire.read_arrays(buffer, 0, len(head), copy=False)[1][0]
    copy = wire.read_arrays(buffer, 0, len(head))[1][0]
    wire.write_arrays(buffer, 0, head, [np.zeros(4)])
    np.testing.assert_array_equal(view, np.zeros(4))
    np.testing.assert_array_equal(copy, np.arange(4.0))


def test_a_sequence_of_call_replies_each_round_trips():
    """A call's reply like the last one takes the writer's shortcut; any change (rows,
    count, dtype, shape, a reply of another form between) must be described anew."""
    a, b = np.arange(6.0).reshape(2, 3), np.arange(4, dtype="f4")
    t, t4 = np.array([0.5, 1.5]), np.array([0.5, 1.5], dtype="f4")  # a timed reply's
    replies = [(3, [a]), (3, [a + 1]), (4, [a]), (4, [b]), (4, [b, a]), (4, [b, a * 2]),
               (True, [a]), (4, [a]), (2, 1.5), (4, [a]), (4, [a.astype(">f8")]),
               (4, [a[:1]]), (4, [np.zeros((0, 3))]), (4, [a]),
               (4, [a], t), (4, [a + 1], t * 2), (4, [a], t4), (4, [a], t[:1]), (4, [a], t),
               (4, [a]), (4, [a], t), (4, [b], t), (5, [b], t), (5, [b], 1.5), (5, [b], t),
               (5, [b], t, t), (5, [b], t)]
    for reply in replies:
        got, _ = _round_trip(reply)
        assert len(got) == len(reply)
        for g, w in zip(got, reply, strict=True):
            _same(g, w)
        assert type(got[0]) is type(reply[0])
