"""synkhronos.pymc.logp_dlogp_function equals PyMC's own compiled logp and dlogp.

At n_parallel 1, 2 and 3 (3 splits unevenly on 2 cores), rtol 1e-9, on the models of
``test_pymc.py``: a logistic regression written with numpy arrays, a hierarchical GLM
written with ``pm.Data`` containers and dims, the latter also in uneven slices of a few
rows (``grainsize``); and out-of-support values give -inf, as in PyMC, never a
``WorkerError``. At n_parallel 1 no command runs: in one block the function is PyMC's
own, in slices the Op calls its compiled function in place; the Op converts values of
another type by PyTensor's types and refuses bad ones with the same TypeError as a
call; a released likelihood refuses to run. One session per size builds every function
once (a module of its own: the session lives for the whole module).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ..conftest import session_fixture

pm = pytest.importorskip(
    "pymc", reason="PyMC is not installed here; .ci/run runs this module in its environments "
    "with the pymc extra"
)

import synkhronos as synk  # noqa: E402
import synkhronos.pymc as synk_pymc  # noqa: E402
from synkhronos import testing  # noqa: E402

from .test_pymc import bounded_model, hierarchical_model, logistic_model, reference  # noqa: E402


class Built:
    """The parallel and PyMC's own functions of each model, built once per session."""

    def __init__(self):
        self.models = {"logistic": logistic_model(), "hierarchical": hierarchical_model(),
                       "bounded": bounded_model()}
        self.parallel = {}
        for name, model in self.models.items():
            fn = synk_pymc.logp_dlogp_function(model)
            fn.set_extra_values({})
            self.parallel[name] = fn
        self.serial = {name: reference(model) for name, model in self.models.items()}
        # 1203 rows in slices of at most 97 rows a process: 13 slices at n=1, 7 at n=2
        self.models["sliced"] = self.models["hierarchical"]
        self.serial["sliced"] = self.serial["hierarchical"]
        fn = synk_pymc.logp_dlogp_function(self.models["sliced"], grainsize=97)
        fn.set_extra_values({})
        self.parallel["sliced"] = fn


def _row_sum(fn):
    """The RowSum Op in fn's graph, or None (PyMC's own function)."""
    ops = [node.op for node in fn._pytensor_function.maker.fgraph.apply_nodes
           if type(node.op).__name__ == "RowSum"]
    return ops[0] if ops else None


def _slices(fn) -> int:
    """The number of slices a process runs, read from the RowSum Op in fn's graph."""
    return _row_sum(fn).num_slices


built = session_fixture(Built)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["logistic", "hierarchical", "sliced"])
def test_logp_dlogp_equal_pymc(built, name):
    n_dim = sum(np.size(v) for v in built.models[name].initial_point().values())
    rng = np.random.default_rng(4)
    for _ in range(3):
        point = rng.normal(scale=0.5, size=n_dim)
        logp, dlogp = built.parallel[name](point)
        want_logp, want_dlogp = built.serial[name](point)
        np.testing.assert_allclose(logp, want_logp, rtol=1e-9)
        np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-9, atol=1e-9)


@pytest.mark.timeout(900)
def test_slices_follow_the_grain(built):
    n = synk.n_parallel()
    assert _slices(built.parallel["sliced"]) == math.ceil(math.ceil(1203 / n) / 97)  # 13, 7, 5
    # by default rows that fit in the cache (at most 16 MiB a process) run in one block;
    # one process in one block has nothing to divide: PyMC's own function, no Op
    if n == 1:
        assert _row_sum(built.parallel["hierarchical"]) is None
    else:
        assert _slices(built.parallel["hierarchical"]) == 1


@pytest.mark.timeout(900)
def test_out_of_support_gives_minus_inf(built):
    # sigma < 0: PyMC's logp is -inf; every process turns its failed check into -inf
    point = np.array([0.5, -1.0])
    logp, _ = built.parallel["bounded"](point)
    want, _ = built.serial["bounded"](point)
    assert want == -np.inf
    assert logp == -np.inf
    good = np.array([0.5, 2.0])
    np.testing.assert_allclose(built.parallel["bounded"](good)[0], built.serial["bounded"](good)[0],
                               rtol=1e-9)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["hierarchical", "sliced"])
def test_one_process_runs_in_place(built, name):
    n = synk.n_parallel()
    point = np.random.default_rng(5).normal(
        scale=0.5, size=sum(np.size(v) for v in built.models[name].initial_point().values()))
    before = testing.commands_run()
    logp, dlogp = built.parallel[name](point)
    # n=1: no command (PyMC's own function in one block, the compiled likelihood called
    # in place in slices); else one command a group of rows
    assert testing.commands_run() - before == (0 if n == 1 else 1)
    want_logp, want_dlogp = built.serial[name](point)
    np.testing.assert_allclose(logp, want_logp, rtol=1e-9)
    np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-9, atol=1e-9)


@pytest.mark.timeout(900)
def test_the_op_checks_values_it_is_given(built):
    # The Op takes the values its likelihood reads as one flat vector (a, b, sigma_log__
    # end to end). Called with what no PyTensor graph hands it: a list is converted by
    # the vector's type, a wrong shape or dtype refused as a call refuses it (at n=1 in
    # place, in slices; else through the command)
    op = _row_sum(built.parallel["sliced"])
    point = built.models["sliced"].initial_point()
    theta = np.concatenate([np.ravel(point[name]) for name in ("a", "b", "sigma_log__")])
    assert op.total == theta.size == 8
    out: list = [[None], [None]]
    op.perform(None, [theta], out)
    loglik, grad = out[0][0], out[1][0].copy()
    op.perform(None, [theta.tolist()], out)
    np.testing.assert_allclose(out[0][0], loglik, rtol=1e-12)
    np.testing.assert_allclose(out[1][0], grad, rtol=1e-12)
    with pytest.raises(TypeError, match="Wrong number of dimensions"):
        op.perform(None, [theta[:, None]], out)
    with pytest.raises(TypeError):
        op.perform(None, [theta.astype("complex128")], out)
    with pytest.raises((TypeError, ValueError)):
        op.perform(None, [theta[:5]], out)


@pytest.mark.timeout(900)
def test_numba_calls_the_op_without_perform(built, monkeypatch):
    # On PyTensor's Numba backend the compiled function calls the Op's own object-mode
    # entry (its evaluate), not PyTensor's fallback through perform
    import pytensor

    if type(pytensor.compile.mode.get_default_mode().linker).__name__ != "NumbaLinker":
        pytest.skip("PyTensor's default linker is not Numba here (PyTensor 2.x compiles "
                    "with C); CI's Python 3.12 environment runs this")
    fn = built.parallel["sliced"]
    point = np.random.default_rng(8).normal(
        scale=0.5, size=sum(np.size(v) for v in built.models["sliced"].initial_point().values()))

    def no_perform(*args):
        raise AssertionError("perform was called")

    monkeypatch.setattr(type(_row_sum(fn)), "perform", no_perform)
    logp, dlogp = fn(point)
    want_logp, want_dlogp = built.serial["sliced"](point)
    np.testing.assert_allclose(logp, want_logp, rtol=1e-9)
    np.testing.assert_allclose(dlogp, want_dlogp, rtol=1e-9, atol=1e-9)


@pytest.mark.timeout(900)
def test_released_likelihood_refuses_to_run(built):
    # grainsize: an Op at every n (4 slices of 100 rows at n=1)
    fn = synk_pymc.logp_dlogp_function(built.models["bounded"], grainsize=100)
    fn.set_extra_values({})
    good = np.array([0.5, 2.0])
    np.testing.assert_allclose(fn(good)[0], built.serial["bounded"](good)[0], rtol=1e-9)
    _row_sum(fn).release()
    with pytest.raises(RuntimeError, match="was released"):
        fn(good)
