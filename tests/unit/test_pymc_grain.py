"""synkhronos.pymc's choice of slices a process (grainsize), without PyMC or a session."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.pymc._likelihood import _num_slices, check_grainsize


def _rows(rows: int, *widths: int) -> list[tuple[int, int]]:
    """One group of ``rows`` rows of float64 data, one array of each width."""
    return [(rows, 8 * sum(widths))]


def test_rows_that_fit_the_cache_run_in_one_block():
    # the hierarchical GLM's 64 bytes a row: 10^5 rows over 2 processes is 3.2 MB each
    assert _num_slices(_rows(100_000, 5, 1, 1, 1), 2, None) == 1
    assert _num_slices(_rows(262_144, 5, 1, 1, 1), 1, None) == 1  # 16 MiB exactly


def test_larger_rows_run_in_slices_of_about_one_mib():
    # 10^6 rows over 2 processes, 64 bytes a row: 500 000 rows in blocks of 16 384
    assert _num_slices(_rows(1_000_000, 5, 1, 1, 1), 2, None) == 31
    # 88 bytes a row (the logistic regression): blocks of 11 915 rows; 3 uneven processes
    assert _num_slices(_rows(1_000_000, 10, 1), 3, None) == 28


def test_several_lengths_are_cut_by_the_longest_one_s_rows():
    # One call runs every group: its positions are the longest group's rows, the
    # others' in proportion, and the bytes of every group's rows count. 300 000
    # positions of 49 bytes each (40 + 3 000 x 800 / 300 000): 7.35 MB a process
    assert _num_slices([(300_000, 40), (3_000, 800), (1, 8)], 2, None) == 1
    # 1.5 x 10^6 positions of 48 bytes (40 + 8): 36 MB a process, blocks of 21 845
    assert _num_slices([(1_500_000, 40), (30_000, 400)], 2, None) == 35
    # grainsize: positions (101 on the first of 3 processes), in blocks of 13
    assert _num_slices([(301, 8), (40, 8), (2, 8), (1, 8), (7, 8)], 3, 13) == 8
    assert _num_slices([(5, 8), (2, 8)], 2, 1) == 3


def test_a_given_grainsize_counts_rows():
    assert _num_slices(_rows(1203, 1), 1, 97) == 13
    assert _num_slices(_rows(1203, 1), 2, 97) == 7  # 602 rows on the first process
    assert _num_slices(_rows(1203, 1), 3, 1203) == 1
    assert _num_slices(_rows(10, 1), 2, 1) == 5


@pytest.mark.parametrize("bad", [2.5, "64", True, [64]])
def test_grainsize_must_be_a_whole_number(bad):
    with pytest.raises(TypeError, match="grainsize must be a whole number of rows"):
        check_grainsize(bad)


def test_grainsize_must_be_positive():
    with pytest.raises(ValueError, match="at least 1 row; got 0"):
        check_grainsize(0)
    assert check_grainsize(np.int64(5)) == 5
    assert check_grainsize(None) is None
