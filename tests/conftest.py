"""Fixtures: one real embedded PostgreSQL (with pgvector) for the whole run,
a fresh database for each test module."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from engram.store import HashingEmbedder, Store
from engram.store.server import EmbeddedPostgres

pytest_plugins = [
    "tests.redis_fixtures",
    "tests.web_fixtures",
    "tests.jobs_fixtures",
    "tests.cluster_fixtures",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse-order",
        action="store_true",
        help="run the tests in reverse order: a test that passes only after another ran fails",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--reverse-order"):
        items.reverse()


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Logging as it was before each test. A test that runs ``engram.cli.main`` in this
    process leaves the root logger writing to that test's captured stderr, closed once
    the test ends: every later record, from any thread, would fail and print a traceback
    (and on CPython 3.11 two threads formatting tracebacks at once can corrupt the AST
    recursion counter they share: "AST constructor recursion depth mismatch")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}
    yield
    for handler in root.handlers[:]:  # pytest adds and removes its own per phase
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    for handler in handlers:  # and the session's, which a test may have replaced
        if type(handler).__name__ != "LogCaptureHandler":
            root.addHandler(handler)  # (no-op if still there)
    root.setLevel(level)
    for name, kept in levels.items():
        logging.getLogger(name).setLevel(kept)


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    kept = os.environ.get("ENGRAM_TEST_HOME")
    home = Path(kept or tempfile.mkdtemp(prefix="engram-test-"))
    server = EmbeddedPostgres(home)
    yield server
    server.stop()
    if not kept:  # a session's cluster takes gigabytes: none is left behind
        shutil.rmtree(home, ignore_errors=True)


def _fresh_database(postgres: EmbeddedPostgres, name: str) -> str:
    db = re.sub(r"[^a-z0-9_]", "_", name.lower())[-60:]
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')
    return postgres.dsn(db)


@pytest.fixture(scope="module")
def dsn(postgres: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    return _fresh_database(postgres, "t_" + request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture
def fresh_dsn(postgres: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    """A database of its own for one test."""
    return _fresh_database(postgres, "f_" + request.node.name)


@pytest.fixture(scope="module")
def store(dsn: str) -> Iterator[Store]:
    s = Store.connect(dsn)
    yield s
    s.close()


@pytest.fixture
def fresh_store(fresh_dsn: str) -> Iterator[Store]:
    s = Store.connect(fresh_dsn)
    yield s
    s.close()


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder(dims=64)


_counter = iter(range(1_000_000))


@pytest.fixture
def scope(request: pytest.FixtureRequest) -> dict[str, str]:
    """A scope no other test uses."""
    return {"user_id": f"u{next(_counter)}-{request.node.name[:40]}"}
