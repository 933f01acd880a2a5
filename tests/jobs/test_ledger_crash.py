"""A forget whose jobs worker is SIGKILLed between the forget's commit and its ledger
append: the forget stays ``pending``, the next jobs worker appends it, and only then is
its redaction ``complete``. Real ``engram jobs`` processes, killed for real. And the
jobs' schedule appends the forgets that never reached a redaction job."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rq.job import JobStatus

from engram.jobs import queues, schedule
from engram.store import HashingEmbedder, Store
from engram.store.ledger import ForgetLedger
from engram.worker import Producer
from engram.worker.consuming.worker import Worker
from tests import jobs_fixtures
from tests.jobs_fixtures import JobsProcess
from tests.redis_fixtures import FAST, wait_until

SCOPE = {"user_id": "ada-ledger-crash"}
SECRET = "Ada hid the spare key under the wombatstone."


@pytest.fixture
def producer(redis_url: str) -> Iterator[Producer]:
    with Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        yield p


def ledger_seen(event: Any) -> None:
    """A listener (it runs before the redaction may be ``complete``): writes to
    ``ENGRAM_TEST_SEEN_LOG`` whether the ledger already holds the event's record."""
    ledger = ForgetLedger(Path(os.environ["ENGRAM_FORGET_LEDGER_DIR"]))
    held = event.record_id in {e.record_id for e in ledger.entries()}
    with open(os.environ["ENGRAM_TEST_SEEN_LOG"], "a") as f:
        f.write(f"{event.record_id} {held}\n")


def _redaction(dsn: str, op_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT redaction FROM engram_receipts WHERE operation_id = %s", (op_id,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_a_forget_killed_before_its_ledger_append_is_in_the_ledger_before_complete(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    producer: Producer,
    stream_worker: Worker,
    jobs_processes: Callable[..., JobsProcess],
    tmp_path: Path,
) -> None:
    ledger = ForgetLedger(tmp_path / "ledger")
    marker = tmp_path / "kill-before-ledger"
    marker.write_text("")
    seen = tmp_path / "seen"
    record = producer.remember(SCOPE, SECRET).wait(30).records[0].id
    forget = producer.forget(SCOPE, record)
    assert forget.wait(30).redaction == "pending"  # committed; handed to the jobs
    env = {
        "ENGRAM_FORGET_LEDGER_DIR": str(ledger.directory),
        "ENGRAM_TEST_KILL_BEFORE_LEDGER": str(marker),
        "ENGRAM_FORGET_LISTENERS": "redis,tests.jobs.test_ledger_crash:ledger_seen",
        "ENGRAM_TEST_SEEN_LOG": str(seen),
    }

    first = jobs_processes(database_url=fresh_dsn, redis_url=redis_url, env=env)
    wait_until(lambda: first.process.poll() is not None, timeout=60, what="the kill")
    assert first.process.returncode == -signal.SIGKILL and not marker.exists()
    # Killed between the commit and the append: not in the ledger, and not complete.
    assert list(ledger.entries()) == [] and not seen.exists()
    assert _redaction(fresh_dsn, forget.operation_id) == "pending"

    jobs_processes(database_url=fresh_dsn, redis_url=redis_url, env=env)  # its restart
    wait_until(
        lambda: _redaction(fresh_dsn, forget.operation_id) == "complete",
        timeout=90,
        what="the redaction, handed over again, to complete",
    )
    # The listeners, which run before it may say complete, found it in the ledger.
    assert seen.read_text().split() == [record, "True"]
    [entry] = ledger.entries()
    assert (entry.record_id, entry.scope, entry.operation_id) == (
        record,
        SCOPE,
        forget.operation_id,
    )
    assert b"wombatstone" not in b"".join(p.read_bytes() for p in ledger.files())


def test_the_schedule_appends_the_forgets_that_never_reached_a_redaction_job(
    fresh_store: Store, fresh_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    # Forgotten through a Store with no ledger (as with no listener configured, the
    # forget never goes to a redaction job).
    mem = fresh_store.session(SCOPE, embedder=HashingEmbedder(64))
    record = mem.remember(SECRET).records[0].id
    mem.forget(record)
    ledger = ForgetLedger(tmp_path / "ledger")
    with Store.connect(fresh_dsn, migrate=False, ledger=ledger) as jobs_store:
        ctx = jobs_fixtures.context(jobs_store, redis_url)
        [repair] = [s for s in schedule.upkeep_schedules() if s.name == "repair-forget-ledger"]
        [job_id] = schedule.enqueue_due(ctx.client, [repair], time.time())
        jobs_fixtures.run_burst(ctx, redis_url)
        job = queues.fetch(ctx.client, job_id)
        assert job is not None and job.get_status() == JobStatus.FINISHED
    [entry] = ledger.entries()
    assert (entry.record_id, entry.scope) == (record, SCOPE)
