"""Which NUTS ``synkhronos.pymc.sample`` runs when ``nuts_sampler`` is not given: the
fastest installed, nutpie, where every keyword has an equivalent there and the mode
compiles with Numba or JAX (nutpie's backends); otherwise PyMC's own NUTS. The same
rule on PyMC 5 and 6.

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra (one with nutpie, one without).
"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("pymc", reason="PyMC is not installed here; .ci/run runs this module "
                    "in its environments with the pymc extra")

from synkhronos.pymc._sampling import _default_sampler  # noqa: E402


def _default(**kwargs):
    compile_kwargs = kwargs.pop("compile_kwargs", {})
    return _default_sampler(dict(draws=10, **kwargs), compile_kwargs)


def test_without_nutpie_it_is_pymcs_nuts():
    if importlib.util.find_spec("nutpie") is not None:
        pytest.skip("nutpie is installed here; the next test")
    assert _default() == "pymc"
    assert _default(compile_kwargs={"mode": "NUMBA"}) == "pymc"


def test_nutpie_where_installed_and_nothing_rules_it_out():
    if importlib.util.find_spec("nutpie") is None:
        pytest.skip("nutpie is not installed here (optional; CI's Python 3.12 "
                    "environment has it)")
    from pytensor.compile.mode import Mode, get_mode
    from pytensor.link.numba.linker import NumbaLinker

    numba = isinstance(get_mode(None).linker, NumbaLinker)
    assert _default() == ("nutpie" if numba else "pymc")
    assert _default(compile_kwargs={"mode": "NUMBA"}) == "nutpie"
    # a mode neither Numba nor JAX (here PyTensor's Python linker)
    assert _default(compile_kwargs={"mode": Mode(linker="py")}) == "pymc"
    assert _default(initvals={"mu": 0.0}, chains=2) == ("nutpie" if numba else "pymc")
    # what nutpie cannot run
    assert _default(callback=print) == "pymc"
    assert _default(init="adapt_diag") == "pymc"
    assert _default(return_inferencedata=False) == "pymc"
    assert _default(initvals=[{"mu": 0.0}, {"mu": 1.0}]) == "pymc"
    assert _default(mp_ctx="fork") == "pymc"
