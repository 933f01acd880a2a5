"""For tests that call ``engram.cli.main`` in the test process."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def logging_restored() -> Iterator[None]:
    """``main`` points the root logger at the stderr of its moment (pytest's capture,
    closed after the test): put back what was there, so later logs go somewhere."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
