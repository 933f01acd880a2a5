"""The PostgreSQL listener: after it, the forgotten words are out of the full-text
index's file, and the dead row versions out of the table (its pages may keep the
bytes until reused: see docs/jobs.md and bench/redaction_residue.py)."""

from __future__ import annotations

from pathlib import Path

import psycopg

from engram.jobs.listeners.in_postgres import PostgresListener
from engram.store import ForgetEvent, HashingEmbedder, Store
from engram.store.server import EmbeddedPostgres
from engram.store.write.forgets import FORGET_TABLES
from tests.helpers import marker_text
from tests.jobs_fixtures import context


def relation_bytes(postgres: EmbeddedPostgres, dsn: str, relation: str) -> bytes:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        row = conn.execute("SELECT pg_relation_filepath(%s)", (relation,)).fetchone()
    assert row is not None
    path = Path(postgres.data_dir) / row[0]
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def dead_rows(dsn: str) -> int:
    """The dead row versions in the pages of the tables a forget touches, counted by
    reading the pages (``pgstattuple``): the statistics' ``n_dead_tup`` lags, and says
    0 before any VACUUM ran."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        row = conn.execute(
            "SELECT sum((pgstattuple(t)).dead_tuple_count) FROM unnest(%s::text[]) AS t",
            (list(FORGET_TABLES),),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_listener_vacuums_and_rebuilds_the_full_text_index(
    postgres: EmbeddedPostgres, fresh_store: Store, fresh_dsn: str, redis_url: str
) -> None:
    word = marker_text().lower()
    events: list[ForgetEvent] = []
    mem = fresh_store.session(
        {"user_id": "ada"}, embedder=HashingEmbedder(64), on_forget=[events.append]
    )
    for i in range(200):
        mem.remember(f"Unrelated note {i}.")
    fact = mem.remember(f"The door code is {word}.").records[0]
    mem.forget(fact.id)
    assert word.encode() in relation_bytes(postgres, fresh_dsn, "engram_revisions_tsv_idx")
    assert dead_rows(fresh_dsn) > 0

    PostgresListener(context(fresh_store, redis_url))(events)

    assert word.encode() not in relation_bytes(postgres, fresh_dsn, "engram_revisions_tsv_idx")
    assert dead_rows(fresh_dsn) == 0
    with psycopg.connect(fresh_dsn) as conn:  # the rebuilt index serves searches
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(
            "EXPLAIN SELECT 1 FROM engram_revisions"
            " WHERE tsv @@ to_tsquery('engram_text', 'unrelated')"
        ).fetchall()
        assert "engram_revisions_tsv_idx" in str(plan)
        found = conn.execute(
            "SELECT count(*) FROM engram_revisions"
            " WHERE tsv @@ to_tsquery('engram_text', 'unrelated')"
        ).fetchone()
    assert found == (200,)


def statistics_text(dsn: str) -> str:
    """What ANALYZE keeps about the records' tables: sample values and words."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT string_agg(concat_ws(' ', most_common_vals::text, histogram_bounds::text,"
            " most_common_elems::text), ' ') FROM pg_stats"
            " WHERE tablename IN ('engram_revisions', 'engram_records', 'engram_receipts')"
        ).fetchone()
    return str(row[0] if row else "")


def test_the_listener_refreshes_the_statistics_that_sampled_the_text(
    fresh_store: Store, fresh_dsn: str, redis_url: str
) -> None:
    word = marker_text().lower()
    events: list[ForgetEvent] = []
    mem = fresh_store.session(
        {"user_id": "ada"}, embedder=HashingEmbedder(64), on_forget=[events.append]
    )
    mem.remember("Unrelated note.")
    mem.remember("Another note.")
    fact = mem.remember(f"The door code is {word}.").records[0]
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")
    assert word in statistics_text(fresh_dsn)  # a small table is sampled whole
    mem.forget(fact.id)

    PostgresListener(context(fresh_store, redis_url))(events)

    assert word not in statistics_text(fresh_dsn)
