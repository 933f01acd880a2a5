"""The test that matters: after a forget through the streams reports its redaction
complete, the forgotten text is in no row of PostgreSQL, no key of Redis and no byte
of valkey's data directory, though it was in all three before.

Real processes: an ``engram worker`` and an ``engram jobs``, the suite's PostgreSQL and
valkey (append-only file on). Before the forget, the text is put everywhere engram
could keep it: the record and two revisions (rows, the full-text index, receipts),
a dead-lettered revise of the record, a re-embedding job that failed on its text,
and, with the stream worker paused, a revise sent after the forget and a revise a
consumer read and never acknowledged, both still in the partition stream.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable

import psycopg
import pytest
import redis

from engram.jobs import keys as job_keys
from engram.jobs import reembed
from engram.jobs.progress import Progress
from engram.store import Store
from engram.web import rqjobs
from engram.worker import Producer, StreamReceipt, keys, partition_of
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey
from tests.helpers import bytes_hold, files_holding, marker_text, redis_values, rows_containing
from tests.jobs_fixtures import PLUGINS, JobsProcess, context, run_burst
from tests.redis_fixtures import FAST, WorkerProcess, wait_until

SCOPE = {"user_id": "ada-marker"}


def op_json(kind: str, request: dict[str, object], operation_id: str) -> str:
    return json.dumps(
        {"operation_id": operation_id, "kind": kind, "scope": SCOPE, "request": request}
    )


@pytest.mark.slow
def test_a_forgotten_text_is_nowhere_once_its_redaction_is_complete(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    valkey: EmbeddedValkey,
    worker_processes: Callable[..., WorkerProcess],
    jobs_processes: Callable[..., JobsProcess],
) -> None:
    marker = marker_text()
    client = connect_redis(redis_url)
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    stream_worker = worker_processes(
        database_url=fresh_dsn, redis_url=redis_url, env={"ENGRAM_EMBEDDERS": PLUGINS}
    )
    home = partition_of(SCOPE, FAST.partitions)
    elsewhere = (home + 1) % FAST.partitions

    # The record, revised twice.
    made = producer.remember(SCOPE, f"Ada's locker code is {marker}.").wait(60)
    record_id = made.records[0].id
    producer.revise(
        SCOPE, record_id, text=f"Ada's locker code is {marker}, on floor 2.", expected_revision=1
    ).wait(30)
    producer.revise(
        SCOPE, record_id, text=f"{marker} is Ada's locker code.", expected_revision=2
    ).wait(30)

    # A revise of it, dead-lettered (sent to the wrong partition), next to a letter that
    # has nothing to do with it and must stay.
    client.xadd(
        keys.stream(elsewhere),
        {"op": op_json("revise", {"id": record_id, "text": f"{marker} (lost)"}, "op-lost")},
    )
    client.xadd(
        keys.stream(elsewhere),
        {"op": op_json("remember", {"text": "Bob likes jazz."}, "op-unrelated")},
    )
    wait_until(lambda: client.xlen(keys.DEAD_LETTERS) == 2, timeout=30, what="two dead letters")

    # A re-embedding that failed on the record's text (its embedder quotes what it got).
    ctx = context(fresh_store, redis_url, ENGRAM_REEMBED_RETRY="off")
    reembed.start(
        fresh_store,
        client,
        ctx.registry,
        "leaky",
        requested_by="test",
        settings=ctx.settings.reembed,
    )
    run_burst(ctx, redis_url)
    [reembeds] = rqjobs.summaries(client, [job_keys.REEMBED_QUEUE])
    assert {state: n for state, n in reembeds.counts.items() if n} == {"failed": 1}

    # Forget it. The listeners wait for the jobs worker, not started yet.
    forget = producer.forget(SCOPE, record_id)
    assert forget.wait(30).redaction == "pending"

    # With the stream worker paused, two more revises stay in the partition stream:
    # one sent after the forget, one a consumer read and never acknowledged.
    stream_worker.signal(signal.SIGSTOP)
    try:
        client.xadd(
            keys.stream(home),
            {"op": op_json("revise", {"id": record_id, "text": f"late {marker}"}, "op-late")},
        )
        client.xadd(
            keys.stream(home),
            {"op": op_json("revise", {"id": record_id, "text": f"ghost {marker}"}, "op-ghost")},
        )
        client.xreadgroup(keys.GROUP, "ghost", {keys.stream(home): ">"}, count=2)

        # Before: the text is in PostgreSQL, in Redis and in valkey's files.
        with psycopg.connect(fresh_dsn) as conn:
            assert not rows_containing(conn, marker), "the forget removed the rows"
        assert bytes_hold(redis_values(client), marker)
        assert files_holding(valkey.data_dir, marker)

        jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
        final = wait_until(
            lambda: _redaction(producer, forget.operation_id), timeout=120, what="the redaction"
        )
        assert final == "complete"
    finally:
        stream_worker.signal(signal.SIGCONT)

    # After: nowhere.
    with psycopg.connect(fresh_dsn) as conn:
        assert rows_containing(conn, marker) == []
        row = conn.execute(
            "SELECT redaction FROM engram_receipts WHERE operation_id = %s",
            (forget.operation_id,),
        ).fetchone()
        assert row == ("complete",)
    assert not bytes_hold(redis_values(client), marker), "a Redis key still holds it"
    assert files_holding(valkey.data_dir, marker) == []

    # What had nothing to do with the record is still there, and the entries sent
    # after the forget were answered as the store answers them.
    [letter] = client.xrange(keys.DEAD_LETTERS)
    assert b"op-unrelated" in letter[1][b"op"]
    for op_id in ("op-late", "op-ghost"):
        reply = producer.results(SCOPE, [op_id])[op_id]
        assert getattr(reply, "code", None) == "revision_conflict", reply
    assert client.xlen(keys.stream(home)) == 0
    # The failed re-embedding kept its job record, without the text.
    generation = next(g for g in fresh_store.embeddings.all() if g.model_id == "leaky-16")
    progress = Progress.from_dict(generation.progress)
    assert progress is not None and progress.state == "failed"
    assert client.llen(job_keys.FORGET_INBOX) == 0
    producer.close()


def _redaction(producer: Producer, op_id: str) -> str | None:
    reply = producer.results(SCOPE, [op_id]).get(op_id)
    if isinstance(reply, StreamReceipt) and reply.redaction in ("complete", "failed"):
        return reply.redaction
    time.sleep(0.1)
    return None


def test_valkey_files_hold_what_redis_was_sent_before_a_rewrite(
    valkey: EmbeddedValkey, redis_client: redis.Redis
) -> None:
    """The byte search used above finds text in both kinds of valkey file: plain in the
    append-only increments, LZF-compressed in the RDB base file a rewrite writes."""
    marker = marker_text()
    redis_client.set("plain", f"some text {marker} around it")
    redis_client.set("compressible", f"{'abc' * 40} {marker} {'abc' * 40}")
    assert files_holding(valkey.data_dir / "appendonlydir", marker)
    redis_client.bgrewriteaof()
    wait_until(
        lambda: not int(redis_client.info("persistence")["aof_rewrite_in_progress"]),
        what="the rewrite",
    )
    [base] = [p for p in (valkey.data_dir / "appendonlydir").iterdir() if ".base." in p.name]
    assert str(base) in files_holding(valkey.data_dir / "appendonlydir", marker)
    # The compressible value is stored compressed, and the marker found in it anyway.
    assert ("abc" * 40).encode() not in base.read_bytes()
    redis_client.delete("plain", "compressible")
