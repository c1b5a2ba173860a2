"""The mode synkhronos.pymc compiles its row likelihood in (``_pymc_compat.pymc_mode``)."""

from __future__ import annotations

import pytest

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
from pytensor.compile.mode import get_mode  # noqa: E402

from synkhronos.pymc import _pymc_compat as compat  # noqa: E402

_PYTHON_BLAS = {"Gemv", "Gemm", "Dot22", "Dot22Scalar", "Ger"}  # Ops whose perform is Python


def test_without_a_blas_library_the_likelihood_keeps_numpys_dot():
    """Without a BLAS library to link (a pip install), PyTensor's BLAS rewrites turn a
    matrix-vector product and its gradient into Ops that run in Python through scipy;
    the row likelihood is compiled without them: numpy's own ``dot`` does the same
    product (a two-process evaluation at 10^4 rows of the hierarchical benchmark model
    1.29x -> 1.48x PyMC's)."""
    x, w = pt.dmatrix("x"), pt.dvector("w")
    products = [x @ w, pytensor.grad(pt.exp(x @ w).sum(), w)]

    def ops(mode) -> set[str]:
        fn = pytensor.function([x, w], products, mode=mode)
        return {type(node.op).__name__ for node in fn.maker.fgraph.apply_nodes}

    if getattr(pytensor.config, "blas__ldflags", "") or not ops(get_mode(None)) & _PYTHON_BLAS:
        pytest.skip("PyTensor's default mode here makes no Python BLAS Op (a BLAS library "
                    "is linked, or its backend has its own products): nothing to leave out")
    with pm.Model() as model:
        pm.Normal("w", 0, 1, shape=3)
    kept = ops(compat.pymc_mode(model))
    assert not kept & _PYTHON_BLAS, kept
