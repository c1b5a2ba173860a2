"""A short soak: calls and fork/close cycles return every resource to its baseline.

The long version is ``benchmarks/soak.py`` (100 000 calls, 50 cycles); both run
``tests/support/soak.py``.
"""

from __future__ import annotations

import pytest

from ..support.soak import soak


@pytest.mark.timeout(240)
def test_short_soak_returns_to_baseline():
    result = soak(calls=2000, cycles=8, n=2)
    base, final = result["baseline"], result["final"]
    assert final["children"] == base["children"] == 0
    # No descriptor opened since the baseline is left open. (One open at the baseline
    # may have closed meanwhile: in a whole test run, an earlier test's file or pipe
    # that the collector finished during the soak.)
    opened = {fd: target for fd, target in final["fds"].items()
              if base["fds"].get(fd) != target}
    assert not opened, opened
    assert final["shm_entries"] == base["shm_entries"] == 0
    assert result["rss_growth_after_calls_ratio"] < 1.02, result
    assert result["rss_growth_beyond_pytensor_ratio"] < 1.02, result
