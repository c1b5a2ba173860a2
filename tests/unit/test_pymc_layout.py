"""synkhronos.pymc.sample's default layout of chains x processes, without PyMC or a
session (docs/likelihoods.rst states the rule)."""

from __future__ import annotations

from synkhronos.pymc._sampling import _layout


def test_a_chain_at_once_per_core_then_the_cores_divided():
    # (chains, cores=None, processes_per_chain=None, usable cores) -> (at once, processes)
    assert _layout(2, None, None, 2) == (2, 1)  # PyMC's 2 chains on this 2-core machine
    assert _layout(4, None, None, 16) == (4, 4)  # PyMC's 4 chains on 16 cores
    assert _layout(4, None, None, 64) == (4, 16)
    assert _layout(1, None, None, 16) == (1, 16)  # one chain: every core on its rows
    assert _layout(6, None, None, 4) == (4, 1)  # more chains than cores: one core each
    assert _layout(2, None, None, 1) == (1, 1)


def test_cores_and_processes_given():
    assert _layout(4, 2, None, 16) == (2, 8)  # cores: PyMC's chains at once
    assert _layout(2, 4, None, 16) == (2, 8)  # never more at once than chains
    assert _layout(4, 1, None, 16) == (1, 16)  # cores=1: one after another
    assert _layout(4, None, 8, 16) == (2, 8)  # as many as the processes fit in the cores
    assert _layout(4, None, 32, 16) == (1, 32)  # more processes than cores: one at once
    assert _layout(2, 2, 2, 2) == (2, 2)  # both given: taken as they are
