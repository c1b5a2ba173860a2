"""Which NUTS ``synkhronos.pymc.sample`` runs when ``nuts_sampler`` is not given:
``pm.sample``'s own choice (PyMC 6: nutpie where it is installed and nothing asked
for rules it out; PyMC 5: its own NUTS), read from the installed PyMC.

PyMC is not in the ``test`` extra: CI runs this module in its environments with the
``pymc`` extra (one with nutpie, one without).
"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("pymc", reason="PyMC is not installed here; .ci/run runs this module "
                    "in its environments with the pymc extra")

from synkhronos.pymc import _pymc_compat as compat  # noqa: E402
from synkhronos.pymc._sampling import _NUTPIE_KEYWORDS  # noqa: E402


def _default(**kwargs):
    compile_kwargs = kwargs.pop("compile_kwargs", {})
    return compat.default_nuts_sampler(dict(draws=10, **kwargs), compile_kwargs,
                                       _NUTPIE_KEYWORDS)


def test_pymc_5_is_its_own_nuts():
    if compat.pymc_default_sampler_is_auto():
        pytest.skip("this PyMC's pm.sample chooses its sampler (PyMC 6); the next tests")
    assert _default() == "pymc"


def test_pymc_6_takes_nutpie_where_pm_sample_would():
    if not compat.pymc_default_sampler_is_auto():
        pytest.skip("this PyMC's pm.sample runs its own NUTS by default (PyMC 5)")
    if importlib.util.find_spec("nutpie") is None:
        assert _default() == "pymc"
        return
    from pytensor.compile.mode import Mode, get_mode
    from pytensor.link.numba.linker import NumbaLinker

    numba = isinstance(get_mode(None).linker, NumbaLinker)
    assert _default() == ("nutpie" if numba else "pymc")
    assert _default(compile_kwargs={"mode": "NUMBA"}) == "nutpie"
    # a mode neither Numba nor JAX (here PyTensor's Python linker)
    assert _default(compile_kwargs={"mode": Mode(linker="py")}) == "pymc"
    assert _default(initvals={"mu": 0.0}, chains=2) == ("nutpie" if numba else "pymc")
    # what pm.sample itself rules out
    assert _default(callback=print) == "pymc"
    assert _default(init="adapt_diag") == "pymc"
    assert _default(return_inferencedata=False) == "pymc"
    assert _default(initvals=[{"mu": 0.0}, {"mu": 1.0}]) == "pymc"
    # and a keyword the nutpie route here has no equivalent for
    assert _default(mp_ctx="fork") == "pymc"
