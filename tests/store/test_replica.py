"""Reads on a real streaming replica (tests/replica_fixtures.py): recall, get and history
are served by it; a reader who passes its receipt's position always sees its write; a
replica that stops sends the reads to the primary; nothing is written through it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from engram.store import HashingEmbedder, Scope, Store
from engram.store.errors import InvalidRequestError
from engram.store.read.routing import format_position, parse_position
from engram.store.values import Receipt
from tests.replica_fixtures import Replica, replica  # noqa: F401 (the fixture)


@pytest.fixture(scope="module")
def replicated(dsn: str, replica: Replica) -> Iterator[Store]:  # noqa: F811
    """A store whose reads go to the replica (its database replayed there first)."""
    Store.connect(dsn).close()  # migrated on the primary
    replica.wait_caught_up(dsn)
    with Store.connect(dsn, read_dsn=replica.dsn_like(dsn)) as store:
        yield store


@pytest.fixture
def paused(replica: Replica, replicated: Store) -> Iterator[None]:  # noqa: F811
    with replica.paused():
        yield


def _activity(replica: Replica, dsn: str) -> list[str]:  # noqa: F811
    """The statements the replica's other sessions on this database ran last."""
    with psycopg.connect(replica.dsn_like(dsn), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return [r[0] for r in rows]


def test_recall_get_and_history_are_served_by_the_replica(
    replicated: Store,
    replica: Replica,  # noqa: F811
    dsn: str,
    scope: dict[str, str],
    embedder: HashingEmbedder,
) -> None:
    mem = replicated.session(scope, embedder=embedder)
    kept = mem.remember("the replica keeps the lighthouse log").records[0]
    replica.wait_caught_up(dsn)
    assert mem.history(kept.id)[0].text == "the replica keeps the lighthouse log"
    assert any("FROM engram_revisions v" in q for q in _activity(replica, dsn))
    served = replicated.reads.served["replica"]
    assert mem.get(kept.id) is not None
    assert replicated.reads.served["replica"] == served + 1
    served += 1
    assert [h.record.id for h in mem.recall("lighthouse log")] == [kept.id]
    # (recall's last statement is a COMMIT: pg_stat_activity cannot tell it apart)
    assert replicated.reads.served["replica"] == served + 2  # its context, its search
    with replicated.reads.connection() as conn:  # the connection reads are given
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)


@pytest.mark.usefixtures("paused")
def test_without_a_position_a_read_sees_the_replica_as_it_is(
    replicated: Store, scope: dict[str, str], embedder: HashingEmbedder
) -> None:
    """The staleness a reader accepts when it passes no position: the replica's lag
    (here, replay paused: the write is not there yet)."""
    mem = replicated.session(scope, embedder=embedder)
    written = mem.remember("written while the replica stood still")
    record_id = written.records[0].id
    assert mem.get(record_id) is None
    assert mem.history(record_id) == []
    assert mem.recall("stood still") == []


@pytest.mark.usefixtures("paused")
def test_a_reader_with_its_position_sees_its_write_when_the_replica_lags(
    replicated: Store, scope: dict[str, str], embedder: HashingEmbedder
) -> None:
    mem = replicated.session(scope, embedder=embedder)
    before = dict(replicated.reads.served)
    written = mem.remember("read your own writes")
    position = written.receipt.position
    assert position is not None
    record_id = written.records[0].id
    record = mem.get(record_id, after=position)
    assert record is not None and record.text == "read your own writes"
    assert [r.revision for r in mem.history(record_id, after=position)] == [1]
    assert [h.record.id for h in mem.recall("own writes", after=position)] == [record_id]
    assert replicated.records(scope, after=position)[0].id == record_id
    # Sent to the primary because the replica had not replayed that far.
    assert replicated.reads.served["behind"] > before.get("behind", 0)


def test_read_your_writes_never_misses(
    replicated: Store, scope: dict[str, str], embedder: HashingEmbedder
) -> None:
    """Write then read at once, many times: each read passes the receipt's position and
    finds the write, whether the replica or the primary served it."""
    mem = replicated.session(scope, embedder=embedder)
    before = dict(replicated.reads.served)
    for n in range(150):
        written = mem.remember(f"note number {n}")
        record_id = written.records[0].id
        found = mem.get(record_id, after=written.receipt.position)
        assert found is not None and found.text == f"note number {n}", n
        revised = mem.revise(record_id, text=f"note number {n}, revised")
        history = mem.history(record_id, after=revised.receipt.position)
        assert [r.revision for r in history] == [1, 2], n
    served = {k: v - before.get(k, 0) for k, v in replicated.reads.served.items()}
    assert served.get("replica", 0) > 0  # most reads, once it has caught up


def test_each_receipt_of_a_batch_carries_a_position_at_or_after_its_commit(
    replicated: Store, dsn: str, scope: dict[str, str], embedder: HashingEmbedder
) -> None:
    mem = replicated.session(scope, embedder=embedder)
    first = mem.remember("one").receipt.position
    again = mem.remember("two").receipt.position
    assert first is not None and again is not None
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    assert parse_position(first) <= parse_position(again) <= parse_position(row[0])  # type: ignore[operator]


def test_a_replayed_operation_gets_a_position_too(
    replicated: Store, scope: dict[str, str], embedder: HashingEmbedder
) -> None:
    mem = replicated.session(scope, embedder=embedder)
    first = mem.remember("said twice", operation_id="twice-1")
    replay = mem.remember("said twice", operation_id="twice-1")
    assert replay.replayed and replay.receipt == first.receipt
    assert replay.receipt.position is not None
    assert mem.get(replay.records[0].id, after=replay.receipt.position) is not None


def test_the_position_travels_with_the_receipt_as_json() -> None:
    receipt_dict = {
        "operation_id": "op",
        "kind": "remember",
        "scope": {"user_id": "u"},
        "scope_revision": 1,
        "committed_at": "2026-01-01T00:00:00+00:00",
        "records": [],
        "position": "1A/2B3C",
    }
    receipt = Receipt(**Receipt.fields_from_dict(receipt_dict))
    assert receipt.position == "1A/2B3C"
    assert receipt.as_dict()["position"] == "1A/2B3C"
    assert format_position(parse_position("1A/2B3C") or 0) == "1A/2B3C"


def test_a_bad_position_is_refused(replicated: Store, scope: dict[str, str]) -> None:
    for bad in ("nonsense", "1/2/3", "G/1", "", "12345678901/0"):
        with pytest.raises(InvalidRequestError):
            replicated.get(scope, "r1", after=bad)
        with pytest.raises(InvalidRequestError):
            replicated.recall(scope, "x", after=bad)


def test_a_store_without_a_replica_reads_and_writes_as_before(
    dsn: str, scope: dict[str, str], embedder: HashingEmbedder
) -> None:
    """One server: no position is read after a commit (the write path runs no extra
    statement), and a reader's position, well formed, changes nothing."""
    with Store.connect(dsn) as store:
        assert not store.writer.track_position and store.reads.replica is None
        written = store.session(scope, embedder=embedder).remember("single node")
        assert written.receipt.position is None
        assert store.get(scope, written.records[0].id, after="0/0") is not None
        assert not store.reads.served  # nothing routed, nothing counted


def test_nothing_is_written_through_the_read_pool(
    replicated: Store,
    replica: Replica,  # noqa: F811
    dsn: str,
    scope: dict[str, str],
    embedder: HashingEmbedder,
) -> None:
    """Every write path runs with the replica as the read pool. A write sent there would
    fail on the hot standby, and the replica logs every error it raises: its log must
    hold none, and no read had to be run again on the primary."""
    logged = len(replica.log_text())
    failed = replicated.reads.served["failed"]
    mem = replicated.session(scope, embedder=embedder)
    kept = mem.remember("to be revised", kind="note")
    mem.revise(kept.records[0].id, text="revised")
    mem.retract(kept.records[0].id)
    gone = mem.remember("to be forgotten")
    mem.forget(gone.records[0].id)
    mem.extract([{"id": "m1", "message": {"role": "user", "content": "I like tea"}}])
    replicated.set_redaction(gone.receipt.operation_id, "complete", scope)
    replicated.prune_history(older_than=_long_ago())
    replicated.prune_operations(older_than=_long_ago())
    replicated.audit.record("tester", "record.forget", gone.records[0].id, {"n": 1})
    replica.wait_caught_up(dsn)
    errors = [line for line in replica.log_text()[logged:].splitlines() if "ERROR" in line]
    assert errors == []
    assert replicated.reads.served["failed"] == failed


def test_a_store_that_only_writes_holds_no_replica_connection(
    dsn: str,
    replica: Replica,  # noqa: F811
    scope: dict[str, str],
    embedder: HashingEmbedder,
) -> None:
    """A stream worker's store: its receipts carry positions, its replica pool stays empty."""
    with Store.connect(dsn, read_dsn=replica.dsn_like(dsn)) as store:
        written = store.session(scope, embedder=embedder).remember("a worker's write")
        assert written.receipt.position is not None
        assert store.reads.replica is not None
        assert store.reads.replica.get_stats().get("pool_size", 0) == 0


def test_a_busy_replica_pool_sends_one_read_to_the_primary_and_is_not_rested(
    dsn: str,
    replica: Replica,  # noqa: F811
    scope: dict[str, str],
    embedder: HashingEmbedder,
) -> None:
    with Store.connect(dsn, read_dsn=replica.dsn_like(dsn), max_connections=1) as store:
        written = store.session(scope, embedder=embedder).remember("one connection each")
        replica.wait_caught_up(dsn)
        with store.reads.connection() as held:  # the replica pool's only connection
            assert held.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            assert store.get(scope, written.records[0].id) is not None
        assert store.reads.served["busy"] == 1
        before = store.reads.served["replica"]
        assert store.get(scope, written.records[0].id) is not None
        assert store.reads.served["replica"] == before + 1  # not rested: used again at once


def test_a_stopped_replica_sends_the_reads_to_the_primary(
    replica: Replica,  # noqa: F811
    dsn: str,
    scope: dict[str, str],
    embedder: HashingEmbedder,
) -> None:
    """It stops the session's replica (and starts it again), through a store of its own:
    the module's store is not left resting on the primary for the tests after it."""
    with Store.connect(dsn, read_dsn=replica.dsn_like(dsn)) as own:
        _reads_go_to_the_primary_once_the_replica_stops(own, replica, dsn, scope, embedder)


def _reads_go_to_the_primary_once_the_replica_stops(
    replicated: Store,
    replica: Replica,  # noqa: F811
    dsn: str,
    scope: dict[str, str],
    embedder: HashingEmbedder,
) -> None:
    mem = replicated.session(scope, embedder=embedder)
    kept = mem.remember("the replica is going away")
    replica.wait_caught_up(dsn)
    assert mem.get(kept.records[0].id) is not None  # the pool holds replica connections
    replica.stop()
    try:
        started = time.monotonic()
        assert mem.get(kept.records[0].id) is not None  # its connection broke: primary
        assert [h.record.id for h in mem.recall("going away")] == [kept.records[0].id]
        assert len(mem.history(kept.records[0].id)) == 1
        written = mem.remember("written with the replica down")
        assert mem.get(written.records[0].id, after=written.receipt.position) is not None
        # A store started while the replica is down reads the primary from the start.
        with Store.connect(dsn, read_dsn=replica.dsn_like(dsn)) as late:
            assert late.get(scope, written.records[0].id) is not None
            holder = late.browse.holder(written.records[0].id)
            assert holder is not None and holder.scope == Scope.of(scope)
            assert late.browse.record(holder.id, written.records[0].id) is not None
        assert time.monotonic() - started < 5.0
        with replicated.reads.connection() as conn:  # resting: the primary's
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
    finally:
        replica.start()


def _long_ago() -> Any:
    from datetime import UTC, datetime

    return datetime(2000, 1, 1, tzinfo=UTC)


def test_the_read_url_is_read_once_and_masked_in_the_settings_repr() -> None:
    from engram.worker.settings import Settings

    secret = "s3cret-Pa55word-0123456789"
    url = (
        f"postgresql://reader:{secret}@replica1,replica2/engram?target_session_attrs=prefer-standby"
    )
    settings = Settings.from_env({"DATABASE_READ_URL": url})
    assert settings.database_read_url == url
    assert secret not in repr(settings) and "reader:***@replica1,replica2" in repr(settings)
    assert Settings.from_env({}).database_read_url is None
