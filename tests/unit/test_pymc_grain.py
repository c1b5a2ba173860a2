"""synkhronos.pymc's choice of slices a process (grainsize), without PyMC or a session."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from synkhronos.pymc._likelihood import _num_slices, check_grainsize


def _rows(*widths: int) -> list:
    """Stand-ins for the rows' synk.Data: one float64 row of each width."""
    return [SimpleNamespace(data=np.zeros((1, w))) for w in widths]


def test_rows_that_fit_the_cache_run_in_one_block():
    # the hierarchical GLM's 64 bytes a row: 10^5 rows over 2 processes is 3.2 MB each
    assert _num_slices(_rows(5, 1, 1, 1), 100_000, 2, None) == 1
    assert _num_slices(_rows(5, 1, 1, 1), 262_144, 1, None) == 1  # 16 MiB exactly


def test_larger_rows_run_in_slices_of_about_one_mib():
    # 10^6 rows over 2 processes, 64 bytes a row: 500 000 rows in blocks of 16 384
    assert _num_slices(_rows(5, 1, 1, 1), 1_000_000, 2, None) == 31
    # 88 bytes a row (the logistic regression): blocks of 11 915 rows; 3 uneven processes
    assert _num_slices(_rows(10, 1), 1_000_000, 3, None) == 28


def test_a_given_grainsize_counts_rows():
    assert _num_slices(_rows(1), 1203, 1, 97) == 13
    assert _num_slices(_rows(1), 1203, 2, 97) == 7  # 602 rows on the first process
    assert _num_slices(_rows(1), 1203, 3, 1203) == 1
    assert _num_slices(_rows(1), 10, 2, 1) == 5


@pytest.mark.parametrize("bad", [2.5, "64", True, [64]])
def test_grainsize_must_be_a_whole_number(bad):
    with pytest.raises(TypeError, match="grainsize must be a whole number of rows"):
        check_grainsize(bad)


def test_grainsize_must_be_positive():
    with pytest.raises(ValueError, match="at least 1 row; got 0"):
        check_grainsize(0)
    assert check_grainsize(np.int64(5)) == 5
    assert check_grainsize(None) is None
