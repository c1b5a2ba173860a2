"""Fixtures the integration modules share."""

from __future__ import annotations

import pytest

import synkhronos as synk


@pytest.fixture
def two():
    """A session of two processes, closed after the test."""
    synk.fork(2)
    try:
        yield 2
    finally:
        synk.close()
