"""_rows: what of a graph follows the scattered rows, decided from the graph alone
(no session: in_axes, moved inputs, per-row outputs, scans over the rows)."""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos import _pytensor, _rows
from synkhronos._reducers import ReduceOp


def _scan_over(x):
    with warnings.catch_warnings():  # (PyTensor 3 warns that scan's return will change)
        warnings.simplefilter("ignore", DeprecationWarning)
        out = pytensor.scan(lambda x_t, h: h + x_t, sequences=[x],
                            outputs_info=[pt.zeros_like(x[0])])
    return out[0] if isinstance(out, (list, tuple)) else out


def test_in_axes_default_int_and_list():
    x, m, y = pt.dmatrix("x"), pt.tensor3("m"), pt.dvector("y")
    assert _rows.in_axes(None, [x, y]) == ((0, 0), (False, False))
    assert _rows.in_axes(-1, [x, m]) == ((1, 2), (True, True))
    assert _rows.in_axes([1, 2, 0], [x, m, y]) == ((1, 2, 0), (True, True, True))
    assert _rows.in_axes(np.int64(1), [x]) == ((1,), (True,))


@pytest.mark.parametrize(("value", "kind", "message"), [
    ([1], ValueError, r"one axis per entry of inputs \(2\); got 1"),
    ([0, 1], ValueError, r"in_axes\[1\] is 1, out of range for input 1 \('y'\)"),
    ([0, 1.0], TypeError, r"in_axes\[1\] must be an int; got 1.0"),
    (True, TypeError, "in_axes must be an int or a list"),
])
def test_in_axes_refusals(value, kind, message):
    with pytest.raises(kind, match=message):
        _rows.in_axes(value, [pt.dmatrix("x"), pt.dvector("y")])


def test_a_scalar_has_no_axis_to_split():
    with pytest.raises(ValueError, match=r"in_axes\[0\]: input 0 \('s'\) is a scalar"):
        _rows.in_axes([0], [pt.dscalar("s")])


def test_moved_input_reads_back_as_the_users_layout():
    x = pt.tensor("x", dtype="float64", shape=(5, None, 3))
    moved = _rows.move([x, pt.dvector("y")], (1, 0))
    first = moved.inputs[0]
    assert first.type.shape == (None, 5, 3) and first.name == "x"
    value = np.arange(5 * 4 * 3, dtype="float64").reshape(5, 4, 3)
    view = pytensor.function([first], moved.replace[x])(np.moveaxis(value, 1, 0))
    np.testing.assert_array_equal(view, value)


def test_per_row_outputs_are_found_by_their_shape():
    r = pt.dmatrix("r")
    outs = [r.sum(axis=1), r.mean(axis=0), r.sum(), r.T * 2, pt.switch(r > 0, r, 0)]
    found = _rows.per_row_outputs(outs, [ReduceOp.AVG] * 5, (False,) * 5, outs, [r])
    assert found.ops == [ReduceOp.GATHER, ReduceOp.AVG, ReduceOp.AVG, ReduceOp.GATHER,
                         ReduceOp.GATHER]
    assert found.axes == (None, None, None, 1, None)
    value = np.arange(6.0).reshape(3, 2)
    moved = pytensor.function([r], found.outputs[3])(value)
    np.testing.assert_array_equal(moved, (value.T * 2).T)  # the rows first, to gather
    back = _rows.put_back([None, None, None, moved, None], found.axes, None)
    np.testing.assert_array_equal(back[3], value.T * 2)


def test_op_none_and_explicit_gather_are_left_as_asked():
    r = pt.dmatrix("r")
    outs = [r.sum(axis=1), r.dot(r.T)]
    found = _rows.per_row_outputs(outs, [ReduceOp.NONE, ReduceOp.GATHER], (True, True),
                                  outs, [r])
    assert found.ops == [ReduceOp.NONE, ReduceOp.GATHER] and found.axes is None


def test_reductions_of_per_row_outputs_are_refused():
    r = pt.dmatrix("r")
    with pytest.raises(ValueError, match=r"output 0 \('s'\) has one entry per scattered "
                                         r"row along its axis 0.*op 'max'.*\"gather\""):
        out = r.sum(axis=1)
        out.name = "s"
        _rows.per_row_outputs([out], [ReduceOp.MAX], (True,), [out], [r])
    with pytest.raises(ValueError, match=r"along each of its axes \(0, 1\)"):
        out = r.dot(r.T)
        _rows.per_row_outputs([out], [ReduceOp.AVG], (False,), [out], [r])


def test_a_dimension_merely_computed_from_the_rows_decides_nothing():
    """Shape inference writes some constants the long way round (a weight's gradient
    behind a reshape: ``36 * L // max(L, 1)``): only a plain row count counts."""
    r = pt.dmatrix("r")
    w = pytensor.shared(np.ones((4, 3)))
    grad = pytensor.grad((r.reshape((-1, 4)).dot(w) ** 2).sum(), w)
    outs = [r[1:], grad]
    found = _rows.per_row_outputs(outs, [ReduceOp.AVG] * 2, (False, False), outs, [r])
    assert found.ops == [ReduceOp.AVG, ReduceOp.AVG]


def test_scans_over_the_rows_are_refused_unless_the_axis_was_given():
    x = pt.dmatrix("x")
    steps = _pytensor.scan_steps([_scan_over(x)[-1]])
    with pytest.raises(ValueError, match=r"input 0 \('x'\) is split by rows along its "
                                         r"axis 0, and a scan iterates over that axis"):
        _rows.check_scans(steps, [x], ["input 0 ('x')"], (False,))
    _rows.check_scans(steps, [x], ["input 0 ('x')"], (True,))  # in_axes=0: said
    moved = _rows.move([x], (1,))
    over_time = _pytensor.substitute_all(steps, moved.replace)
    _rows.check_scans(over_time, moved.inputs, ["input 0 ('x')"], (True,))
    fixed = _pytensor.scan_steps([_scan_over(x[:, :3].T)[-1]])  # steps of another axis
    _rows.check_scans(fixed, [x], ["input 0 ('x')"], (False,))
