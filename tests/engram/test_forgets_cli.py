"""``engram forgets replay|check``, in this process: replay on a database restored from
``pg_dump`` re-applies exactly the forgets after the dump, a second run changes nothing;
check finds what the ledger lacks and repairs it; bad input changes nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from engram.cli import main
from engram.forgets_cli import since_arg
from engram.store import HashingEmbedder, Store
from engram.store.ledger import ForgetLedger, LedgerEntry
from engram.store.server import EmbeddedPostgres
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.helpers import pg_dump, pg_restore, rows_containing

SCOPE = {"user_id": "lin"}


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_FORGET_LEDGER_DIR", str(tmp_path / "ledger"))
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # never reached


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_replay_after_a_pg_dump_restore_reapplies_the_later_forgets_once(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fresh_dsn: str,
    postgres: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    ledger = ForgetLedger(tmp_path / "ledger")
    with Store.connect(fresh_dsn, ledger=ledger) as store:
        mem = store.session(SCOPE, embedder=HashingEmbedder(64))
        ids = [mem.remember(f"Lin's pin is pangolinade {i}.").records[0].id for i in range(4)]
        mem.forget(ids[0])
        pg_dump(fresh_dsn, tmp_path / "dump")
        mem.forget(ids[1])
        mem.forget(ids[2])
    restored = pg_restore(postgres.dsn(), postgres.dsn, tmp_path / "dump", "r_forgets_cli")
    monkeypatch.setenv("DATABASE_URL", restored)

    code, out, _ = run(capsys, "forgets", "replay", "--dry-run", "--json")
    assert code == 0
    with Store.connect(restored) as store:
        database = store.database_key  # the dump's copy is the same database
    assert json.loads(out) == {
        "in_ledger": 3,
        "already_forgotten": 1,
        "reapplied": 2,
        "tombstoned": 0,
        "failed": 0,
        "erased": 0,
        "damaged_lines": 0,
        "other_databases": 0,
        "tokens_revoked": 0,
        "dry_run": True,
        "database": database,
        "refused_at": [],
    }
    with psycopg.connect(restored) as conn:
        assert len(rows_containing(conn, "pangolinade")) > 0
        assert conn.execute("SELECT count(*) FROM engram_forgotten").fetchone()[0] == 1

    code, out, _ = run(capsys, "forgets", "replay", "--json")
    assert code == 0 and json.loads(out)["reapplied"] == json.loads(out)["erased"] == 2
    with psycopg.connect(restored) as conn:
        gone = conn.execute("SELECT record_id FROM engram_forgotten ORDER BY record_id").fetchall()
        assert sorted(r[0] for r in gone) == sorted(ids[:3])
        left = conn.execute("SELECT id FROM engram_records").fetchall()
        assert [r[0] for r in left] == [ids[3]]

    code, out, _ = run(capsys, "forgets", "replay")
    assert code == 0
    shown = {line.rsplit(None, 1)[0].rstrip(":"): line.split()[-1] for line in out.splitlines()}
    assert shown["already forgotten"] == "3" and shown["forgotten again"] == "0"
    code, out, _ = run(capsys, "forgets", "replay", "--json")
    assert json.loads(out)["reapplied"] == 0 and json.loads(out)["already_forgotten"] == 3


def test_check_exits_1_until_repaired(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fresh_dsn: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    with Store.connect(fresh_dsn) as store:  # no ledger: its forgets are not appended
        mem = store.session(SCOPE, embedder=HashingEmbedder(64))
        mem.forget(mem.remember("Lin's other pin.").records[0].id)

    code, out, _ = run(capsys, "forgets", "check", "--json")
    assert code == 1 and json.loads(out)["missing_from_ledger"] == 1
    code, out, _ = run(capsys, "forgets", "check", "--repair", "--json")
    assert code == 0 and json.loads(out)["repaired"] == 1
    code, out, _ = run(capsys, "forgets", "check")
    assert code == 0 and "missing from the ledger" in out


def test_a_bad_since_is_refused_and_changes_nothing(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fresh_dsn: str,
    postgres: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    ledger = ForgetLedger(tmp_path / "ledger")
    with Store.connect(fresh_dsn, ledger=ledger) as store:
        mem = store.session(SCOPE, embedder=HashingEmbedder(64))
        record_id = mem.remember("Lin's pin is quokkaberry.").records[0].id
        pg_dump(fresh_dsn, tmp_path / "dump")
        mem.forget(record_id)
    restored = pg_restore(postgres.dsn(), postgres.dsn, tmp_path / "dump", "r_bad_since")
    monkeypatch.setenv("DATABASE_URL", restored)
    for since in ["last tuesday", "off", "0"]:
        code, out, err = run(capsys, "forgets", "replay", "--since", since)
        assert (code, out) == (2, "")
        assert f"--since: {since!r} is neither an ISO 8601 time nor a duration such as 36h" in err
        with psycopg.connect(restored) as conn:  # the forget after the dump is not replayed
            assert len(rows_containing(conn, "quokkaberry")) > 0
            assert conn.execute("SELECT count(*) FROM engram_forgotten").fetchone()[0] == 0
    code, out, _ = run(capsys, "forgets", "replay", "--since", "1h", "--json")
    assert code == 0 and json.loads(out)["reapplied"] == 1  # a good one does


def test_since_takes_a_time_or_a_duration_back() -> None:
    now = datetime(2026, 12, 4, 12, tzinfo=UTC)
    assert since_arg("36h", now) == now - timedelta(hours=36)
    assert since_arg("2026-12-01T10:00:00", now) == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert since_arg("2026-12-01T10:00:00+02:00", now) == datetime(2026, 12, 1, 8, tzinfo=UTC)
    assert since_arg(None) is None


def _restored_after_forget(
    fresh_dsn: str,
    postgres: EmbeddedPostgres,
    tmp_path: Path,
    name: str,
    texts: list[str],
    before_forget: Callable[[ForgetLedger, list[str]], None] | None = None,
) -> tuple[str, list[str], str]:
    """A database with ``texts`` recorded, dumped, then the first forgotten (in the
    ledger, after what ``before_forget`` writes there), and the dump restored as
    database ``name``: its DSN, the record ids, and the database's ledger name."""
    ledger = ForgetLedger(tmp_path / "ledger")
    with Store.connect(fresh_dsn, ledger=ledger) as store:
        mem = store.session(SCOPE, embedder=HashingEmbedder(64))
        ids = [mem.remember(t).records[0].id for t in texts]
        pg_dump(fresh_dsn, tmp_path / "dump")
        if before_forget is not None:
            before_forget(ledger, ids)
        mem.forget(ids[0], operation_id="forget-first")
        database = store.database_key
    return pg_restore(postgres.dsn(), postgres.dsn, tmp_path / "dump", name), ids, database


def _forgotten(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return sorted(r[0] for r in conn.execute("SELECT record_id FROM engram_forgotten"))


def test_a_line_the_store_cannot_take_is_named_by_the_dry_run_and_skipped_by_the_replay(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fresh_dsn: str,
    postgres: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    restored, ids, database = _restored_after_forget(
        fresh_dsn, postgres, tmp_path, "r_long_op", ["Lin's pin is wombatine.", "kept"]
    )
    # A line as a writer appends it, its checksum right, its operation id 201 characters.
    ledger = ForgetLedger(tmp_path / "ledger")
    ledger.append([LedgerEntry(ids[1], SCOPE, "o" * 201, datetime.now(UTC), database)])
    monkeypatch.setenv("DATABASE_URL", restored)

    code, out, err = run(capsys, "forgets", "replay", "--dry-run", "--json")
    dry = json.loads(out)
    assert code == 1 and dry["failed"] == 1 and dry["reapplied"] == 1
    [why] = dry["refused_at"]
    assert re.fullmatch(r"forgets-\d{4}-\d{2}-\d{2}\.jsonl:2: .*longer than 200.*", why), why
    assert why in err
    assert _forgotten(restored) == []  # the dry run changed nothing

    code, out, err = run(capsys, "forgets", "replay", "--json")
    real = json.loads(out)
    assert code == 1 and real["refused_at"] == [why] and real["reapplied"] == 1
    assert _forgotten(restored) == [ids[0]]  # the good line applied, the bad one skipped
    with psycopg.connect(restored) as conn:
        assert rows_containing(conn, "wombatine") == []
        assert [r[0] for r in conn.execute("SELECT id FROM engram_records")] == [ids[1]]


def test_a_line_of_another_scope_forgets_that_scopes_id_and_the_record_stays(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fresh_dsn: str,
    postgres: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    """A record id is its scope's (issue 36): eve's line for the id of lin's record is
    eve's forget of her own record of that id, which this database never had. It is
    tombstoned in eve's scope, and lin's record, in every table, stays."""
    restored, ids, database = _restored_after_forget(
        fresh_dsn, postgres, tmp_path, "r_wrong_scope", ["Lin's pin is numbatlace.", "Lin's key"]
    )
    eve = {"user_id": "eve"}  # the record is lin's
    ledger = ForgetLedger(tmp_path / "ledger")
    ledger.append([LedgerEntry(ids[1], eve, "f-eve", datetime.now(UTC), database)])
    monkeypatch.setenv("DATABASE_URL", restored)

    for dry_run in (["--dry-run"], []):
        code, out, _ = run(capsys, "forgets", "replay", *dry_run, "--json")
        result = json.loads(out)
        assert code == 0 and result["failed"] == 0, result
        assert (result["reapplied"], result["tombstoned"]) == (1, 1)
    with psycopg.connect(restored) as conn:
        assert sorted(
            conn.execute(
                "SELECT s.key, f.record_id FROM engram_forgotten f"
                " JOIN engram_scopes s ON s.id = f.scope_id"
            ).fetchall()
        ) == sorted([('{"user_id":"eve"}', ids[1]), ('{"user_id":"lin"}', ids[0])])
        assert [r[0] for r in conn.execute("SELECT id FROM engram_records")] == [ids[1]]
        assert len(rows_containing(conn, "Lin's key")) > 0
        assert conn.execute(
            "SELECT count(*) FROM engram_receipts WHERE operation_id = 'f-eve'"
        ).fetchone() == (1,)


def test_a_ledger_shared_with_another_database_hides_none_of_this_ones_forgets(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fresh_dsn: str,
    postgres: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    def another_database_first(ledger: ForgetLedger, ids: list[str]) -> None:
        # Another database sharing the directory forgot a record of the same id in a
        # scope of its own, first: its line comes before this database's.
        at = datetime.now(UTC)
        ledger.append([LedgerEntry(ids[0], {"user_id": "zed"}, "zed-op", at, "0123456789abcdef")])

    restored, [record_id], _ = _restored_after_forget(
        fresh_dsn,
        postgres,
        tmp_path,
        "r_shared",
        ["Lin's pin is dingoquill."],
        before_forget=another_database_first,
    )
    monkeypatch.setenv("DATABASE_URL", restored)

    code, out, _ = run(capsys, "forgets", "replay", "--json")
    result = json.loads(out)
    assert code == 0, result
    assert (result["reapplied"], result["other_databases"], result["failed"]) == (1, 1, 0)
    assert _forgotten(restored) == [record_id]
    with psycopg.connect(restored) as conn:
        assert rows_containing(conn, "dingoquill") == []
    code, out, _ = run(capsys, "forgets", "check", "--json")
    assert code == 0 and json.loads(out)["unknown_to_store"] == 0
