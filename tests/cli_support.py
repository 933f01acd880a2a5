"""For tests that call ``engram.cli.main`` in the test process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

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


def command_env(
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    *,
    redis_url: str,
    database_url: str,
    jobs_redis_url: str | None = None,
    partitions: int | None = None,
) -> None:
    """The environment an ``engram`` command run here reads: its servers and its home;
    no jobs Redis of its own unless ``jobs_redis_url``; ``partitions`` if given."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("ENGRAM_HOME", str(home))
    if jobs_redis_url is None:
        monkeypatch.delenv("ENGRAM_JOBS_REDIS_URL", raising=False)
    else:
        monkeypatch.setenv("ENGRAM_JOBS_REDIS_URL", jobs_redis_url)
    if partitions is not None:
        monkeypatch.setenv("ENGRAM_PARTITIONS", str(partitions))
