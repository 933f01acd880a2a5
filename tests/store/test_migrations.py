"""Migrations: idempotent, versioned, and a newer database is refused."""

from __future__ import annotations

import psycopg
import pytest

from engram.store import RevisionConflictError, SchemaVersionError, Store, migrations
from tests.helpers import migrated_to


def test_migrations_apply_once_and_are_idempotent(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn) as conn:
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


def test_connect_without_migrating_refuses_an_unmigrated_database(empty_dsn: str) -> None:
    with pytest.raises(SchemaVersionError, match="engram migrate"):
        Store.connect(empty_dsn, migrate=False)


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


def test_013_drops_the_indexes_that_held_every_row_and_leaves_the_vectors_fresh(
    empty_dsn: str,
) -> None:
    """A database at version 12 with a scope's HNSW index on all its rows: 013 drops it
    (writes would insert into it) and unregisters it, its vectors are fresh, and the
    next index job builds it again on the settled rows."""
    migrated_to(empty_dsn, 12)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO engram_generations (model_id, dims, status) VALUES ('m', 2, 'active');"
            " INSERT INTO engram_scopes (key) VALUES ('{}');"
            " INSERT INTO engram_vectors (generation_id, record_id, scope_id, revision, digest,"
            " status, kind, embedding) SELECT 1, 'r' || i, 1, 1, 'd', 'active', 'semantic',"
            " ARRAY[1, i]::vector FROM generate_series(1, 20) i;"
            " CREATE INDEX engram_vectors_hnsw_g1_s1 ON engram_vectors USING hnsw"
            " ((embedding::vector(2)) vector_cosine_ops) WHERE generation_id = 1 AND scope_id = 1;"
            " INSERT INTO engram_vector_indexes VALUES (1, 1, 'engram_vectors_hnsw_g1_s1')"
        )
        assert migrations.migrate(conn) == migrations.code_version()
        assert conn.execute("SELECT count(*) FROM engram_vector_indexes").fetchone() == (0,)
        assert conn.execute(
            "SELECT to_regclass('engram_vectors_hnsw_g1_s1') IS NULL,"
            " to_regclass('engram_vectors_fresh_idx') IS NOT NULL"
        ).fetchone() == (True, True)
        assert conn.execute(
            "SELECT settled, count(*) FROM engram_vectors GROUP BY 1"
        ).fetchall() == [(False, 20)]
    with Store.connect(empty_dsn) as store:
        assert store.embeddings.index_large_scopes(threshold=10) == ["engram_vectors_hnsw_g1_s1"]
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute(
            "SELECT indexdef LIKE '%settled%' FROM pg_indexes"
            " WHERE indexname = 'engram_vectors_hnsw_g1_s1'"
        ).fetchone() == (True,)


def test_017_keys_the_receipts_and_vouches_stored_before_by_their_scope(empty_dsn: str) -> None:
    """A database at version 16 with a receipt, the records it wrote and named, and a
    token's vouch: 017 gives each row its receipt's (or token's) scope, so the receipt
    reads back the same in its scope, authenticated, and the same operation id in
    another scope is another operation."""
    migrated_to(empty_dsn, 16)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO engram_scopes (key, user_id) VALUES ('{"user_id":"ada"}', 'ada');
            INSERT INTO engram_receipts (operation_id, scope_id, kind, request_digest,
                scope_revision, committed_at, request, requested_by)
            VALUES ('op-1', 1, 'remember', 'x', 1, now(), '{"text": "t"}', 'token:ada');
            INSERT INTO engram_receipt_records VALUES ('op-1', 'mem_1', 1, 'active');
            INSERT INTO engram_receipt_named VALUES ('op-1', 'mem_0');
            INSERT INTO engram_tokens (name, secret_sha256, scope_key, can, created_by)
            VALUES ('ada', '\\x00', '{"user_id":"ada"}', '{remember}', 'test');
            INSERT INTO engram_vouched_operations (operation_id, requested_by, token_id)
            VALUES ('op-1', 'token:ada', 1)"""
        )
        assert migrations.migrate(conn) == migrations.code_version()
        assert conn.execute(
            "SELECT (SELECT scope_id FROM engram_receipt_records),"
            " (SELECT scope_id FROM engram_receipt_named),"
            " (SELECT scope_key FROM engram_vouched_operations)"
        ).fetchone() == (1, 1, '{"user_id":"ada"}')
    with Store.connect(empty_dsn) as store:
        receipt = store.receipt("op-1", {"user_id": "ada"})
        assert receipt is not None and receipt.authenticated
        assert [r.id for r in receipt.records] == ["mem_1"]
        assert store.receipt("op-1", {"user_id": "bob"}) is None
        bob = store.session({"user_id": "bob"}).remember("Bob's.", operation_id="op-1")
        assert not bob.replayed and bob.receipt.scope.user_id == "bob"
        assert store.receipt("op-1", {"user_id": "ada"}) == receipt


def test_019_keys_records_by_scope_and_keeps_every_row(empty_dsn: str) -> None:
    """A database at version 18 with a record (two revisions, a vector, a link to
    another record that supersedes it, its receipts) and a tombstone: 019 keeps every
    row as it was, the store reads them back in their scope, and the same ids in
    another scope are that scope's own records (issue 36 item 3)."""
    tables = (
        "engram_records",
        "engram_revisions",
        "engram_links",
        "engram_vectors",
        "engram_forgotten",
        "engram_receipt_records",
        "engram_receipt_named",
        "engram_receipts",
    )
    migrated_to(empty_dsn, 18)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO engram_scopes (key, user_id, revision)
                VALUES ('{"user_id":"ada"}', 'ada', 4);
            INSERT INTO engram_generations (model_id, dims, status) VALUES ('m', 2, 'active');
            INSERT INTO engram_records VALUES
                ('old', 1, 2, 'active', 'fact', NULL, now(), now()),
                ('new', 1, 1, 'active', 'fact', NULL, now(), now());
            INSERT INTO engram_revisions (record_id, revision, scope_id, text, kind, origin,
                sources, links, status, digest, operation_id, recorded_at, current) VALUES
                ('old', 1, 1, 'Ada lives in Lyon.', 'fact', 'asserted', '[]', '[]', 'active',
                 'd1', 'op-1', now(), false),
                ('old', 2, 1, 'Ada lives in Nice.', 'fact', 'asserted', '[]', '[]', 'active',
                 'd2', 'op-2', now(), true),
                ('new', 1, 1, 'Ada lives in Oslo.', 'fact', 'asserted', '[]',
                 '[{"relation": "supersedes", "id": "old"}]', 'active', 'd3', 'op-3', now(),
                 true);
            INSERT INTO engram_links VALUES (1, 'new', 'supersedes', 'old');
            INSERT INTO engram_vectors (generation_id, record_id, scope_id, revision, digest,
                status, kind, embedding) VALUES (1, 'old', 1, 2, 'd2', 'active', 'fact', '[1,0]');
            INSERT INTO engram_forgotten VALUES ('gone', 1, now(), 'op-4');
            INSERT INTO engram_receipts (operation_id, scope_id, kind, request_digest,
                scope_revision, committed_at) VALUES
                ('op-1', 1, 'remember', 'x', 1, now()), ('op-2', 1, 'revise', 'x', 2, now()),
                ('op-3', 1, 'remember', 'x', 3, now()), ('op-4', 1, 'forget', 'x', 4, now());
            INSERT INTO engram_receipt_records VALUES
                ('op-1', 'old', 1, 'active', 1), ('op-2', 'old', 2, 'active', 1),
                ('op-3', 'new', 1, 'active', 1);
            INSERT INTO engram_receipt_named VALUES ('op-3', 'old', 1)"""
        )
        before = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}
        assert migrations.migrate(conn) == migrations.code_version()
        assert {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in tables} == before
    ada, bob = {"user_id": "ada"}, {"user_id": "bob"}
    with Store.connect(empty_dsn) as store:
        old = store.get(ada, "old")
        assert old is not None and (old.text, old.superseded_by) == ("Ada lives in Nice.", ("new",))
        assert [r.text for r in store.history(ada, "old")] == [
            "Ada lives in Lyon.",
            "Ada lives in Nice.",
        ]
        assert [r.id for r in store.receipt("op-3", ada).records] == ["new"]  # type: ignore[union-attr]
        with pytest.raises(RevisionConflictError):
            store.session(ada).remember("Back?", id="gone")
        mem = store.session(bob)
        for rid in ("old", "new", "gone"):
            assert mem.remember(f"Bob's {rid}.", id=rid).records[0].revision == 1
        assert store.get(ada, "old") == old
        assert store.get(bob, "old").text == "Bob's old."  # type: ignore[union-attr]
