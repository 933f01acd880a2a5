"""Fixtures: one real embedded PostgreSQL (with pgvector) for the whole run,
a fresh database for each test module.

The session's server is not durable (``fsync`` and ``full_page_writes`` off): no
test crashes it, and a test that kills PostgreSQL starts a durable one of its own.
Its databases are copies of one migrated once per session (``CREATE DATABASE ...
TEMPLATE``), so a test's database is at the code's schema version from the start;
``empty_dsn`` is one with nothing in it."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from engram.store import HashingEmbedder, Store, migrations
from engram.store.server import EmbeddedPostgres

pytest_plugins = [
    "tests.redis_fixtures",
    "tests.web_fixtures",
    "tests.jobs_fixtures",
    "tests.cluster_fixtures",
    "tests.oauth_fixtures",
]


# The suite runs on pytest-xdist's workers (``-n auto --dist loadfile`` in
# pyproject.toml): a test module stays on one worker, with its module's database and
# browser, and each worker starts its own session servers, so no two workers share a
# PostgreSQL or a valkey. ``-n 0`` runs it in this one process (for a debugger).
MAX_WORKERS = 4  # each holds its own servers and browser: a big machine is not filled


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per CPU this process may run on, at most ``MAX_WORKERS``
    (``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set)."""
    if chosen := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(chosen)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, cpus or 1))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse-order",
        action="store_true",
        help="run the tests in reverse order: a test that passes only after another ran fails",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slowest_modules_first(items)
    if config.getoption("--reverse-order"):
        items.reverse()


def _slowest_modules_first(items: list[pytest.Item]) -> None:
    """The modules with the most ``slow`` tests (real processes started, killed and
    waited for: up to minutes each) first, then the others with the most tests first.
    xdist hands a worker the next module in this order each time it finishes one
    (``--dist loadfile --no-loadscope-reorder`` in pyproject.toml; its own reordering
    counts only tests): a slow module handed out last would run alone at the end while
    the other workers idle; handed out first, the quick ones fill in around it."""
    slow: dict[str, int] = {}
    tests: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)
        tests[module] = tests.get(module, 0) + 1

    def weight(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::", 1)[0]
        return -slow[module], -tests[module]

    items.sort(key=weight)  # stable: a module's own tests keep their order


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


# Durability the session's server does without: a crash of the machine would lose its
# last commits and could corrupt it, but the suite's databases do not outlive the run.
# (``synchronous_commit`` stays on: with fsync off, a commit's flush is only a write, and
# off it would hold a commit's WAL back from the streaming replicas until the WAL
# writer's next round, so that the replica tests' reads of a write just made would
# never find the replica caught up: test_read_your_writes_never_misses.)
NOT_DURABLE = {"fsync": "off", "full_page_writes": "off"}
# The database every test's database is copied from, migrated once per session. Nothing
# connects to it once migrated (PostgreSQL copies only a database nobody is connected to).
TEMPLATE = "engram_migrated_template"


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    kept = os.environ.get("ENGRAM_TEST_HOME")
    home = Path(kept or tempfile.mkdtemp(prefix="engram-test-"))
    server = EmbeddedPostgres(home)
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        for name, value in NOT_DURABLE.items():  # each takes effect at a reload
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), value))
        conn.execute("SELECT pg_reload_conf()")
        _create_template(conn, server)
    yield server
    server.stop()
    if not kept:  # a session's cluster takes gigabytes: none is left behind
        shutil.rmtree(home, ignore_errors=True)


def _create_template(conn: psycopg.Connection, server: EmbeddedPostgres) -> None:
    """``TEMPLATE`` afresh (a kept ``ENGRAM_TEST_HOME`` has an older one), migrated,
    then closed to connections so that every copy finds it free."""
    conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
    conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    with psycopg.connect(server.dsn(TEMPLATE)) as template:
        migrations.migrate(template)
    conn.execute(f'ALTER DATABASE "{TEMPLATE}" WITH ALLOW_CONNECTIONS false')


# The databases of the tests (and modules) that have ended, dropped as the next is made:
# by then every fixture of their test has let go of them, and a cluster that keeps only
# the databases in use stays small, for the replicas its tests copy with pg_basebackup
# (which otherwise copied every database the run had made so far) and for its stop.
_ENDED: list[str] = []


def _fresh_database(postgres: EmbeddedPostgres, name: str, *, migrated: bool = True) -> str:
    db = re.sub(r"[^a-z0-9_]", "_", name.lower())[-60:]
    create = f'CREATE DATABASE "{db}"' + (f' TEMPLATE "{TEMPLATE}"' if migrated else "")
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        _drop_ended(conn)
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        for attempt in range(50):  # autovacuum may be visiting the template: it gives way
            try:
                conn.execute(create)
                break
            except psycopg.errors.ObjectInUse:
                if attempt == 49:
                    raise
                time.sleep(0.1)
    return postgres.dsn(db)


def _drop_ended(conn: psycopg.Connection) -> None:
    """Drop the ended tests' databases; one still held (a process of its test that has
    not let go yet) is tried again at the next."""
    for db in list(_ENDED):
        try:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        except psycopg.errors.ObjectInUse:
            continue
        _ENDED.remove(db)


def _database_of(dsn: str) -> Iterator[str]:
    """``dsn`` for the test (or module), then its database marked ended."""
    yield dsn
    _ENDED.append(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


@pytest.fixture(scope="module")
def dsn(postgres: EmbeddedPostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated database for one test module."""
    name = "t_" + request.module.__name__.rsplit(".", 1)[-1]
    yield from _database_of(_fresh_database(postgres, name))


@pytest.fixture
def fresh_dsn(postgres: EmbeddedPostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated database of its own for one test."""
    yield from _database_of(_fresh_database(postgres, "f_" + request.node.name))


@pytest.fixture
def empty_dsn(postgres: EmbeddedPostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of its own for one test, with nothing in it (not even pgvector): for
    the tests of the migrations themselves."""
    yield from _database_of(_fresh_database(postgres, "e_" + request.node.name, migrated=False))


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
