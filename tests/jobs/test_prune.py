"""Retention: prune history, receipts and dead letters, now or on a schedule."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import redis

from engram.jobs import keys, prune, schedule
from engram.jobs.settings import JobsSettings, Retention, parse_duration
from engram.store import HashingEmbedder, RevisionConflictError, Store
from engram.store.errors import InvalidRequestError
from engram.web import rqjobs
from tests.jobs_fixtures import context, run_burst

DAY = 86400.0


def age(dsn: str, sql: str, days: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(sql, (timedelta(days=days),))


def history(store: Store, dsn: str, user: str) -> str:
    """A retracted record with two old revisions, 40 days old: history to prune."""
    mem = store.session({"user_id": user}, embedder=HashingEmbedder(64))
    fact = mem.remember("Ada prefers tea.").records[0]
    mem.revise(fact.id, text="Ada prefers coffee.")
    mem.retract(fact.id)
    age(dsn, "UPDATE engram_revisions SET recorded_at = recorded_at - %s", 40)
    age(dsn, "UPDATE engram_receipts SET committed_at = committed_at - %s", 40)
    return fact.id


def dead_letters(client: redis.Redis) -> None:
    old = int((datetime.now(UTC) - timedelta(days=20)).timestamp() * 1000)
    client.xadd("engram:dead", {"op": "old"}, id=f"{old}-0")
    client.xadd("engram:dead", {"op": "new"})


def test_run_prunes_each_past_its_window_and_reports_counts(
    fresh_store: Store, fresh_dsn: str, redis_client: redis.Redis
) -> None:
    history(fresh_store, fresh_dsn, "ada")
    dead_letters(redis_client)
    retention = Retention(history_s=30 * DAY, receipts_s=None, dead_letters_s=14 * DAY)
    report = {p.what: p for p in prune.run(fresh_store, redis_client, retention)}
    assert report["history"].removed == 2  # revisions 1 and 2; the current one stays
    assert report["receipts"].removed == 0 and report["receipts"].older_than is None
    assert report["dead-letters"].removed == 1
    assert [f[b"op"] for _, f in redis_client.xrange("engram:dead")] == [b"new"]
    cutoff = report["history"].older_than
    assert cutoff is not None and abs((datetime.now(UTC) - cutoff).total_seconds() - 30 * DAY) < 60
    # Nothing more the second time.
    assert [p.removed for p in prune.run(fresh_store, redis_client, retention)] == [0, 0, 0, 0]


def test_receipts_are_kept_by_default_and_a_pruned_one_no_longer_deduplicates(
    fresh_store: Store, fresh_dsn: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    mem = fresh_store.session({"user_id": "bob"}, embedder=HashingEmbedder(64))
    first = mem.remember("Bob likes jazz.", operation_id="signup:bob")
    age(fresh_dsn, "UPDATE engram_receipts SET committed_at = committed_at - %s", 400)
    defaults = JobsSettings.from_env({}).retention
    assert defaults.receipts_s is None
    [kept] = prune.run(fresh_store, redis_client, defaults, ["receipts"])
    assert kept.removed == 0
    assert mem.remember("Bob likes jazz.", operation_id="signup:bob").replayed

    with caplog.at_level(logging.WARNING):
        [pruned] = prune.run(
            fresh_store, redis_client, Retention(receipts_s=30 * DAY), ["receipts"]
        )
    assert pruned.removed == 1
    assert "no longer deduplicate" in caplog.text
    # The same operation id is now a new operation: applied again, it meets the record it
    # created (its id derives from the operation id) instead of a stored receipt.
    with pytest.raises(RevisionConflictError):
        mem.remember("Bob likes jazz.", operation_id="signup:bob")
    assert first.records[0].id == mem.get(first.records[0].id).id  # type: ignore[union-attr]


def test_a_prune_can_name_its_own_window_and_a_bad_name_is_refused(
    fresh_store: Store, fresh_dsn: str, redis_client: redis.Redis
) -> None:
    history(fresh_store, fresh_dsn, "cy")
    [none] = prune.run(fresh_store, redis_client, Retention(), ["history"], older_than_s=50 * DAY)
    assert none.removed == 0
    [some] = prune.run(fresh_store, redis_client, Retention(), ["history"], older_than_s=DAY)
    assert some.removed == 2
    with pytest.raises(InvalidRequestError):
        prune.run(fresh_store, redis_client, Retention(), ["everything"])
    with pytest.raises(InvalidRequestError):
        parse_duration("30 days")


def test_schedules_enqueue_once_per_slot_whoever_asks(redis_client: redis.Redis) -> None:
    schedules = schedule.retention_schedules(
        Retention(
            history_s=DAY, receipts_s=None, dead_letters_s=DAY, token_reads_s=None, every_s=60
        )
    )
    assert [s.name for s in schedules] == ["prune-history", "prune-dead-letters"]
    now = 1_800_000_000.0
    first = schedule.enqueue_due(redis_client, schedules, now)
    assert first == ["prune-history-30000000", "prune-dead-letters-30000000"]
    # Another jobs worker, or the same one restarted, in the same slot: nothing more.
    assert schedule.enqueue_due(redis_client, schedules, now + 59) == []
    assert schedule.enqueue_due(redis_client, schedules, now + 60) == [
        "prune-history-30000001",
        "prune-dead-letters-30000001",
    ]
    assert 0 < redis_client.ttl(keys.slot("prune-history", 30000000)) <= 120


def test_a_prune_job_runs_on_a_jobs_worker_and_returns_its_counts(
    fresh_store: Store, fresh_dsn: str, redis_url: str, redis_client: redis.Redis
) -> None:
    history(fresh_store, fresh_dsn, "dee")
    ctx = context(fresh_store, redis_url, ENGRAM_RETAIN_HISTORY="30d")
    job_id = prune.enqueue(redis_client, "history")
    run_burst(ctx, redis_url)
    job = rqjobs.get(redis_client, job_id)
    assert job is not None and job.state == "finished" and job.id.startswith("prune-history-")
    assert job.function == "engram.jobs.prune.prune_job"
    assert job.result[0]["removed"] == 2 and job.result[0]["what"] == "history"


def test_the_read_log_is_pruned_past_its_own_window(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    _, grant = fresh_store.tokens.create("agent-pruned", {"user_id": "p"}, by="test")
    fresh_store.tokens.log_reads(grant, "get", [("old", 1), ("old", 2)])
    with fresh_store.pool.connection() as conn:
        conn.execute("UPDATE engram_token_reads SET at = now() - interval '100 days'")
    fresh_store.tokens.log_reads(grant, "recall", [("new", 1)])
    assert JobsSettings.from_env({}).retention.token_reads_s == 90 * DAY
    kept = Retention(token_reads_s=None)
    assert prune.run(fresh_store, redis_client, kept, ["token-reads"])[0].removed == 0
    [pruned] = prune.run(fresh_store, redis_client, Retention(), ["token-reads"])
    assert pruned.removed == 2
    assert [e.record_id for e in fresh_store.tokens.reads_by_token("agent-pruned")] == ["new"]
