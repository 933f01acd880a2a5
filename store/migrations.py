"""Versioned SQL migrations, applied idempotently at start.

Files ``migrations/NNN_name.sql`` run in order, each in its own transaction
with the version bump, under an advisory lock so concurrent starters wait for
one another. A database already newer than this code is refused.
"""

from __future__ import annotations

import logging
import re
from importlib import resources

import psycopg

from .errors import SchemaVersionError

log = logging.getLogger(__name__)
_LOCK_KEY = 0x656E6772616D  # "engram"
_FILE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


def available() -> list[tuple[int, str]]:
    files = resources.files("engram.store") / "migrations"
    found = []
    for entry in files.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text()))
    return sorted(found)


def code_version() -> int:
    return available()[-1][0]


def current_version(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT to_regclass('engram_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    version = conn.execute("SELECT max(version) FROM engram_schema").fetchone()
    return int(version[0]) if version and version[0] is not None else 0


def migrate(conn: psycopg.Connection) -> int:
    """Bring the schema to this code's version; return the version applied."""
    _require_pgvector(conn)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS engram_schema ("
            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        have = current_version(conn)
        newest = code_version()
        if have > newest:
            raise SchemaVersionError(
                f"the database schema is at version {have}, newer than this engram "
                f"(which knows up to {newest}): upgrade engram, do not downgrade the schema"
            )
        for version, sql in available():
            if version <= have:
                continue
            with conn.transaction():
                conn.execute(sql.encode())  # our own shipped SQL, several statements
                conn.execute("INSERT INTO engram_schema (version) VALUES (%s)", (version,))
            log.info("applied migration", extra={"schema_version": version})
        return newest


def _require_pgvector(conn: psycopg.Connection) -> None:
    row = conn.execute(
        "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector'),"
        " EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')"
    ).fetchone()
    assert row is not None
    installed, available_ = row
    if installed:
        return
    if not available_:
        raise SchemaVersionError(
            "PostgreSQL has no pgvector extension: install pgvector (0.8 or newer) on the server"
        )
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SchemaVersionError(
            "pgvector is installed on the server but not enabled in this database, and this "
            "role may not enable it: run CREATE EXTENSION vector as an owner"
        ) from exc
