"""A forget whose listener brings its jobs worker down every time: each lost job's
forgets are handed over again (alone), counted on the receipt, and after
``ENGRAM_REDACTION_MAX_HANDOVERS`` the forget ends ``failed`` with its reason, in the
store, in the reply a producer reads and on the dashboard; the forgets batched with it
and those after it complete. Real ``engram jobs`` processes, killed for real."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from engram.store import Store
from engram.worker import Producer, StreamReceipt
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import JobsProcess
from tests.redis_fixtures import FAST, wait_until
from tests.web_fixtures import BASE_URL, make_app, sign_in

SCOPE = {"user_id": "ada-handovers"}
MAX_HANDOVERS = 2


def killing_listener(event: Any) -> None:
    """Kills its own process (SIGKILL) on a record named in ``ENGRAM_TEST_KILL_RECORDS``,
    after a line ``<pid> <operation id>`` in ``ENGRAM_TEST_KILL_LOG``."""
    doomed = Path(os.environ["ENGRAM_TEST_KILL_RECORDS"]).read_text().split()
    if event.record_id in doomed:
        with open(os.environ["ENGRAM_TEST_KILL_LOG"], "a") as log:
            log.write(f"{os.getpid()} {event.operation_id}\n")
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture
def producer(redis_url: str) -> Iterator[Producer]:
    with Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        yield p


def _stored(dsn: str, op_id: str) -> tuple[str, int, str | None]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT redaction, redaction_handovers, redaction_reason FROM engram_receipts"
            " WHERE operation_id = %s",
            (op_id,),
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), row[2]


@pytest.mark.slow
def test_a_forget_that_kills_its_jobs_worker_every_time_ends_failed_and_others_go_on(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    producer: Producer,
    stream_worker: Worker,
    jobs_processes: Callable[..., JobsProcess],
    tmp_path: Path,
) -> None:
    doomed_file, kills = tmp_path / "doomed", tmp_path / "kills"
    doomed = producer.remember(SCOPE, "Ada lives in London.").wait(30).records[0].id
    batched = producer.remember(SCOPE, "Bob likes jazz.").wait(30).records[0].id
    later = producer.remember(SCOPE, "Cy walks to work.").wait(30).records[0].id
    doomed_file.write_text(doomed)
    # Both wait in the inbox before any jobs worker runs: one batch, one job.
    forget = producer.forget(SCOPE, doomed)
    beside = producer.forget(SCOPE, batched)
    assert forget.wait(30).redaction == beside.wait(30).redaction == "pending"

    env = {
        "ENGRAM_FORGET_LISTENERS": "tests.jobs.test_redaction_handovers:killing_listener",
        "ENGRAM_TEST_KILL_RECORDS": str(doomed_file),
        "ENGRAM_TEST_KILL_LOG": str(kills),
        "ENGRAM_REDACTION_MAX_HANDOVERS": str(MAX_HANDOVERS),
    }
    started: list[JobsProcess] = []

    def over() -> bool:
        """Start a jobs worker whenever the last one died (a supervisor's restart)."""
        if not started or started[-1].process.poll() is not None:
            assert len(started) <= MAX_HANDOVERS + 2, "more jobs workers died than hand-overs"
            started.append(jobs_processes(database_url=fresh_dsn, redis_url=redis_url, env=env))
        return _stored(fresh_dsn, forget.operation_id)[0] != "pending"

    wait_until(over, timeout=180, interval=0.2, what="the forget's redaction to end")

    status, handovers, reason = _stored(fresh_dsn, forget.operation_id)
    assert (status, handovers) == ("failed", MAX_HANDOVERS)
    assert reason is not None and f"handed over {MAX_HANDOVERS} times" in reason
    # It ran once, then once per hand-over, killing its worker each time.
    lines = kills.read_text().splitlines()
    assert len(lines) == MAX_HANDOVERS + 1
    assert {line.split()[1] for line in lines} == {forget.operation_id}
    assert sum(p.process.poll() == -signal.SIGKILL for p in started) == MAX_HANDOVERS + 1

    # The reply a producer reads says failed, and why.
    reply = producer.results(SCOPE, [forget.operation_id])[forget.operation_id]
    assert isinstance(reply, StreamReceipt)
    assert reply.redaction == "failed" and reply.redaction_reason == reason

    # The forget that shared its first job was handed over once, alone, and finished.
    wait_until(
        lambda: _stored(fresh_dsn, beside.operation_id)[0] == "complete",
        timeout=60,
        what="the forget batched with it",
    )
    assert _stored(fresh_dsn, beside.operation_id)[1] == 1
    # A later forget is not held up behind it.
    after = producer.forget(SCOPE, later)
    assert after.wait(30).redaction == "pending"
    wait_until(
        lambda: _stored(fresh_dsn, after.operation_id)[0] == "complete",
        timeout=60,
        what="a later forget",
    )
    assert _stored(fresh_dsn, after.operation_id)[1] == 0

    # The dashboard shows it failed, and why.
    client = connect_redis(redis_url)
    with TestClient(make_app(fresh_store, client), base_url=BASE_URL) as web:
        sign_in(web, "local")
        html = web.get(f"/operations/{forget.operation_id}", headers={"HX-Request": "true"}).text
    client.close()
    assert "badge failed" in html and f"handed over {MAX_HANDOVERS} times" in html
