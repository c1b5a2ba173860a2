"""Unit tests for synkhronos.steps.Balancer (synkhronos/_balance.py): shares of the
rows from measured seconds."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos._scatter import weighted_counts
from synkhronos.steps import Balancer


def simulate(balancer: Balancer, per_row: list[float], steps: int, rows: int = 512,
             fixed: float = 0.0, noise: float = 0.0, seed: int = 0) -> list[list[int]]:
    """Steps of ``rows`` rows on processes taking ``fixed + per_row[i] * rows_i``
    seconds (times a random factor ``1 +- noise``); the counts of every step."""
    rng = np.random.default_rng(seed)
    history = []
    for _ in range(steps):
        shares = balancer.shares()
        counts = (weighted_counts(rows, shares) if shares is not None
                  else weighted_counts(rows, (1.0,) * balancer.parts))
        history.append(counts)
        balancer.record([
            (c, (fixed + a * c) * (1 + noise * rng.uniform(-1, 1)))
            for c, a in zip(counts, per_row, strict=True)])
    return history


def test_even_split_until_every_process_is_measured():
    balancer = Balancer(2, window=8, skip=2)
    assert balancer.shares() is None
    for _ in range(2 + 3):  # skipped, then 3 of the 4 needed
        balancer.record([(10, 1.0), (10, 2.0)])
        assert balancer.shares() is None
    balancer.record([(10, 1.0), (10, 2.0)])
    assert balancer.shares() == pytest.approx((2 / 3, 1 / 3))
    assert balancer.in_use == balancer.shares()


def test_a_process_that_ran_nothing_gives_no_measurement():
    balancer = Balancer(2, window=2, skip=0)
    balancer.record([(10, 1.0), None])
    balancer.record([(10, 1.0), (0, 0.0)])
    assert balancer.shares() is None  # rank 1 never measured


def test_shares_converge_to_equal_times_with_a_fixed_cost():
    # rank 1 is 10% slower per row; every call also costs 2 ms whatever its rows
    per_row = [1e-4, 1.1e-4]
    history = simulate(Balancer(2), per_row, steps=80, fixed=2e-3)
    counts = history[-1]
    times = [2e-3 + a * c for a, c in zip(per_row, counts, strict=True)]
    assert counts[0] > counts[1]
    assert abs(times[0] - times[1]) < 0.01 * max(times)  # the tolerance: 0.5% of rows
    assert history[-10:] == [counts] * 10  # settled: the same message every step


def test_noise_moves_the_split_little_and_seldom():
    # equal speeds, each step's seconds +-10%: the even split, give or take 1.5% of
    # the rows, changed now and then (each change sends a new message)
    changes = []
    for seed in range(4):
        balancer = Balancer(2)
        history = simulate(balancer, [1e-4, 1e-4], steps=400, noise=0.1, seed=seed)
        assert all(abs(counts[0] - 256) <= 8 for counts in history)
        changes.append(balancer.changes)
    assert sum(changes) / len(changes) < 40


def test_an_outlier_step_counts_for_nothing():
    balancer = Balancer(2, window=8, skip=0)
    for step in range(8):
        slow = 100.0 if step == 3 else 1.0  # one step of rank 0 slowed by another program
        balancer.record([(10, slow), (10, 1.0)])
    assert balancer.shares() is None  # still equal: no reason to move


def test_a_slower_core_moves_the_rows():
    balancer = Balancer(3)
    history = simulate(balancer, [1e-4, 2e-4, 1e-4], steps=60, noise=0.02)
    assert history[0] == [171, 171, 170]
    assert history[-1][1] == pytest.approx(512 / 5, abs=3)
    # the machine changes: rank 0 now the slow one; the split follows
    history = simulate(balancer, [2e-4, 1e-4, 1e-4], steps=60, noise=0.02, seed=1)
    assert history[-1][0] == pytest.approx(512 / 5, abs=3)


def test_needs_two_processes():
    with pytest.raises(ValueError, match="at least 2 processes; got 1"):
        Balancer(1)
