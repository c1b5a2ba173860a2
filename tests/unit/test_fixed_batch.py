"""``_fixed_batch``: which ops hard-code the batch's row count, and which calls that
breaks. Nothing forks here; ``tests/integration/test_fixed_batch.py`` runs the
refusals and the graphs that follow the rows in a session."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos import _fixed_batch

x = pt.dmatrix("x")  # rows of 784 pixels, as the tutorials' MNIST
W = pytensor.shared(np.zeros((784, 10)), name="W")
LABELS = ["input 0 ('x')"]


def found(*outputs):
    return _fixed_batch.find(list(outputs), [x], LABELS)


def test_the_tutorials_reshape_is_found():
    (fixed,) = found(x.reshape((500, 1, 28, 28)).sum())
    assert fixed == _fixed_batch.FixedBatch(
        op="Reshape{4}", constant=500, shape=(500, 1, 28, 28), tensor="x", rows_of=None,
        reshape=True)
    assert fixed.fix() == "x.reshape((x.shape[0], 1, 28, 28)), or -1 in place of 500"


def test_a_computed_tensor_of_rows_and_specify_shape_are_found():
    (fixed,) = found(x.dot(W).reshape((500, 2, 5)).sum())
    assert (fixed.constant, fixed.tensor, fixed.rows_of) == (500, None, "input 0 ('x')")
    assert fixed.fix().startswith("t.reshape((t.shape[0], 2, 5)) (t: the tensor the "
                                  "Reshape{3} applies to)")
    (fixed,) = found(pt.specify_shape(x, (500, None)).sum())
    assert (fixed.op, fixed.constant, fixed.shape) == ("SpecifyShape", 500, (500, None))
    assert fixed.fix() == "pt.specify_shape(x, (None, None))"
    (fixed,) = found(x.reshape((500, x.shape[1])).sum())  # not every entry constant
    assert fixed.shape is None
    assert fixed.fix().startswith("x.reshape((x.shape[0], ...))")


@pytest.mark.parametrize("graph", [
    x.reshape((-1, 1, 28, 28)).sum(),  # follows the rows
    x.reshape((x.shape[0], 1, 28, 28)).sum(),
    pt.specify_shape(x, (None, 784)).sum(),
    W.reshape((10, 784)).sum() + x.sum(),  # a weight's shape: no rows in it
    x.sum(axis=0).reshape((28, 28)).sum(),  # the rows summed away: a fixed size
], ids=["minus-one", "shape0", "specify-open", "weight", "summed"])
def test_graphs_that_follow_the_rows_are_not_found(graph):
    assert found(graph) == ()


def test_rows_are_followed_through_the_ops_between():
    """A reshape of a tensor that a reshape with -1 made from the rows still grows
    with them; one of a tensor a hard-coded reshape made does not (that one is found)."""
    images = x.reshape((-1, 1, 28, 28))
    assert [f.constant for f in found(images.reshape((500, 784)).sum())] == [500]
    fixed = found(x.reshape((500, 1, 28, 28)).reshape((500, 784)).sum())
    assert [(f.op, f.tensor) for f in fixed] == [("Reshape{4}", "x")]


def test_a_graph_without_rows_to_split_has_nothing_to_find():
    assert _fixed_batch.find([x.reshape((500, 784)).sum()], [], []) == ()


FIXED = found(x.reshape((500, 1, 28, 28)).sum())


@pytest.mark.parametrize(("parts", "shares", "num_slices", "largest"), [
    (2, None, 1, 250), (3, None, 1, 167), (2, (3.0, 1.0), 1, 375), (1, None, 2, 250),
])
def test_a_call_that_splits_the_whole_batch_is_refused(parts, shares, num_slices, largest):
    with pytest.raises(ValueError) as refused:
        _fixed_batch.check(FIXED, 500, parts, shares, num_slices)
    assert str(refused.value) == (
        "the graph's Reshape{4} gives 'x' the constant leading dimension 500 (shape "
        "(500, 1, 28, 28)), which is this call's whole batch of 500 rows; but each "
        f"process runs only its own rows ({largest} at a time at most here), so that "
        "dimension must follow them: write x.reshape((x.shape[0], 1, 28, 28)), or -1 in "
        "place of 500")


@pytest.mark.parametrize(("total", "parts", "num_slices"), [
    (500, 1, 1),  # one process, one slice: the serial program's own call
    (300, 2, 1),  # another batch size: the serial program fails there too
    (1, 2, 1),  # one row: one process runs it whole, the other none
])
def test_a_call_that_runs_the_batch_whole_or_another_size_passes(total, parts, num_slices):
    fixed = found(x.reshape((total, 784)).sum()) if total == 1 else FIXED
    _fixed_batch.check(fixed, total, parts, None, num_slices)
