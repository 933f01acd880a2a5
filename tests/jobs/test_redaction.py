"""Forgets through the streams run their listeners as RQ jobs (a real ``engram jobs``):
pending, then complete or failed, on the receipt and on the reply; retried; again
on a repeated forget; coalesced; signed webhooks; stalled ones swept up."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from engram.jobs import keys, redaction
from engram.jobs.listeners.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from engram.store import HashingEmbedder, Operation, Store, WriteOptions
from engram.web import rqjobs
from engram.worker import Producer, StreamReceipt
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import JobsProcess, jobs_of
from tests.redis_fixtures import FAST, wait_until

StartJobs = Callable[..., JobsProcess]
SCOPE = {"user_id": "ada"}


@pytest.fixture
def producer(redis_url: str) -> Iterator[Producer]:
    with Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        yield p


def remembered(producer: Producer, text: str = "Ada lives in London.") -> str:
    receipt = producer.remember(SCOPE, text).wait(30)
    return receipt.records[0].id


def redaction_of(producer: Producer, op_id: str, timeout: float = 60.0) -> StreamReceipt:
    """The forget's reply once its redaction is over."""

    def done() -> StreamReceipt | None:
        reply = producer.results(SCOPE, [op_id]).get(op_id)
        if reply is None:
            return None  # not committed yet
        assert isinstance(reply, StreamReceipt), reply
        return reply if reply.redaction in ("complete", "failed") else None

    found: StreamReceipt = wait_until(done, timeout=timeout, what=f"the redaction of {op_id}")
    return found


def stored_redaction(dsn: str, op_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT redaction FROM engram_receipts WHERE operation_id = %s", (op_id,)
        ).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.slow
def test_a_forget_through_the_streams_is_pending_then_complete_with_ids_only_in_the_jobs(
    fresh_dsn: str,
    redis_url: str,
    producer: Producer,
    stream_worker: Worker,
    jobs_processes: StartJobs,
    tmp_path: Path,
) -> None:
    log = tmp_path / "events.jsonl"
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={
            "ENGRAM_FORGET_LISTENERS": "redis,postgres,tests.jobs_fixtures:record_event",
            "ENGRAM_TEST_LISTENER_LOG": str(log),
        },
    )
    record_id = remembered(producer)
    pending = producer.forget(SCOPE, record_id)
    first = pending.wait(30)
    assert first.redaction == "pending" and first.revisions == (1,)
    final = redaction_of(producer, pending.operation_id)
    assert final.redaction == "complete" and final.revisions == (1,)
    assert stored_redaction(fresh_dsn, pending.operation_id) == "complete"
    [event] = [json.loads(line) for line in log.read_text().splitlines()]
    assert event == {
        "scope": SCOPE,
        "record_id": record_id,
        "revisions": [1],
        "operation_id": pending.operation_id,
        "already_forgotten": False,
    }
    client = connect_redis(redis_url)
    [job] = jobs_of(client, redaction.redact)
    assert job.get_status() == "finished" and list(job.args) == [[event]]
    assert job.return_value() == {"events": 1, "redaction": "complete"}

    # A forget of a record the scope never had: nothing to redact, no job.
    never = producer.forget(SCOPE, "mem_never_there").wait(30)
    assert never.redaction == "none"

    # A repeated forget runs the listeners again.
    again = producer.forget(SCOPE, record_id)
    assert again.wait(30).redaction == "pending"
    assert redaction_of(producer, again.operation_id).redaction == "complete"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[-1]["already_forgotten"] is True and events[-1]["revisions"] == []


@pytest.mark.slow
def test_a_failing_listener_is_retried_later_ones_still_run_and_a_repeat_finishes_it(
    fresh_dsn: str,
    redis_url: str,
    producer: Producer,
    stream_worker: Worker,
    jobs_processes: StartJobs,
    tmp_path: Path,
) -> None:
    log, flag = tmp_path / "events.jsonl", tmp_path / "down"
    flag.touch()
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={
            "ENGRAM_FORGET_LISTENERS": (
                "tests.jobs_fixtures:failing_listener,tests.jobs_fixtures:record_event"
            ),
            "ENGRAM_TEST_LISTENER_LOG": str(log),
            "ENGRAM_TEST_FAIL_FLAG": str(flag),
            "ENGRAM_REDACTION_RETRY": "1s,1s",
        },
    )
    record_id = remembered(producer)
    pending = producer.forget(SCOPE, record_id)
    assert redaction_of(producer, pending.operation_id).redaction == "failed"
    assert stored_redaction(fresh_dsn, pending.operation_id) == "failed"
    # The later listener ran once (the retries run only the one that failed).
    assert len(log.read_text().splitlines()) == 1
    [job] = jobs_of(connect_redis(redis_url), redaction.redact)
    assert job.get_status() == "failed" and job.retries_left == 0
    [row] = [r for r in rqjobs.failed(connect_redis(redis_url), keys.REDACTION_QUEUE)]
    assert row.id == job.id and row.error is not None and "failing_listener" in row.error

    flag.unlink()  # the service is back: forgetting again finishes the redaction
    again = producer.forget(SCOPE, record_id)
    assert redaction_of(producer, again.operation_id).redaction == "complete"


@pytest.mark.slow
def test_forgets_that_arrive_together_are_redacted_together(
    fresh_dsn: str,
    redis_url: str,
    producer: Producer,
    stream_worker: Worker,
    jobs_processes: StartJobs,
) -> None:
    client = connect_redis(redis_url)
    records = [remembered(producer, f"Fact {i} about Ada.") for i in range(30)]
    rewrites = int(client.info("persistence")["aof_rewrites"])
    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
    forgets = producer.enqueue_many(
        [Operation.build("forget", SCOPE, {"id": rid}) for rid in records]
    )
    for pending in forgets:
        assert redaction_of(producer, pending.operation_id).redaction == "complete"
    jobs = jobs_of(client, redaction.redact)
    handled = sum(len(j.args[0]) for j in jobs)
    assert handled == 30 and len(jobs) < 10, [len(j.args[0]) for j in jobs]
    assert int(client.info("persistence")["aof_rewrites"]) - rewrites <= len(jobs)


class _Receiver(BaseHTTPRequestHandler):
    secret = "s3cret"
    failures_left = 1
    received: list[dict[str, Any]] = []  # noqa: RUF012

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        ok = verify(
            self.secret, self.headers[TIMESTAMP_HEADER], body, self.headers[SIGNATURE_HEADER]
        )
        status = 401 if not ok else 503 if _Receiver.failures_left > 0 else 204
        if ok and status == 503:
            _Receiver.failures_left -= 1
        if status == 204:
            _Receiver.received.append(json.loads(body))
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.failures_left, _Receiver.received = 1, []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/forgotten"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_the_webhook_posts_signed_ids_and_is_retried(
    fresh_dsn: str,
    redis_url: str,
    producer: Producer,
    stream_worker: Worker,
    jobs_processes: StartJobs,
    receiver: str,
) -> None:
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={
            "ENGRAM_FORGET_LISTENERS": "webhook",
            "ENGRAM_FORGET_WEBHOOK_URL": receiver,
            "ENGRAM_FORGET_WEBHOOK_SECRET": _Receiver.secret,
        },
    )
    record_id = remembered(producer)
    pending = producer.forget(SCOPE, record_id)
    assert redaction_of(producer, pending.operation_id).redaction == "complete"
    assert _Receiver.failures_left == 0, "the first POST was refused, then retried"
    assert _Receiver.received == [
        {
            "events": [
                {
                    "scope": SCOPE,
                    "record_id": record_id,
                    "revisions": [1],
                    "operation_id": pending.operation_id,
                    "already_forgotten": False,
                }
            ]
        }
    ]


def test_a_webhook_signature_binds_body_and_time() -> None:
    from engram.jobs.listeners.webhook import sign

    body = b'{"events":[]}'
    signature = sign("k", 1_700_000_000, body)
    assert verify("k", "1700000000", body, signature, now=1_700_000_100)
    assert not verify("k", "1700000000", body + b" ", signature, now=1_700_000_100)
    assert not verify("other", "1700000000", body, signature, now=1_700_000_100)
    assert not verify("k", "1700000001", body, signature, now=1_700_000_100)
    assert not verify("k", "1700000000", body, signature, now=1_700_001_000)  # too old


@pytest.mark.slow
def test_a_forget_left_pending_without_its_job_is_swept_up(
    fresh_store: Store, fresh_dsn: str, redis_url: str, jobs_processes: StartJobs
) -> None:
    """Its worker committed it and died before handing it over."""
    [made] = fresh_store.execute(
        [Operation.build("remember", SCOPE, {"text": "Ada lives in London."})], HashingEmbedder(64)
    )
    [forgot] = fresh_store.execute(
        [Operation.build("forget", SCOPE, {"id": made.records[0].id})],  # type: ignore[union-attr]
        options=WriteOptions(listeners=True),
    )
    op_id = forgot.receipt.operation_id  # type: ignore[union-attr]
    assert stored_redaction(fresh_dsn, op_id) == "pending"
    jobs_processes(
        database_url=fresh_dsn, redis_url=redis_url, env={"ENGRAM_REDACTION_SWEEP_AFTER": "1s"}
    )
    wait_until(
        lambda: stored_redaction(fresh_dsn, op_id) == "complete",
        timeout=60,
        what="the swept-up redaction",
    )


def test_the_inbox_holds_ids_only(redis_client: redis.Redis) -> None:
    from engram.store import ForgetEvent, Scope

    pipe = redis_client.pipeline()
    redaction.hand_over([ForgetEvent(Scope(user_id="ada"), "mem_1", (1, 2), "op-1", False)], pipe)
    pipe.execute()
    assert json.loads(redis_client.lindex(keys.FORGET_INBOX, 0)) == {  # type: ignore[arg-type]
        "scope": {"user_id": "ada"},
        "record_id": "mem_1",
        "revisions": [1, 2],
        "operation_id": "op-1",
        "already_forgotten": False,
    }
