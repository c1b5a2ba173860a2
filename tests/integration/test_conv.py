"""``conv2d`` and ``pool_2d`` in a session: a small LeNet at n_parallel 2, uneven rows.

Each process runs the graph on its own number of rows (4 and 3 of 7), which works
only if the batch dimension stays symbolic in every reshape and padding block. The
plain function on the whole data is the reference. Both compile with PyTensor's
rewrites and its Python linker: the first Numba compilation of this graph's
gradient (slices, joins, their increments) takes minutes on two cores with a cold
cache, and what is checked here is the graph, not the backend; the unit tests
(``tests/unit/test_conv_unit.py``) check the cases against SciPy and numpy.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions import conv2d, pool_2d
from synkhronos.testing import split_bounds

from ..conftest import sizes_to_run

pytestmark = pytest.mark.timeout(300)

RTOL, ATOL = 1e-10, 1e-12
MODE = pytensor.compile.mode.Mode(linker="py", optimizer="fast_run")


def lenet(x, y, params):
    """Two convolution + pooling stages (each kind of window), a dense softmax layer."""
    w1, w2, w3 = params
    h = pt.tanh(conv2d(x, w1, input_shape=(None, 1, 12, 12), filter_shape=(4, 1, 3, 3)))
    h = pool_2d(h, (2, 2), ignore_border=True)  # 10x10 -> 5x5, tiles: a reshape
    h = conv2d(h, w2, filter_shape=(6, 4, 3, 3), border_mode="half", subsample=(1, 2),
               filter_flip=False)  # 5x5 -> 5x3
    h = pool_2d(h, (2, 2), ignore_border=False, stride=(2, 1), mode="average_exc_pad")  # 3x2
    prob = pt.special.softmax(h.flatten(2).dot(w3), axis=-1)
    loss = -pt.log(prob[pt.arange(y.shape[0]), y]).mean()
    return h, loss, pytensor.grad(loss, params)


@pytest.mark.parametrize("n", sizes_to_run([2]), ids=lambda n: f"n{n}")
def test_lenet_loss_and_gradients_equal_the_plain_function(n):
    rng = np.random.default_rng(5)
    params = [pytensor.shared(rng.normal(size=shape) * 0.3, name=name) for name, shape in
              [("w1", (4, 1, 3, 3)), ("w2", (6, 4, 3, 3)), ("w3", (36, 3))]]
    x, y = pt.tensor4("x", dtype="float64"), pt.lvector("y")
    features, loss, grads = lenet(x, y, params)
    x_val, y_val = rng.normal(size=(7, 1, 12, 12)), rng.integers(0, 3, size=7)
    assert [hi - lo for lo, hi in split_bounds(7, n)] == [4, 3]

    want = pytensor.function([x, y], [features, loss, *grads], mode=MODE)(x_val, y_val)

    synk.fork(n)
    try:
        # "avg" (the default) weights each process by its rows: the whole batch's mean.
        f = synk.function([x, y], [(features, "gather"), loss, *grads], mode=MODE)
        synk.distribute()
        got = f(x_val, y_val)
    finally:
        synk.close()
    for value, expected in zip(got, want, strict=True):
        np.testing.assert_allclose(value, expected, rtol=RTOL, atol=ATOL)
