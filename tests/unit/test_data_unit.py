"""Unit tests for synkhronos.data: validation and single-process behaviour.

These tests never fork a process: they use a session of one process (``fork(1)`` starts
no worker), which ``synk.data`` needs to name its segments.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import synkhronos as synk
from synkhronos.data import DataRef, _alloc_items


@pytest.fixture
def master():
    """A one-process session: the master alone, no worker forked."""
    synk.fork(1)
    try:
        yield 1
    finally:
        synk.close()


def _state(x: synk.Data) -> tuple:
    return (x.ref(), x.alloc_size, x.data.copy())


def _same_state(x: synk.Data, before: tuple) -> None:
    ref, alloc, values = before
    assert x.ref() == ref and x.alloc_size == alloc
    np.testing.assert_array_equal(x.data, values)


def test_data_before_fork():
    with pytest.raises(RuntimeError, match=r"synk.fork\(\) must be called before synk.data\(\)"):
        synk.data(np.zeros(3))


def test_zero_size_ref_needs_no_segment():
    view = DataRef("", "<f4", (0, 5)).view(None)
    assert view.shape == (0, 5) and view.dtype == np.float32


def test_missing_segment_is_named():
    with pytest.raises(FileNotFoundError, match="synk_none_x"):
        DataRef("synk_none_x", "<f4", (2,)).view(None)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**12), st.floats(1, 2))
def test_alloc_items_leaves_room(size, oversize):
    items = _alloc_items(size, oversize)
    assert size <= items <= size * oversize + 1


class FakeVar:
    """What synk.data reads from a PyTensor variable."""

    def __init__(self, dtype: str, ndim: int, name: str | None = None):
        self.dtype, self.ndim, self.name = dtype, ndim, name


# -- creation -------------------------------------------------------------------------------
def test_creation_sources(master):
    import pytensor.tensor as pt

    var = pt.matrix("inputs", dtype="float32")
    x = synk.data(var=var)
    assert x.dtype == np.float32 and x.ndim == 2 and x.shape == (0, 0) and x.name == "inputs"
    y = synk.data(var=FakeVar("int32", 1), shape=(5,))
    assert y.dtype == np.int32 and y.shape == (5,) and (y.data == 0).all()
    z = synk.data(dtype="float64", shape=(2, 3), oversize=2)
    assert z.shape == (2, 3) and z.alloc_size == 12
    w = synk.data([[1, 2], [3, 4]], var=var)  # a list: cast within its kind
    assert w.dtype == np.float32 and w.data.tolist() == [[1, 2], [3, 4]]
    v = synk.data(np.ones((2, 2)), var=var, force_cast=True)
    assert v.dtype == np.float32
    u = synk.data(np.ones(3, dtype=np.int8), shape=(3,), ndim=1)
    assert u.dtype == np.int8


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, TypeError, "needs a dtype"),
        ({"ndim": 2}, TypeError, "needs a dtype"),
        ({"dtype": "float32"}, TypeError, "needs an ndim"),
        ({"dtype": "float32", "ndim": 1, "shape": (2, 2)}, ValueError, "ndim 1 from ndim"),
        ({"value": np.ones(3), "ndim": 2}, ValueError, "ndim 2 from ndim but 1 from value"),
        ({"value": np.ones(3), "shape": (4,)}, ValueError, "shape"),
        ({"value": np.ones(3), "dtype": "float32"}, TypeError, "force_cast"),
        ({"var": FakeVar("float32", 1), "dtype": "int8"}, TypeError, "int8 and a var"),
        ({"var": FakeVar("float32", 1), "value": np.ones(3)}, TypeError, "holds float32"),
        ({"value": ["a", "b"]}, TypeError, "numeric arrays"),
        ({"dtype": "float32", "ndim": -1}, ValueError, "ndim must be"),
        ({"dtype": "float32", "ndim": 1.5}, TypeError, "ndim must be"),
        ({"dtype": "float32", "shape": (2, -1)}, ValueError, "negative"),
        ({"value": np.ones(3), "oversize": 3}, ValueError, r"oversize must be in \[1, 2\]"),
        ({"value": np.ones(3), "name": 5}, TypeError, "name must be"),
    ],
)
def test_creation_errors(master, kwargs, error, match):
    with pytest.raises(error, match=match):
        synk.data(**kwargs)


# -- rejected calls change nothing ----------------------------------------------------------
_ROWS = np.ones((9, 2), dtype=np.float32)  # more rows than x holds: would reallocate


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x: x.set_value(np.ones((9, 2))), TypeError, "holds float32; got .* float64"),
        (lambda x: x.set_value(_ROWS.astype(np.int32)), TypeError, "force_cast"),
        (lambda x: x.set_value(_ROWS.ravel()), ValueError, "has ndim 2; got"),
        (lambda x: x.set_value(_ROWS, oversize=2.5), ValueError, r"\[1, 2\]"),
        (lambda x: x.set_value(_ROWS, oversize=0.5), ValueError, r"\[1, 2\]"),
        (lambda x: x.set_value(_ROWS, oversize="2"), TypeError, "oversize"),
        (lambda x: x.set_value([["a", "b"]]), TypeError, "holds float32"),
        (lambda x: x.set_shape((9,)), ValueError, "has ndim 2; got shape"),
        (lambda x: x.set_shape((9, -2)), ValueError, "negative"),
        (lambda x: x.set_shape((9, 2.0)), TypeError, "tuple of integers"),
        (lambda x: x.set_length(20, oversize=5), ValueError, r"\[1, 2\]"),
    ],
)
def test_rejected_calls_change_nothing(master, call, error, match):
    x = synk.data(np.arange(8, dtype=np.float32).reshape(4, 2), name="x")
    before = _state(x)
    with pytest.raises(error, match=match):
        call(x)
    _same_state(x, before)


def test_casting_rules(master):
    x = synk.data(np.zeros(3, dtype=np.float32))
    x.set_value([1, 2, 3])  # ints into floats: same kind
    assert x.data.tolist() == [1, 2, 3]
    x.set_value(np.array([1.7, 2.2, 3.9]), force_cast=True)
    np.testing.assert_allclose(x.data, [1.7, 2.2, 3.9], rtol=1e-6)
    n = synk.data(np.zeros(2, dtype=np.int32))
    with pytest.raises(TypeError, match="holds int32"):
        n.set_value([0.5, 1.5])  # floats into ints: not the same kind
    n.set_value([0.5, 1.5], force_cast=True)
    assert n.data.tolist() == [0, 1]


def test_trustable_only_when_the_masters_checks_cover_pytensors():
    """Parallel calls skip PyTensor's input check only where nothing could slip by."""
    import pytensor.tensor as pt
    from pytensor.tensor.random.type import RandomGeneratorType

    from synkhronos._validate import trustable

    rows = pt.dmatrix("rows")
    fixed_rows = pt.tensor("fixed_rows", shape=(4, 3), dtype="float64")
    fixed_bcast = pt.tensor("fixed_bcast", shape=(2, 2), dtype="float64")
    scalar = pt.dscalar("s")
    rng = RandomGeneratorType()("rng")
    assert trustable([rows, fixed_bcast, scalar], 1, 2)
    assert not trustable([fixed_rows], 1, 0)  # a share of rows cannot keep length 4
    assert not trustable([scalar], 1, 0)  # a scattered scalar
    assert not trustable([rows, rng], 1, 1)  # not a tensor
    assert not trustable([rows, fixed_rows], 1, 0)  # a sliceable stand-in with fixed rows
    assert trustable([rows, scalar, rows], 1, 1)
    wide = pt.tensor("wide", shape=(None, 3), dtype="float64")
    assert trustable([wide], 1, 0)  # the master checks a scattered input's other axes
    assert not trustable([rows, wide], 1, 0)  # nobody checks a sliceable variable's rows
    import pytensor.sparse as ps

    assert not trustable([ps.csr_matrix("sparse", dtype="float64")], 1, 0)  # filter converts
