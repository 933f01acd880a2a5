"""The forget ledger: an entry per forget and nothing of the text, torn lines, check and
repair against the tombstones, and replay on a database restored from a dump."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from engram.store import ForgetEvent, HashingEmbedder, Operation, Store, ledger_replay
from engram.store.errors import EngramError, LedgerUnavailableError
from engram.store.ledger import ForgetLedger, LedgerEntry, Revocation
from engram.store.ledger_replay import REPLAY_BY, check, replay
from engram.store.server import EmbeddedPostgres
from tests.helpers import pg_dump, pg_restore, rows_containing

SECRET = "Grace keeps the launch codes under quokkafluff."


@pytest.fixture
def ledger(tmp_path: Path) -> ForgetLedger:
    return ForgetLedger(tmp_path / "ledger")


@pytest.fixture
def ledgered(fresh_dsn: str, ledger: ForgetLedger) -> Iterator[Store]:
    s = Store.connect(fresh_dsn, ledger=ledger)
    yield s
    s.close()


def _ledger_bytes(ledger: ForgetLedger) -> bytes:
    return b"".join(p.read_bytes() for p in ledger.files())


def test_every_forget_is_in_the_ledger_and_nothing_of_its_text(
    ledgered: Store, ledger: ForgetLedger
) -> None:
    scope = {"user_id": "grace"}
    seen_in_ledger: list[bool] = []

    def listener(event: ForgetEvent) -> None:  # runs before the redaction is recorded
        seen_in_ledger.append(event.record_id in {e.record_id for e in ledger.entries()})

    mem = ledgered.session(scope, embedder=HashingEmbedder(64), on_forget=[listener])
    one = mem.remember(SECRET, metadata={"note": "quokkafluff"}).records[0]
    two = mem.remember("Grace's quokkafluff backup is in the safe.").records[0]
    first = mem.forget(one.id, operation_id="forget-one")
    mem.forget(two.id)
    mem.forget("never-there")  # forgets nothing: no entry

    entries = list(ledger.entries())
    assert [(e.record_id, e.scope) for e in entries] == [(one.id, scope), (two.id, scope)]
    assert entries[0].operation_id == "forget-one"
    assert entries[0].at == first.receipt.committed_at
    assert seen_in_ledger == [True, True] and first.redaction == "complete"
    raw = _ledger_bytes(ledger)
    assert b"quokkafluff" not in raw and b"launch" not in raw and b"Grace" not in raw


def test_a_torn_last_line_is_skipped_then_cut_by_the_next_append(ledger: ForgetLedger) -> None:
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    ledger.append([LedgerEntry("r1", {"user_id": "u"}, "op1", at)])
    [path] = ledger.files()
    with path.open("ab") as f:  # a writer killed mid-append
        f.write(LedgerEntry("r2", {"user_id": "u"}, "op2", at).to_line().encode()[:30])
    scan = ledger.scan()
    assert [e.record_id for e in ledger.entries()] == ["r1"]
    assert (scan.entries, scan.damaged) == (1, 1)

    ledger.append([LedgerEntry("r3", {"user_id": "u"}, "op3", at)])
    assert [e.record_id for e in ledger.entries()] == ["r1", "r3"]
    assert ledger.scan().damaged == 0
    assert path.read_bytes().count(b"\n") == 2


def test_a_damaged_line_fails_its_checksum_and_is_skipped(ledger: ForgetLedger) -> None:
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    ledger.append(LedgerEntry(f"r{i}", {"user_id": "u"}, f"op{i}", at) for i in range(3))
    [path] = ledger.files()
    path.write_bytes(path.read_bytes().replace(b'"r1"', b'"r9"'))  # a flipped byte
    scan = ledger.scan()
    assert [e.record_id for e in ledger.entries()] == ["r0", "r2"]
    assert scan.damaged == 1 and scan.damaged_at == [f"{path.name}:2"]


def test_an_unwritable_ledger_is_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LedgerUnavailableError) as caught:
        ForgetLedger(blocker / "ledger").append([LedgerEntry("r", {"user_id": "u"}, "op", _now())])
    assert isinstance(caught.value, EngramError) and caught.value.code == "ledger_unavailable"


def _now() -> datetime:
    return datetime.now(UTC)


def test_check_finds_tombstones_the_ledger_lacks_and_repair_appends_them(
    fresh_store: Store, ledger: ForgetLedger
) -> None:
    mem = fresh_store.session({"user_id": "nora"}, embedder=HashingEmbedder(64))
    ids = [mem.remember(f"fact {i}").records[0].id for i in range(3)]
    for record_id in ids[:2]:
        mem.forget(record_id)  # a store with no ledger: nothing appended
    ledger.append([LedgerEntry("elsewhere", {"user_id": "x"}, "op-x", _now())])

    found = check(fresh_store, ledger)
    assert (found.tombstones, found.missing_from_ledger, found.unknown_to_store) == (2, 2, 1)
    assert found.repaired == 0 and not found.ok
    assert {e.record_id for e in ledger.entries()} == {"elsewhere"}  # check alone writes nothing

    repaired = check(fresh_store, ledger, repair=True)
    assert repaired.repaired == 2 and repaired.ok
    assert {e.record_id for e in ledger.entries()} == {"elsewhere", *ids[:2]}
    assert check(fresh_store, ledger).missing_from_ledger == 0


def test_replay_on_a_restored_dump_reapplies_exactly_the_later_forgets(
    ledgered: Store, ledger: ForgetLedger, postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    scope = {"user_id": "ada"}
    mem = ledgered.session(scope, embedder=HashingEmbedder(64))
    early = mem.remember("Ada's old quokkafluff note.").records[0]
    mem.forget(early.id)  # before the dump: the dump knows it
    later = [mem.remember(f"{SECRET} #{i}").records[0] for i in range(2)]
    keep = mem.remember("Ada likes tea.").records[0]
    dump = tmp_path / "engram.dump"
    pg_dump(str(ledgered.pool.conninfo), dump)

    for record in later:
        mem.forget(record.id)
    after = mem.remember("Written after the dump, then forgotten.").records[0]
    mem.forget(after.id)

    restored_dsn = pg_restore(postgres.dsn(), postgres.dsn, dump, "r_replay_dump")
    with psycopg.connect(restored_dsn) as conn:
        assert rows_containing(conn, "quokkafluff"), "the dump brought the text back"
    with Store.connect(restored_dsn, migrate=False) as restored:
        dry = replay(restored, ledger, dry_run=True)
        assert (dry.in_ledger, dry.already_forgotten, dry.reapplied, dry.tombstoned) == (4, 1, 2, 1)
        with psycopg.connect(restored_dsn) as conn:
            assert rows_containing(conn, "quokkafluff"), "a dry run changes nothing"
            assert conn.execute("SELECT count(*) FROM engram_forgotten").fetchone()[0] == 1

        done = replay(restored, ledger)
        counts = (done.already_forgotten, done.reapplied, done.tombstoned, done.failed)
        assert counts == (1, 2, 1, 0)
        with psycopg.connect(restored_dsn) as conn:
            assert rows_containing(conn, "quokkafluff") == []
            rows = conn.execute(
                "SELECT operation_id, requested_by, redaction FROM engram_receipts"
                " WHERE kind = 'forget' AND requested_by = %s ORDER BY operation_id",
                (REPLAY_BY,),
            ).fetchall()
        originals = {e.record_id: e.operation_id for e in ledger.entries()}
        assert sorted(r[0] for r in rows) == sorted(originals[r.id] for r in [*later, after])
        assert {r[2] for r in rows if r[0] != originals[after.id]} == {"complete"}
        assert restored.get(scope, keep.id) is not None
        # The record the dump never had can never be created now.
        [refused] = restored.execute(
            [Operation.build("remember", scope, {"text": "back?", "id": after.id})],
            HashingEmbedder(64),
        )
        assert isinstance(refused, EngramError)

        again = replay(restored, ledger)
        assert (again.already_forgotten, again.reapplied, again.tombstoned) == (4, 0, 0)


def test_a_replay_killed_before_its_vacuum_is_finished_by_the_next_run(
    fresh_store: Store, fresh_dsn: str, ledger: ForgetLedger
) -> None:
    scope = {"user_id": "kai"}
    mem = fresh_store.session(scope, embedder=HashingEmbedder(64))
    ids = [mem.remember(f"Kai's quokkafluff {i}.").records[0].id for i in range(2)]
    entries = [LedgerEntry(rid, scope, f"forget-{rid}", _now()) for rid in ids]
    ledger.append(entries)
    # The replay's commit step alone, as a run killed right after it leaves it.
    ledger_replay._forget(
        fresh_store, [ledger_replay._Line(f"l:{i}", e) for i, e in enumerate(entries)]
    )

    def states() -> list[str]:
        with psycopg.connect(fresh_dsn) as conn:
            rows = conn.execute(
                "SELECT redaction FROM engram_receipts WHERE operation_id = ANY(%s)",
                ([e.operation_id for e in entries],),
            ).fetchall()
        return sorted(r[0] for r in rows)

    assert states() == ["pending", "pending"]
    done = replay(fresh_store, ledger)
    assert (done.already_forgotten, done.reapplied, done.erased) == (2, 0, 2)
    assert states() == ["complete", "complete"]
    assert replay(fresh_store, ledger).erased == 0


def test_since_reads_only_the_later_forgets(ledger: ForgetLedger) -> None:
    now = _now()
    ledger.append(
        LedgerEntry(rid, {"user_id": "u"}, f"op-{rid}", now - timedelta(hours=hours))
        for rid, hours in (("old", 48), ("recent", 1))
    )
    assert [e.record_id for e in ledger.entries(since=now - timedelta(hours=2))] == ["recent"]
    naive = (now - timedelta(hours=2)).replace(tzinfo=None)  # read as UTC
    assert [e.record_id for e in ledger.entries(since=naive)] == ["recent"]
    assert list(ledger.entries(since=now + timedelta(days=2))) == []  # its file skipped


def test_a_revocation_goes_to_the_ledger_and_stands_when_the_ledger_cannot_be_written(
    fresh_dsn: str, tmp_path: Path
) -> None:
    with Store.connect(fresh_dsn, ledger=ForgetLedger(tmp_path / "ledger")) as store:
        secret, _ = store.tokens.create("agent-leaked", {"user_id": "ada"}, by="grace")
        assert store.tokens.revoke("agent-leaked", by="grace")
        [(_, revocation)] = store.ledger.revocations()  # type: ignore[union-attr]
        made = store.tokens.get("agent-leaked")
        assert made is not None and revocation.database == store.database_key
        assert (revocation.token, revocation.created_at) == (made.name, made.created_at)
        assert (revocation.by, revocation.at) == ("grace", made.revoked_at)
        raw = b"".join(p.read_bytes() for p in (tmp_path / "ledger").iterdir())
        assert secret.encode() not in raw and hashlib.sha256(
            secret.encode()
        ).hexdigest() not in str(raw)

    blocker = tmp_path / "file"
    blocker.write_text("")
    with Store.connect(fresh_dsn, ledger=ForgetLedger(blocker / "ledger")) as store:
        store.tokens.create("agent-other", {"user_id": "ada"}, by="grace")
        with pytest.raises(LedgerUnavailableError) as caught:
            store.tokens.revoke("agent-other", by="grace")
        assert "agent-other is revoked, but not in the ledger" in caught.value.message
        assert store.tokens.get("agent-other").revoked_at is not None  # type: ignore[union-attr]
        # The schedule's repair appends it (to a ledger that can be written).
        found = check(store, ForgetLedger(tmp_path / "ledger"), repair=True)
        assert (found.revocations_missing, found.repaired) == (1, 1)
        assert check(store, ForgetLedger(tmp_path / "ledger")).ok


def test_a_replayed_revocation_revokes_only_the_token_it_names(
    fresh_dsn: str, ledger: ForgetLedger
) -> None:
    with Store.connect(fresh_dsn) as store:
        secret, _ = store.tokens.create("agent-a", {"user_id": "ada"}, by="grace")
        made = store.tokens.get("agent-a")
        assert made is not None
        here = store.database_key
        # An older token of that name (lost to a restore), and this one in another database.
        older = made.created_at - timedelta(days=1)
        ledger.append(
            [
                Revocation("agent-a", older, "grace", _now(), here),
                Revocation("agent-a", made.created_at, "grace", _now(), "0123456789abcdef"),
            ]
        )
        dry = replay(store, ledger, dry_run=True)
        assert (dry.tokens_revoked, dry.other_databases) == (0, 1)
        assert replay(store, ledger).tokens_revoked == 0
        assert store.tokens.verify(secret) is not None

        ledger.append([Revocation("agent-a", made.created_at, "grace", _now(), here)])
        assert replay(store, ledger, dry_run=True).tokens_revoked == 1
        assert store.tokens.verify(secret) is not None  # a dry run changes nothing
        assert replay(store, ledger).tokens_revoked == 1
        assert store.tokens.verify(secret) is None
        assert replay(store, ledger).tokens_revoked == 0  # idempotent
