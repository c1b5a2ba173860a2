"""distribute() ships a function whose graph holds a differentiated OpFromGraph.

Regression: PyTensor caches an OpFromGraph's gradient as a local closure, which pickle
refuses, so ``distribute()`` failed on any function reaching such an Op (on Python 3.12
with PyTensor 3.3, the docs' softmax-regression example reaches ``LogSumExp``). The
parallel result must equal the plain function's.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.builders import OpFromGraph

import synkhronos as synk


def test_distribute_differentiated_opfromgraph(forked):
    a = pt.dvector("a")
    softplus = OpFromGraph([a], [pt.log1p(pt.exp(a))], name="softplus")
    x = pt.dvector("x")
    w = pt.dvector("w")
    loss = softplus(x * w[0]).sum()
    grad = pytensor.grad(loss, w)
    assert softplus._lop_op_cache, "the gradient cache this test is about is empty"
    f = synk.function([x], [(loss, "sum"), (grad, "sum")], bcast_inputs=[w])
    synk.distribute()
    values = np.linspace(-3, 3, 101), np.array([0.7])
    got = f(*values)
    want = f.as_pytensor(*values)
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=1e-12)
    assert softplus._lop_op_cache, "the master's Op must keep its cache"
