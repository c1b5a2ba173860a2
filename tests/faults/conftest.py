"""The fault suite's stress mode, for failures too rare to see in one run.

``SYNK_STRESS_ROUNDS=N python -m pytest tests/faults/test_crash_table.py`` runs every
selected test ``N`` times, round after round (the whole selection, then again, so
that each test also follows every other one), each with the id suffix ``roundK``;
``-x`` stops at the first failure, and pytest's summary lists which rounds failed.
Without the variable (or with 1) nothing changes.
"""

from __future__ import annotations

import os

import pytest

ROUNDS = int(os.environ.get("SYNK_STRESS_ROUNDS") or 1)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if ROUNDS > 1:
        metafunc.fixturenames.append("stress_round")
        metafunc.parametrize("stress_round", range(ROUNDS), ids=lambda r: f"round{r}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if ROUNDS > 1:  # a stable sort: each round keeps the suite's own order
        items.sort(key=lambda item: getattr(item, "callspec", None) and
                   item.callspec.params.get("stress_round", 0) or 0)
