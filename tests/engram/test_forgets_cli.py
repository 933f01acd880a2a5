"""``engram forgets replay|check``, in this process: replay on a database restored from
``pg_dump`` re-applies exactly the forgets after the dump, a second run changes nothing;
check finds what the ledger lacks and repairs it; bad input changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from engram.cli import main
from engram.forgets_cli import since_arg
from engram.store import HashingEmbedder, Store
from engram.store.ledger import ForgetLedger
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
    assert json.loads(out) | {"dry_run": True} == {
        "in_ledger": 3,
        "already_forgotten": 1,
        "reapplied": 2,
        "tombstoned": 0,
        "failed": 0,
        "erased": 0,
        "damaged_lines": 0,
        "dry_run": True,
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
