"""distribute() ships graphs of every kind of Op PyTensor compiles, on 2.38 and 3.x.

Regression: on PyTensor 2.38 (PyMC 5's pin) a ``Blockwise`` node (batched
``pt.linalg.cholesky``, ``pt.vectorize``, batched ``solve``, and their gradients) caches
its ``np.vectorize``'d perform as a local closure in the node's tag, which pickle
refuses: ``distribute()`` failed with "Can't pickle local object
'_vectorize_node_perform.<locals>.vectorized_perform'" (a multivariate PyMC likelihood
reaches it). The other Ops that carry inner graphs or state are covered beside them:
``Scan``, ``OpFromGraph`` (differentiated: its gradient cache is a closure too; see
``test_distribute_opfromgraph.py``), a ``RandomVariable`` with its generator, and
Blockwise graphs compiled by the Numba linker. Each parallel result equals the plain
PyTensor function's on the whole data. One session per size for the whole module.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.builders import OpFromGraph

import synkhronos as synk

from ..conftest import session_fixture

ROWS = 7  # uneven over 2 and 3 processes

rng = np.random.default_rng(0)
_A = rng.normal(size=(ROWS, 3, 3))
SPD = _A @ _A.transpose(0, 2, 1) + 3 * np.eye(3)  # a batch of positive-definite matrices
B = rng.normal(size=(ROWS, 3))


def _cases():
    """name -> (inputs, outputs, arguments); every input scattered by rows."""
    x = pt.tensor3("x")
    b = pt.matrix("b")
    cases = {
        "batched_cholesky": ([x], [(pt.linalg.cholesky(x).sum(), "sum"),
                                   (pt.linalg.cholesky(x), "gather")], (SPD,)),
        "batched_solve": ([x, b], [(pt.linalg.solve(x, b[..., None]), "gather")], (SPD, B)),
        "vectorize": ([x], [(pt.vectorize(lambda m: pt.linalg.det(m) + m.sum(),
                                          signature="(n,n)->()")(x), "gather")], (SPD,)),
        "blockwise_gradient": ([x], [(pytensor.grad(pt.log(pt.linalg.det(x)).sum(), x),
                                      "gather")], (SPD,)),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # scan's return form, 3.x
        steps, _ = pytensor.scan(lambda row, acc: acc + row ** 2, sequences=[b.T],
                                 outputs_info=[pt.zeros(b.shape[0])])
    cases["scan"] = ([b], [(steps[-1], "gather")], (B,))
    u = pt.vector("u")
    exp_sum = OpFromGraph([u], [pt.exp(u).sum()])
    term = exp_sum(b.ravel())
    cases["differentiated_opfromgraph"] = ([b], [(term, "sum"), (pytensor.grad(term, b),
                                                                  "gather")], (B,))
    return cases


class Built:
    def __init__(self):
        self.cases = _cases()
        self.fns = {name: synk.function(inputs=ins, outputs=outs)
                    for name, (ins, outs, _) in self.cases.items()}
        x = pt.tensor3("x")
        self.numba = None
        try:
            import numba  # noqa: F401
        except ImportError:
            pass
        else:
            self.numba = synk.function(inputs=[x], outputs=[(pt.linalg.cholesky(x), "gather")],
                                       mode="NUMBA")
        draw = pt.random.normal(0, 1, size=(3,), rng=pytensor.shared(np.random.default_rng(1)))
        b = pt.matrix("b")
        self.random = synk.function(inputs=[b], outputs=[(b * draw, "gather")])
        synk.distribute()  # every function at once: the regression failed here


built = session_fixture(Built)

NAMES = ["batched_cholesky", "batched_solve", "vectorize", "blockwise_gradient", "scan",
         "differentiated_opfromgraph"]


@pytest.mark.parametrize("name", NAMES)
def test_graph_distributes_and_equals_the_plain_function(built, name):
    args = built.cases[name][2]
    got = built.fns[name](*args)
    want = built.fns[name].as_pytensor(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_numba_blockwise_distributes(built):
    if built.numba is None:
        pytest.skip("numba is not installed here")
    np.testing.assert_allclose(built.numba(SPD)[0], np.linalg.cholesky(SPD), rtol=1e-12)


def test_random_variable_distributes(built):
    # each process draws from its own copy of the generator: rows times a draw of 3
    # each process draws from its own copy of the generator, once a call: within a
    # process's block of rows (the first ROWS % n ranks have one more) the draw is one
    (got,) = built.random(B)
    ratio = got / B
    n = synk.n_parallel()
    bounds = np.cumsum([0] + [ROWS // n + (rank < ROWS % n) for rank in range(n)])
    for begin, end in zip(bounds[:-1], bounds[1:], strict=True):
        np.testing.assert_allclose(ratio[begin:end], ratio[begin:begin + 1].repeat(
            end - begin, axis=0), rtol=1e-12)
    assert np.all(np.isfinite(got))
