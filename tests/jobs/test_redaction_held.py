"""A forget's redaction is not ``complete`` while something outside this database's
sessions still holds its deleted row versions: a standby's snapshot fed back by
``hot_standby_feedback`` (a real streaming replica), a replication slot's xmin (its
standby gone), a prepared transaction (a server of its own, with two-phase commit on).
Meanwhile the forget stays ``pending`` and names the holder, and the marker's bytes
are in the primary's heap files; once the holder is gone the redaction completes and
they are not.

The marker's row versions are put in the middle of their pages (records written after
it): pruning a page moves the row versions below a dead one over it. A dead version
at the very end of a page's rows would leave its bytes in the freed space, which
VACUUM does not zero (``docs/jobs.md``, "What remains where")."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from starlette.testclient import TestClient

from engram.cli import main
from engram.jobs import keys, redaction
from engram.jobs.listeners.in_postgres import PostgresListener
from engram.store import ForgetEvent, HashingEmbedder, Scope, Store
from engram.store.errors import RedactionHeldError
from engram.store.server import EmbeddedPostgres
from engram.store.write import forgets
from engram.worker import Producer, StreamReceipt
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from tests.helpers import marker_text
from tests.jobs_fixtures import JobsProcess, context
from tests.redis_fixtures import FAST, wait_until
from tests.replica_fixtures import Replica
from tests.web_fixtures import BASE_URL, make_app, sign_in

SCOPE = {"user_id": "ada-held"}
HEAP_TABLES = ("engram_revisions", "engram_receipts")
FEEDBACK = {"hot_standby_feedback": "on", "wal_receiver_status_interval": "1s"}


def heap_holds(postgres_dir: Path, dsn: str, marker: str) -> list[str]:
    """The tables among ``HEAP_TABLES`` whose heap files hold ``marker``'s bytes, read
    after a CHECKPOINT (every page on disk)."""
    found = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        for table in HEAP_TABLES:
            row = conn.execute("SELECT pg_relation_filepath(%s)", (table,)).fetchone()
            assert row is not None
            path = postgres_dir / row[0]
            segments = [path, *sorted(path.parent.glob(path.name + ".[0-9]*"))]
            if any(marker.encode() in p.read_bytes() for p in segments if p.exists()):
                found.append(table)
    return found


def write_marker(mem: object, marker: str) -> str:
    """A record holding ``marker``, with records written after it (see the docstring)."""
    fact = mem.remember(f"The door code is {marker}.").records[0]  # type: ignore[attr-defined]
    for i in range(20):
        mem.remember(f"Unrelated note number {i} about the weather.")  # type: ignore[attr-defined]
    return str(fact.id)


@pytest.fixture
def feedback_replica(postgres: EmbeddedPostgres) -> Iterator[Callable[..., Replica]]:
    """Start replicas of the session's PostgreSQL with ``hot_standby_feedback`` on;
    each is stopped, its folder removed and its slot dropped at the end."""
    made: list[Replica] = []

    def start(slot: str | None = None) -> Replica:
        folder = postgres.data_dir.parent / f"replica-feedback-{len(made)}"
        shutil.rmtree(folder, ignore_errors=True)
        replica = Replica(postgres, folder, settings=FEEDBACK, slot=slot)
        made.append(replica)
        replica.start()
        return replica

    yield start
    for replica in made:
        replica.stop()
        shutil.rmtree(replica.data_dir.parent, ignore_errors=True)
        if replica.slot:
            with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    (replica.slot,),
                )


def walsender_xmin(dsn: str) -> tuple[int, str] | None:
    """The walsender of the one standby, and the xmin its feedback holds, if any."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pid, backend_xmin::text FROM pg_stat_replication WHERE backend_xmin IS NOT NULL"
        ).fetchone()
    return (int(row[0]), str(row[1])) if row else None


def stored(dsn: str, op_id: str) -> tuple[str, str | None, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT redaction, redaction_reason, redaction_handovers FROM engram_receipts"
            " WHERE operation_id = %s",
            (op_id,),
        ).fetchone()
    assert row is not None
    return str(row[0]), row[1], int(row[2])


@pytest.mark.slow
def test_a_standby_snapshot_holds_the_redaction_pending_naming_it_until_it_ends(
    postgres: EmbeddedPostgres,
    fresh_dsn: str,
    redis_url: str,
    stream_worker: Worker,
    jobs_processes: Callable[..., JobsProcess],
    feedback_replica: Callable[..., Replica],
    fresh_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    marker = marker_text()
    replica = feedback_replica()
    with Producer.from_url(redis_url, partitions=FAST.partitions) as producer:
        fact = producer.remember(SCOPE, f"The door code is {marker}.").wait(30).records[0].id
        for i in range(20):
            producer.remember(SCOPE, f"Unrelated note number {i} about the weather.").wait(30)
        replica.wait_caught_up(fresh_dsn)
        with psycopg.connect(replica.dsn_like(fresh_dsn)) as standby:
            standby.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            seen = standby.execute(
                "SELECT count(*) FROM engram_revisions WHERE text LIKE %s", (f"%{marker}%",)
            ).fetchone()
            assert seen == (1,)  # its snapshot exists, and reads the marker
            walsender = wait_until(
                lambda: walsender_xmin(fresh_dsn), timeout=30, what="the standby's feedback"
            )[0]
            jobs = jobs_processes(
                database_url=fresh_dsn,
                redis_url=redis_url,
                env={
                    "ENGRAM_FORGET_LISTENERS": "postgres",
                    "ENGRAM_REDACTION_WAIT": "1s",
                    "ENGRAM_REDACTION_REINDEX": "off",
                    "ENGRAM_REDACTION_SWEEP_AFTER": "1s",
                    "ENGRAM_REDACTION_MAX_HANDOVERS": "1",
                },
            )
            op_id = producer.forget(SCOPE, fact).operation_id

            def held_or_over() -> StreamReceipt | None:
                reply = producer.results(SCOPE, [op_id]).get(op_id)
                if not isinstance(reply, StreamReceipt):
                    return None  # not committed yet
                over = reply.redaction != "pending" or reply.redaction_reason is not None
                return reply if over else None

            reply = wait_until(held_or_over, timeout=60, what="the forget held")
            assert reply.redaction == "pending", "reported over while the standby reads"
            assert reply.redaction_reason == (
                f"held by a standby's snapshot (hot_standby_feedback) via walsender pid {walsender}"
            )
            assert stored(fresh_dsn, op_id)[:2] == ("pending", reply.redaction_reason)
            assert heap_holds(postgres.data_dir, fresh_dsn, marker) == list(HEAP_TABLES)
            app = make_app(fresh_store, connect_redis(redis_url))
            with TestClient(app, base_url=BASE_URL) as web:
                sign_in(web, "local")
                page = web.get(f"/operations/{op_id}", headers={"HX-Request": "true"}).text
            assert f"(hot_standby_feedback) via walsender pid {walsender}</span>" in page
            monkeypatch.setenv("DATABASE_URL", fresh_dsn)
            monkeypatch.setenv("REDIS_URL", redis_url)
            monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
            main(["health"])
            health = json.loads(capsys.readouterr().out)
            assert health["redactions_held"] == {"forgets": 1, "held_by": reply.redaction_reason}
            # A sweep before the forget was held (its event not yet handed to a job after
            # ENGRAM_REDACTION_SWEEP_AFTER's 1 s, on a loaded machine) was counted.
            handovers = stored(fresh_dsn, op_id)[2]

            # Its retries spent, it is not failed: swept up again and again, uncounted
            # (ENGRAM_REDACTION_MAX_HANDOVERS=1 would fail it at the second count).
            def swept_twice() -> bool:
                assert stored(fresh_dsn, op_id)[0] == "pending"
                return jobs.log().count("stalled redactions handed over again") >= 2

            wait_until(swept_twice, timeout=60, what="two hand-overs by the sweeper")
            assert stored(fresh_dsn, op_id) == ("pending", reply.redaction_reason, handovers)
            standby.rollback()

        def done() -> bool:
            reply = producer.results(SCOPE, [op_id]).get(op_id)
            return isinstance(reply, StreamReceipt) and reply.redaction == "complete"

        wait_until(done, timeout=90, what="the redaction complete once the snapshot is gone")
    assert stored(fresh_dsn, op_id) == ("complete", None, handovers)
    assert heap_holds(postgres.data_dir, fresh_dsn, marker) == []


def test_a_replication_slot_of_a_gone_standby_holds_the_redaction_until_dropped(
    postgres: EmbeddedPostgres,
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    feedback_replica: Callable[..., Replica],
) -> None:
    """The standby streamed through a slot with hot_standby_feedback on, then went away:
    the slot keeps the xmin it last reported, for good."""
    slot = "engram_test_held_slot"
    replica = feedback_replica(slot=slot)

    def slot_xmin() -> bool:
        with psycopg.connect(fresh_dsn) as conn:
            row = conn.execute(
                "SELECT xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
        return row == (True,)

    wait_until(slot_xmin, timeout=30, what="the slot's xmin")
    replica.stop()
    marker = marker_text()
    events: list[ForgetEvent] = []
    mem = fresh_store.session(SCOPE, embedder=HashingEmbedder(64), on_forget=[events.append])
    mem.forget(write_marker(mem, marker))
    listener = PostgresListener(context(fresh_store, redis_url, ENGRAM_REDACTION_WAIT="1s"))

    with pytest.raises(RedactionHeldError) as held:
        listener(events)
    assert held.value.holders == (f"replication slot '{slot}' (physical, inactive)",)
    assert heap_holds(postgres.data_dir, fresh_dsn, marker) == list(HEAP_TABLES)

    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    listener(events)
    assert heap_holds(postgres.data_dir, fresh_dsn, marker) == []


@pytest.fixture
def two_phase_server() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of its own with prepared transactions allowed (a restart setting
    the session's server does not have)."""
    home = Path(tempfile.mkdtemp(prefix="engram-2pc-"))
    server = EmbeddedPostgres(home)
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET max_prepared_transactions = 4")
        server.restart()
        yield server
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def test_a_prepared_transaction_holds_the_redaction_until_it_ends(
    two_phase_server: EmbeddedPostgres, redis_url: str
) -> None:
    dsn = two_phase_server.dsn()
    gid = "engram-test-2pc"
    with Store.connect(dsn) as store:
        marker = marker_text()
        events: list[ForgetEvent] = []
        mem = store.session(SCOPE, embedder=HashingEmbedder(64), on_forget=[events.append])
        fact = write_marker(mem, marker)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT pg_current_xact_id()")  # it has a transaction id
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            mem.forget(fact)
            listener = PostgresListener(context(store, redis_url, ENGRAM_REDACTION_WAIT="1s"))
            with pytest.raises(RedactionHeldError) as held:
                listener(events)
            assert held.value.holders == (f"prepared transaction '{gid}'",)
            assert heap_holds(two_phase_server.data_dir, dsn, marker) == list(HEAP_TABLES)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
        listener(events)
        assert heap_holds(two_phase_server.data_dir, dsn, marker) == []


def test_another_databases_open_transaction_holds_nothing(
    postgres: EmbeddedPostgres, fresh_store: Store, fresh_dsn: str, redis_url: str
) -> None:
    """Only what holds this database's horizon is waited for: a snapshot and a
    transaction id older than the forget, in another database, are not."""
    marker = marker_text()
    events: list[ForgetEvent] = []
    mem = fresh_store.session(SCOPE, embedder=HashingEmbedder(64), on_forget=[events.append])
    fact = write_marker(mem, marker)
    with psycopg.connect(postgres.dsn()) as other:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT pg_current_xact_id()")
        mem.forget(fact)
        PostgresListener(context(fresh_store, redis_url, ENGRAM_REDACTION_WAIT="1s"))(events)
        assert heap_holds(postgres.data_dir, fresh_dsn, marker) == []
        other.rollback()


def test_the_sweeper_hands_a_held_forget_over_again_uncounted(
    fresh_store: Store, fresh_dsn: str, redis_url: str
) -> None:
    """A held forget whose job ended is no lost job: handed over at every sweep, it
    never reaches ``ENGRAM_REDACTION_MAX_HANDOVERS``; a stalled one still does."""
    mem = fresh_store.session(SCOPE, embedder=HashingEmbedder(64), on_forget=[lambda e: None])
    held_op = mem.forget(mem.remember("Ada lives in London.").records[0].id).receipt.operation_id
    lost_op = mem.forget(mem.remember("Ada walks a dog.").records[0].id).receipt.operation_id
    ctx = context(
        fresh_store,
        redis_url,
        ENGRAM_REDACTION_SWEEP_AFTER="1s",
        ENGRAM_REDACTION_MAX_HANDOVERS="1",
    )
    pool = fresh_store.pool
    reason = "held by prepared transaction 'x'"
    key = Scope.of(SCOPE).key
    forgets.set_redaction(pool, [(key, held_op), (key, lost_op)], "pending")
    forgets.set_redaction(pool, [(key, held_op)], "pending", reason)
    client = connect_redis(redis_url)
    client.delete(keys.FORGET_INBOX)
    wait_until(
        lambda: len(forgets.pending(pool, datetime.now(UTC) - timedelta(seconds=1))) == 2,
        timeout=10,
        what="both forgets stalled for the sweeper",
    )
    assert redaction.sweep(ctx) == 2
    assert stored(fresh_dsn, held_op) == ("pending", reason, 0)
    assert stored(fresh_dsn, lost_op) == ("pending", None, 1)
    client.delete(keys.FORGET_INBOX)
    assert redaction.sweep(ctx) == 1  # the held one again; the other one failed
    assert stored(fresh_dsn, held_op) == ("pending", reason, 0)
    assert stored(fresh_dsn, lost_op)[0] == "failed"
    client.delete(keys.FORGET_INBOX)
