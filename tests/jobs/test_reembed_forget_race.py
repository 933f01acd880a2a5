"""A re-embedding storing a vector while a forget of its record commits: no vector of
the forgotten record may be left, in any generation. Real PostgreSQL, the two
interleaved on purpose (a third connection holds the re-embedding's insert after
its snapshot saw the record, until the forget has committed or is waiting)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from engram.jobs.listeners.in_postgres import PostgresListener
from engram.store import ForgetEvent, HashingEmbedder, Operation, Store
from engram.store.vectors.embeddings import VectorItem
from tests.jobs_fixtures import context
from tests.redis_fixtures import wait_until

SCOPE = {"user_id": "ada-race"}


def _vectors_of(dsn: str, record_id: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT generation_id FROM engram_vectors WHERE record_id = %s ORDER BY 1",
            (record_id,),
        ).fetchall()
    return [r[0] for r in rows]


def _waiting_on_locks(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_vector_stored_while_its_record_is_forgotten_does_not_outlive_the_forget(
    fresh_store: Store, fresh_dsn: str
) -> None:
    [made] = fresh_store.execute(
        [Operation.build("remember", SCOPE, {"text": "Ada's locker code is 4711."})],
        HashingEmbedder(64),
    )
    record_id = made.records[0].id  # type: ignore[union-attr]
    pending = fresh_store.embeddings.begin("other-model", 8)
    [item] = fresh_store.embeddings.pending(pending.id)
    vector = VectorItem(
        item.scope_id, item.record_id, item.revision, item.digest, np.ones(8, dtype=np.float32)
    )

    # A row of the same key, uncommitted: the re-embedding's INSERT, once it has read
    # the record (its snapshot), waits for this transaction to end.
    with psycopg.connect(fresh_dsn) as holder:
        holder.execute(
            "INSERT INTO engram_vectors (generation_id, record_id, scope_id, revision, digest,"
            " status, kind, embedding) SELECT %s, id, scope_id, revision, 'held', status, kind,"
            " %s::vector FROM engram_records WHERE id = %s",
            (pending.id, "[" + ",".join(["0"] * 8) + "]", record_id),
        )
        put, put_out = _in_thread(lambda: fresh_store.embeddings.put(pending.id, [vector]))
        wait_until(lambda: _waiting_on_locks(fresh_dsn) >= 1, what="the insert to wait")
        forget, forget_out = _in_thread(
            lambda: fresh_store.execute([Operation.build("forget", SCOPE, {"id": record_id})], None)
        )
        # The forget commits, or waits for the re-embedding's transaction: either way
        # it has gone as far as it can before the insert goes on.
        wait_until(
            lambda: not forget.is_alive() or _waiting_on_locks(fresh_dsn) >= 2,
            what="the forget to commit or wait",
        )
        holder.rollback()
    put.join(timeout=30)
    forget.join(timeout=30)
    assert not put.is_alive() and not forget.is_alive()
    assert "error" not in put_out and "error" not in forget_out, (put_out, forget_out)
    assert fresh_store.get(SCOPE, record_id) is None
    assert _vectors_of(fresh_dsn, record_id) == [], "a vector of the forgotten record is left"


def test_the_postgres_listener_deletes_a_vector_left_for_a_forgotten_record(
    fresh_store: Store, fresh_dsn: str, redis_url: str
) -> None:
    """Defence in depth: whatever stored it, a vector of a tombstoned id is deleted
    before the listener's VACUUM."""
    events: list[ForgetEvent] = []
    mem = fresh_store.session(SCOPE, embedder=HashingEmbedder(64), on_forget=[events.append])
    kept = mem.remember("Bob likes jazz.").records[0]
    fact = mem.remember("Ada's locker code is 4711.").records[0]
    mem.forget(fact.id)
    with psycopg.connect(fresh_dsn) as conn:  # what the race used to leave
        conn.execute(
            "INSERT INTO engram_vectors (generation_id, record_id, scope_id, revision, digest,"
            " status, kind, embedding) SELECT generation_id, %s, scope_id, revision, digest,"
            " status, kind, embedding FROM engram_vectors WHERE record_id = %s",
            (fact.id, kept.id),
        )
    assert _vectors_of(fresh_dsn, fact.id) != []

    PostgresListener(context(fresh_store, redis_url))(events)

    assert _vectors_of(fresh_dsn, fact.id) == []
    assert _vectors_of(fresh_dsn, kept.id) != []
