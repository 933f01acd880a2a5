"""Migrations: idempotent, versioned, and a newer database is refused."""

from __future__ import annotations

import psycopg
import pytest

from store import SchemaVersionError, Store, migrations


def test_migrations_apply_once_and_are_idempotent(fresh_dsn: str) -> None:
    with psycopg.connect(fresh_dsn) as conn:
        assert migrations.current_version(conn) == 0
        assert migrations.migrate(conn) == migrations.code_version()
        assert migrations.migrate(conn) == migrations.code_version()
        versions = [r[0] for r in conn.execute("SELECT version FROM engram_schema ORDER BY 1")]
        # Every migration the code ships, once, numbered without gaps: a database at
        # version N has applied every migration up to N.
        assert versions == [version for version, _ in migrations.available()]
        assert versions == list(range(1, len(versions) + 1))
        assert (
            conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[
                0
            ]
            >= "0.8"
        )


def test_a_database_newer_than_the_code_is_refused(fresh_dsn: str) -> None:
    Store.connect(fresh_dsn).close()
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO engram_schema (version) VALUES (999)")
    with pytest.raises(SchemaVersionError, match="newer than this engram"):
        Store.connect(fresh_dsn)


def test_connect_without_migrating_refuses_an_unmigrated_database(fresh_dsn: str) -> None:
    with pytest.raises(SchemaVersionError, match="engram migrate"):
        Store.connect(fresh_dsn, migrate=False)


def test_the_write_load_settings_are_in_place(fresh_dsn: str) -> None:
    """The two settings that keep a steady write load from stalling (see 002 and
    EmbeddedPostgres): a short GIN pending list, and WAL segments not zero-filled."""
    Store.connect(fresh_dsn).close()
    with psycopg.connect(fresh_dsn) as conn:
        options = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'engram_revisions_tsv_idx'"
        ).fetchone()
        assert options == (["gin_pending_list_limit=512"],)
        assert conn.execute("SHOW wal_init_zero").fetchone() == ("off",)
