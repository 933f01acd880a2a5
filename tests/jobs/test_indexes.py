"""A scope that grows past the large-scope threshold gets its HNSW index from the
jobs worker's schedule, with no reembed and no restart."""

from __future__ import annotations

import contextlib
import time

import psycopg
import pytest
import redis

from engram.jobs import schedule
from engram.store import HashingEmbedder, Operation, Scope, Store
from engram.store.limits import LARGE_SCOPE_VECTORS
from engram.store.read.recall import _statement, recall_context
from engram.web import rqjobs
from tests.jobs_fixtures import context, run_burst


def indexes(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT s.key, i.index_name FROM engram_vector_indexes i"
            " JOIN engram_scopes s ON s.id = i.scope_id JOIN pg_indexes p"
            " ON p.indexname = i.index_name ORDER BY 1"
        ).fetchall()


def enqueue_upkeep(client: redis.Redis) -> dict[str, str]:
    """The upkeep schedules' jobs, enqueued as the jobs worker's ticker does; by name."""
    upkeep = schedule.upkeep_schedules()
    ids = schedule.enqueue_due(client, upkeep, time.time())
    return dict(zip([s.name for s in upkeep], ids, strict=True))


def test_a_scope_that_grew_large_gets_its_index_on_schedule(
    fresh_store: Store, fresh_dsn: str, redis_url: str, redis_client: redis.Redis
) -> None:
    embedder = HashingEmbedder(64)
    # Texts of their own words: vectors far enough apart for an approximate search; twice
    # the threshold, for the planner to prefer the index to reading the scope.
    count = 2 * LARGE_SCOPE_VECTORS
    texts = [f"w{i} x{i * 7919 % 10007} y{i * 104729 % 20011}" for i in range(count)]
    grown = [Operation.build("remember", {"user_id": "grown"}, {"text": t}) for t in texts]
    for i in range(0, len(grown), 1000):
        fresh_store.execute(grown[i : i + 1000], embedder)
    fresh_store.session({"user_id": "small"}, embedder=embedder).remember("tea, once")
    before = fresh_store.session({"user_id": "grown"}, embedder=embedder).recall(texts[7])
    assert indexes(fresh_dsn) == []
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE engram_vectors")  # as autovacuum would: every row fresh

    job_id = enqueue_upkeep(redis_client)["index-large-scopes"]
    run_burst(context(fresh_store, redis_url), redis_url)

    job = rqjobs.get(redis_client, job_id)
    assert job is not None and job.state == "finished"
    [(key, name)] = indexes(fresh_dsn)
    assert '"grown"' in key and job.result == [name]
    # Recall in that scope is planned through the new index now (approximate: the exact
    # match may rank lower than first in the vector list, but the fused hits hold it).
    with fresh_store.pool.connection() as conn:
        found = recall_context(conn, Scope.of({"user_id": "grown"}).key)
        assert found.hnsw
        statement = _statement(found.query(texts[7], embedder.embed([texts[7]])[0], 5))
        assert statement is not None
        plan = conn.execute("EXPLAIN " + statement[0], statement[1]).fetchall()
    assert name in str(plan)
    # ...and the fresh rows through their own index: the build refreshed the statistics
    # (counting the scope's rows as fresh, the planner scanned the table for them).
    assert "engram_vectors_fresh_idx" in str(plan)
    after = fresh_store.session({"user_id": "grown"}, embedder=embedder).recall(texts[7])
    assert before[0].record.text == texts[7]
    assert texts[7] in [h.record.text for h in after]


def test_building_indexes_hands_its_connection_back_as_it_found_it(fresh_store: Store) -> None:
    """The pool's connections are autocommit: one handed back otherwise would run the
    next caller's statements in a transaction left open (and VACUUM would refuse)."""
    fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64)).remember("tea")
    assert fresh_store.embeddings.index_large_scopes(threshold=1)
    with contextlib.ExitStack() as held:  # every connection the pool has, and then some
        conns = [held.enter_context(fresh_store.pool.connection()) for _ in range(4)]
        assert all(conn.autocommit for conn in conns)
        conns[0].execute("VACUUM engram_records")


def test_what_a_retired_generation_left_is_deleted_on_schedule(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A switch deletes the old generation's vectors itself once writes are released;
    if its process died first, the jobs worker's upkeep does."""
    fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64)).remember("tea")
    with monkeypatch.context() as crash:  # the process dies right after the switch
        crash.setattr(type(fresh_store.embeddings), "purge_retired", lambda self: 0)
        assert fresh_store.embeddings.reembed(HashingEmbedder(16)).activated
    job_id = enqueue_upkeep(redis_client)["purge-retired-vectors"]
    run_burst(context(fresh_store, redis_url), redis_url)
    job = rqjobs.get(redis_client, job_id)
    assert job is not None and job.state == "finished" and job.result == 1
    with psycopg.connect(fresh_dsn) as conn:
        left = conn.execute("SELECT generation_id, count(*) FROM engram_vectors GROUP BY 1")
        assert left.fetchall() == [(2, 1)]


def test_the_vectors_written_into_an_indexed_scope_are_settled_on_schedule(
    fresh_store: Store, fresh_dsn: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A write into an indexed scope leaves its vector fresh (no graph insertion); the
    jobs worker's settle schedule moves it into the index."""
    mem = fresh_store.session({"user_id": "grown"}, embedder=HashingEmbedder(64))
    mem.remember("tea, first")
    assert fresh_store.embeddings.index_large_scopes(threshold=1)
    mem.remember("coffee, since")
    mem.remember("jazz, since")

    def fresh() -> int:
        with psycopg.connect(fresh_dsn) as conn:
            row = conn.execute("SELECT count(*) FROM engram_vectors WHERE NOT settled").fetchone()
        return int(row[0]) if row else -1

    assert fresh() == 2
    job_id = enqueue_upkeep(redis_client)["settle-fresh-vectors"]
    run_burst(context(fresh_store, redis_url), redis_url)
    job = rqjobs.get(redis_client, job_id)
    assert job is not None and job.state == "finished" and job.result == 2
    assert fresh() == 0
    assert mem.recall("jazz")[0].record.text == "jazz, since"
