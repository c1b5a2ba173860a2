"""synkhronos.pymc.sample's default layout of chains x processes, without PyMC or a
session (docs/likelihoods.rst states the rule)."""

from __future__ import annotations

from synkhronos.pymc._sampling import _layout


def test_pymc_cores_at_once_then_the_cores_divided():
    # (chains, cores, processes_per_chain, usable cores, PyMC's default cores)
    #   -> (chains at once, processes per chain)
    assert _layout(2, None, None, 2, 1) == (1, 2)  # PyMC's defaults on this 2-core machine
    assert _layout(4, None, None, 16, 4) == (4, 4)  # PyMC's defaults on 16 cores
    assert _layout(4, None, None, 64, 4) == (4, 16)
    assert _layout(2, None, None, 4, 2) == (2, 2)
    assert _layout(1, None, None, 16, 4) == (1, 16)  # one chain: every core on its rows
    assert _layout(2, None, None, 1, 1) == (1, 1)
    assert _layout(4, None, None, 2, 4) == (2, 1)  # a job given 2 cores of a big machine


def test_cores_and_processes_given():
    assert _layout(4, 2, None, 16, 4) == (2, 8)  # cores: PyMC's chains at once
    assert _layout(2, 4, None, 16, 4) == (2, 8)  # never more at once than chains
    assert _layout(4, 1, None, 16, 4) == (1, 16)  # cores=1: one after another
    assert _layout(2, 2, None, 2, 1) == (2, 1)
    assert _layout(4, None, 8, 16, 4) == (2, 8)  # as many as the processes fit in the cores
    assert _layout(4, None, 2, 16, 4) == (4, 2)  # never more than PyMC's cores
    assert _layout(4, None, 32, 16, 4) == (1, 32)  # more processes than cores: one at once
    assert _layout(2, 2, 2, 2, 1) == (2, 2)  # both given: taken as they are
