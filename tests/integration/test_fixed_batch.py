"""A graph that hard-codes the whole batch's row count is refused before any worker
moves; graphs that follow the rows (``x.shape[0]``, ``-1``) equal the plain function.

The Deep Learning Tutorials' LeNet writes ``x.reshape((batch_size, 1, 28, 28))`` with
its minibatch sliced out of shared data by ``givens`` of a constant size; here the same
on 4x4 "images", with batches of 8 rows (an even split at n=2) and of 7 (uneven). That
form is refused when the function is built, before anything is compiled; a slice of a
size given at the call, and scattered rows, are refused at the call. At n=1 the
hard-coded graph runs its whole batch, as the serial program does, unless the call
cuts it into slices.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import commands_run

from ..conftest import session_fixture

rng = np.random.default_rng(11)
X = rng.normal(size=(40, 16))
Y = rng.normal(size=40)
KERNEL = rng.normal(size=(1, 4, 4))
BATCHES = (8, 7)  # rows per minibatch: at n=2, 4 + 4 and 4 + 3


def _outputs(images, y, kernel):
    scores = (images * kernel).sum(axis=(1, 2, 3))
    return [((scores - y) ** 2).mean(), (scores, "gather")]


class Model:
    """The functions every test shares, with their plain twins."""

    def __init__(self):
        self.data_x = pytensor.shared(X, name="data_x")
        self.data_y = pytensor.shared(Y, name="data_y")
        self.kernel = pytensor.shared(KERNEL, name="kernel")
        index, size = pt.lscalar("index"), pt.lscalar("size")
        x, y = pt.dmatrix("x"), pt.dvector("y")
        givens = {x: self.data_x[index * size:(index + 1) * size],
                  y: self.data_y[index * size:(index + 1) * size]}
        self.hard_sized = synk.function(  # its slice's size given at each call
            [index, size], _outputs(x.reshape((8, 1, 4, 4)), y, self.kernel), givens=givens)
        self.hard_rows = synk.function(
            [x, y], _outputs(x.reshape((8, 1, 4, 4)), y, self.kernel))
        self.follows, self.plain = {}, {}
        for how, images in [("shape0", x.reshape((x.shape[0], 1, 4, 4))),
                            ("minus-one", x.reshape((-1, 1, 4, 4)))]:
            outputs = _outputs(images, y, self.kernel)
            self.follows[how] = synk.function([index, size], outputs, givens=givens)
            self.plain[how] = pytensor.function([index, size], [o[0] if isinstance(o, tuple)
                                                                 else o for o in outputs],
                                                givens=givens)
        synk.distribute()

    def tutorial(self, batch):
        """The tutorial's own form: the batch size in the givens and in the reshape."""
        index, x, y = pt.lscalar("index"), pt.dmatrix("x"), pt.dvector("y")
        givens = {x: self.data_x[index * batch:(index + 1) * batch],
                  y: self.data_y[index * batch:(index + 1) * batch]}
        return synk.function([index], _outputs(x.reshape((batch, 1, 4, 4)), y, self.kernel),
                             givens=givens)


model = session_fixture(Model, (1, 2))


def assert_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def _refusal(batch: int, largest: int, whole: str = "this call's whole batch") -> str:
    return (rf"the graph's Reshape\{{4\}} gives 'x' the constant leading dimension "
            rf"{batch} \(shape \({batch}, 1, 4, 4\)\), which is {whole} of {batch} "
            rf"rows.*; but each process runs only its own rows \({largest} at a time "
            rf"at most here\), so that dimension must follow them: write "
            rf"x\.reshape\(\(x\.shape\[0\], 1, 4, 4\)\), or -1 in place of {batch}$")


@pytest.mark.parametrize("batch", BATCHES, ids=["even", "uneven"])
def test_the_tutorials_hard_coded_batch_size_is_refused_when_built(model, batch):
    before = commands_run()
    if synk.n_parallel() > 1:
        with pytest.raises(ValueError, match=_refusal(batch, 4, "the whole minibatch")):
            model.tutorial(batch)
        assert commands_run() == before
        return
    f = model.tutorial(batch)  # one process: the serial program's call
    assert_close(f(2), f.as_pytensor(2))
    with pytest.raises(ValueError, match=_refusal(batch, 4)):
        f(2, num_slices=2)


def test_a_hard_coded_batch_size_is_refused_at_the_call_before_any_worker_moves(model):
    f = model.hard_sized
    want = f.as_pytensor(2, 8)  # the serial program: its whole batch, as written
    before = commands_run()
    if synk.n_parallel() == 1:
        assert_close(f(2, 8), want)
    else:
        with pytest.raises(ValueError, match=_refusal(8, 4)):
            f(2, 8)
        with pytest.raises(ValueError, match=_refusal(8, 6)):
            f(2, 8, shares=[3.0, 1.0])
        assert commands_run() == before
    with pytest.raises(ValueError, match=_refusal(8, 4 if synk.n_parallel() == 1 else 2)):
        f(2, 8, num_slices=2)
    assert_close(f.as_pytensor(2, 8), want)


def test_scattered_rows_with_a_hard_coded_batch_size_are_refused(model):
    f = model.hard_rows
    want = f.as_pytensor(X[:8], Y[:8])
    if synk.n_parallel() == 1:
        assert_close(f(X[:8], Y[:8]), want)
    else:
        with pytest.raises(ValueError, match=_refusal(8, 4)):
            f(X[:8], Y[:8])
        with pytest.raises(ValueError, match=_refusal(8, 4)):
            f(X, Y, batch=slice(8, 16))  # the batch's rows, not the data's, count
    with pytest.raises(ValueError, match=_refusal(8, 4 if synk.n_parallel() == 1 else 2)):
        f(X[:8], Y[:8], num_slices=2)


@pytest.mark.parametrize("how", ["shape0", "minus-one"])
@pytest.mark.parametrize("batch", BATCHES, ids=["even", "uneven"])
def test_graphs_that_follow_the_rows_equal_the_plain_function(model, how, batch):
    f = model.follows[how]
    for index in (0, 3):
        want = model.plain[how](index, batch)
        assert_close(f(index, batch), want)
        assert_close(f(index, batch, num_slices=2), want)
