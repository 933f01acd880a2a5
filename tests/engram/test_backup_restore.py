"""``engram backup`` and ``engram restore`` on real homes: the embedded PostgreSQL with
WAL archiving into ENGRAM_BACKUP_DIR, base backups, a restore that keeps every forget
of the ledger (re-applied before anything serves), point-in-time recovery, a restore
SIGKILLed during its replay and finished by the next run, and retention."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from engram.cli import main
from engram.home import UP, HomeLock
from engram.store import HashingEmbedder, Operation, Scope, Store
from engram.store import backup as backups
from engram.store.errors import RestorePendingError
from engram.store.ledger import ForgetLedger, LedgerEntry
from engram.store.server import EmbeddedPostgres
from engram.store.server import data_dir as postgres_dir
from engram.up import ArchiveWatch
from engram.worker.consuming.replies import send_reply
from engram.worker.protocol import encode_reply
from engram.worker.settings import Settings
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.helpers import marker_text, rows_containing
from tests.redis_fixtures import REPO, wait_until
from tests.web_fixtures import OPERATOR, Served, free_port

SCOPE = {"user_id": "backup-test"}


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home of its own (short: the sockets' paths), its backups beside it; every
    server on it stopped and both removed after the test."""
    top = Path(tempfile.mkdtemp(prefix="eb-"))
    home = top / "h"
    home.mkdir()
    monkeypatch.setenv("ENGRAM_HOME", str(home))
    monkeypatch.setenv("ENGRAM_BACKUP_DIR", str(top / "bk"))
    for name in ("DATABASE_URL", "REDIS_URL", "ENGRAM_BACKUP_KEEP", "ENGRAM_FORGET_LEDGER_DIR"):
        monkeypatch.delenv(name, raising=False)
    yield home
    EmbeddedPostgres.stop_stale(home)
    shutil.rmtree(top, ignore_errors=True)


def backup_dir(home: Path) -> Path:
    return home.parent / "bk"


class Home:
    """The home's server with archiving on, and a store whose forgets go to the ledger
    (and beside the backups, as every engram process's do: ``Settings.ledger``)."""

    def __init__(self, home: Path) -> None:
        self.server = EmbeddedPostgres(home, backup_dir=backup_dir(home))
        self.store = Store.connect(self.server.dsn(), ledger=Settings.from_env().ledger())
        self.mem = self.store.session(SCOPE, embedder=HashingEmbedder(64))

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            return conn.execute(query, params).fetchall()  # type: ignore[arg-type]

    def archive_now(self) -> None:
        """Close the current WAL segment and wait until the server has archived it."""
        [(segment,)] = self.sql("SELECT pg_walfile_name(pg_switch_wal())")
        wait_until(
            lambda: (backup_dir(self.server.data_dir.parent) / "wal" / segment).exists(),
            timeout=30,
            what=f"segment {segment} archived",
        )

    def texts(self) -> list[str]:
        return sorted(r.text for r in self.store.records(SCOPE))

    def close(self) -> None:
        self.store.close()
        self.server.stop()


@pytest.fixture
def opened(home: Path) -> Iterator[list[Home]]:
    """Homes opened by a test; closed after it, whatever happened."""
    made: list[Home] = []
    yield made
    for h in made:
        h.close()


def open_home(home: Path, opened: list[Home]) -> Home:
    h = Home(home)
    opened.append(h)
    return h


def close_home(opened: list[Home]) -> None:
    opened.pop().close()


def engram(*argv: str) -> int:
    return main(list(argv))


def file_hits(folder: Path, needles: list[bytes]) -> list[str]:
    """The files under ``folder`` whose bytes hold any of ``needles``."""
    hits = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(n in data for n in needles):
                hits.append(str(path.relative_to(folder)))
    return hits


def test_a_restore_brings_back_the_backup_but_keeps_the_forgets_made_since(
    home: Path, opened: list[Home]
) -> None:
    secret, kept_text, later_text = marker_text(1), marker_text(2), marker_text(3)
    h = open_home(home, opened)
    # Y first: X's row then lies below Y's in their pages, where the freed space
    # keeps its bytes after a VACUUM (nothing moves over them).
    h.mem.remember(f"Y: {kept_text}", operation_id="op-y")
    x = h.mem.remember(f"X: {secret}", operation_id="op-x").records[0]
    close_home(opened)
    assert engram("backup") == 0

    h = open_home(home, opened)
    h.mem.forget(x.id, operation_id="forget-x")
    assert [e.record_id for e in ForgetLedger(home / "ledger").entries()] == [x.id]
    h.mem.remember(f"Z: {later_text}", operation_id="op-z")
    h.archive_now()
    close_home(opened)

    assert engram("restore", "--from", str(backup_dir(home))) == 0

    # Before anything serves it: the restored files hold X nowhere (the restore ended
    # with checkpoints and a shutdown), in text or as the index's lower-case lexeme.
    needles = [secret.encode(), secret.lower().encode()]
    assert file_hits(postgres_dir(home), needles) == []
    h = open_home(home, opened)
    with psycopg.connect(h.server.dsn()) as conn:
        assert rows_containing(conn, secret) == []
        assert rows_containing(conn, later_text) == []  # Z came after the backup
        assert rows_containing(conn, kept_text) != []
    assert h.texts() == [f"Y: {kept_text}"]
    assert h.store.receipt("op-z") is None  # Z's producer finds no receipt
    forget = h.store.receipt("forget-x")
    assert forget is not None and forget.redaction == "complete"
    assert h.sql(f"SELECT to_regclass('{backups.RESTORE_PENDING_TABLE}')") == [(None,)]
    assert not (home / backups.RESTORE_STATE).exists()
    assert len(list(home.glob("postgres.before-restore-*"))) == 1


def test_a_restore_to_a_time_between_two_writes_has_only_the_first(
    home: Path, opened: list[Home]
) -> None:
    first, second = marker_text(4), marker_text(5)
    h = open_home(home, opened)
    close_home(opened)
    assert engram("backup") == 0
    h = open_home(home, opened)
    h.mem.remember(first, operation_id="op-t1")
    # After the first commit, before the second: the server's own clock.
    [(between,)] = h.sql("SELECT clock_timestamp()")
    h.mem.remember(second, operation_id="op-t2")
    h.archive_now()
    close_home(opened)

    assert engram("restore", "--from", str(backup_dir(home)), "--to", between.isoformat()) == 0

    h = open_home(home, opened)
    assert h.texts() == [first]
    assert h.store.receipt("op-t1") is not None and h.store.receipt("op-t2") is None


def test_a_restore_to_a_time_past_the_archive_is_refused_and_changes_nothing(
    home: Path, opened: list[Home], capsys: pytest.CaptureFixture[str]
) -> None:
    h = open_home(home, opened)
    close_home(opened)
    assert engram("backup") == 0
    h = open_home(home, opened)
    h.mem.remember("after the backup", operation_id="op-after")
    h.archive_now()
    [(last,)] = h.sql("SELECT clock_timestamp()")  # after the archive's last commit
    close_home(opened)
    before = sorted(p.name for p in home.iterdir())
    capsys.readouterr()

    past = (last + timedelta(hours=1)).isoformat()
    assert engram("restore", "--from", str(backup_dir(home)), "--to", past) == 2

    err = capsys.readouterr().err
    assert "past the WAL archive" in err and "nothing was changed" in err, err
    assert sorted(p.name for p in home.iterdir()) == before
    assert not (home / backups.RESTORE_STATE).exists()
    assert not list(home.glob("postgres.before-restore-*"))
    h = open_home(home, opened)  # it starts: the home is not left restore_pending
    assert h.texts() == ["after the backup"]
    assert h.store.receipt("op-after") is not None


def test_a_restore_killed_during_its_replay_serves_nothing_and_the_next_run_finishes_it(
    home: Path, opened: list[Home], redis_url: str
) -> None:
    secret = marker_text(6)
    h = open_home(home, opened)
    ops = [Operation.build("remember", SCOPE, {"text": f"{secret} {i}"}) for i in range(3000)]
    ids = [r.records[0].id for r in h.store.execute(ops, HashingEmbedder(64))]  # type: ignore[union-attr]
    h.mem.remember("kept", operation_id="op-kept")
    close_home(opened)
    assert engram("backup") == 0
    # Forgets made after the backup, as their ledger lines (the forgets themselves
    # would only take longer to make here).
    at = datetime.now(UTC)
    ForgetLedger(home / "ledger").append(
        [LedgerEntry(rid, SCOPE, f"forget-{i}", at) for i, rid in enumerate(ids)]
    )

    restore = subprocess.Popen(
        [sys.executable, "-m", "engram", "restore", "--from", str(backup_dir(home))],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    private = f"postgresql://postgres@/postgres?host={home.resolve() / 'restore-run'}"
    try:
        wait_until(lambda: _replay_begun(private), timeout=300, what="the replay begun")
    finally:
        restore.send_signal(signal.SIGKILL)
        restore.wait()
    # The home is free once the watchdog stopped what the restore started.
    wait_until(lambda: _free(home), timeout=120, what="the home free")

    # Nothing serves meanwhile: the home's server does not start...
    with pytest.raises(RestorePendingError):
        EmbeddedPostgres(home)
    assert engram("migrate") != 0
    # ... and a server started on its folder by hand is refused by the workers, the web
    # (dashboard and API) and the MCP server.
    by_hand = _start_by_hand(home)
    try:
        dsn = f"postgresql://postgres@/postgres?host={home.resolve() / 'by-hand'}"
        assert _pending(dsn), "the kill landed after the replay: make the replay longer"
        with pytest.raises(RestorePendingError):
            Store.connect(dsn)
        for command in (
            ["worker"],
            ["web", "--port", str(free_port())],
            ["mcp", "--scope", '{"user_id": "u"}'],
        ):
            ran = subprocess.run(
                [sys.executable, "-m", "engram", *command],
                env={
                    **os.environ,
                    "PYTHONPATH": str(REPO),
                    "DATABASE_URL": dsn,
                    "REDIS_URL": redis_url,
                },
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert ran.returncode != 0 and "restore_pending" in ran.stderr, ran.stderr
    finally:
        by_hand.send_signal(signal.SIGINT)
        by_hand.wait(timeout=60)

    assert engram("restore", "--from", str(backup_dir(home))) == 0
    assert not (home / backups.RESTORE_STATE).exists()
    assert file_hits(postgres_dir(home), [secret.encode(), secret.lower().encode()]) == []
    h = open_home(home, opened)
    assert h.texts() == ["kept"]
    # Only one database was set aside: the one there before the first run.
    assert len(list(home.glob("postgres.before-restore-*"))) == 1


def test_while_a_restore_is_pending_every_command_says_the_same_and_names_how_to_finish_it(
    home: Path, opened: list[Home]
) -> None:
    h = open_home(home, opened)
    h.mem.remember("kept", operation_id="op-kept")
    close_home(opened)
    assert engram("backup") == 0
    # A restore killed once it began: its state file is in the home.
    restore = subprocess.Popen(
        [sys.executable, "-m", "engram", "restore", "--from", str(backup_dir(home))],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: (home / backups.RESTORE_STATE).exists() or restore.poll() is not None,
            timeout=120,
            what="the restore begun",
        )
    finally:
        restore.send_signal(signal.SIGKILL)
        restore.wait()
    assert (home / backups.RESTORE_STATE).exists(), "the restore ended before the kill"
    wait_until(lambda: _free(home), timeout=120, what="the home free")

    answers = {}
    for command in (
        ["up"],
        ["worker"],
        ["web", "--port", str(free_port())],
        ["jobs"],
        ["enqueue", "remember", "--scope", '{"user_id": "u"}', "--request", '{"text": "t"}'],
        ["mcp", "--scope", '{"user_id": "u"}'],
        ["migrate"],
        ["health"],
        ["metrics"],
        ["recall", "--scope", '{"user_id": "u"}', "x"],
        ["tokens", "list"],
        ["forgets", "check"],
        ["backup"],
    ):
        ran = subprocess.run(
            [sys.executable, "-m", "engram", *command],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        answers[command[0]] = (ran.returncode, ran.stderr.strip())
    finish = f"engram restore --from {backup_dir(home).resolve()}"
    [(code, message)] = set(answers.values())  # one code, one message: for all
    assert code == 1 and message.startswith("engram: restore_pending:"), answers
    assert f"Finish it with `{finish}`" in message, message
    # What reads only the backup folder still answers.
    assert engram("backup", "list") == 0

    assert engram("restore", "--from", str(backup_dir(home))) == 0
    h = open_home(home, opened)
    assert h.texts() == ["kept"]


def _free(home: Path) -> bool:
    lock = HomeLock(home)
    if not lock.acquire("test"):
        return False
    lock.release()
    return True


def _replay_begun(dsn: str) -> bool:
    try:
        return _pending(dsn)
    except psycopg.OperationalError:
        return False


def _pending(dsn: str) -> bool:
    with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
        return backups.restore_pending(conn) is not None


def _start_by_hand(home: Path) -> subprocess.Popen[bytes]:
    """The restored folder's server, started as an operator might (not through engram)."""
    sockets = home.resolve() / "by-hand"
    sockets.mkdir(exist_ok=True)
    backups.give_to_server(sockets)
    proc = subprocess.Popen(
        [
            str(backups.pg_bin("postgres")),
            *("-D", str(postgres_dir(home)), "-k", str(sockets), "-h", ""),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        user=backups.server_user(),
    )
    dsn = f"postgresql://postgres@/postgres?host={sockets}"
    wait_until(lambda: _answers(dsn), timeout=60, what="the server started by hand")
    return proc


def _answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def test_restore_refuses_a_home_engram_up_holds_and_changes_nothing(home: Path) -> None:
    h = Home(home)
    h.close()
    assert engram("backup") == 0
    before = sorted(p.name for p in home.iterdir())
    lock = HomeLock(home)
    assert lock.acquire(UP)
    try:
        assert engram("restore", "--from", str(backup_dir(home))) != 0
    finally:
        lock.release()
    assert sorted(p.name for p in home.iterdir()) == before


def test_backup_list_and_retention_keep_the_newest_and_the_wal_they_need(
    home: Path, opened: list[Home], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    h = open_home(home, opened)
    h.archive_now()
    close_home(opened)
    assert engram("backup") == 0
    h = open_home(home, opened)
    h.mem.remember("between the backups")
    h.archive_now()
    close_home(opened)
    monkeypatch.setenv("ENGRAM_BACKUP_KEEP", "1")
    capsys.readouterr()
    assert engram("backup", "--json") == 0
    newest = backups.BackupInfo(**json.loads(capsys.readouterr().out))

    listed = backups.list_backups(backup_dir(home))
    assert [b.label for b in listed] == [newest.label]
    assert engram("backup", "list") == 0
    assert newest.label in capsys.readouterr().out
    segments = [p.name for p in (backup_dir(home) / "wal").iterdir() if len(p.name) == 24]
    assert segments and min(segments)[8:] >= newest.start_wal[8:]

    # A bad retention setting is refused before anything is taken or removed.
    monkeypatch.setenv("ENGRAM_BACKUP_KEEP", "forever")
    assert engram("backup") != 0
    assert [b.label for b in backups.list_backups(backup_dir(home))] == [newest.label]


def test_archiving_follows_engram_backup_dir_at_each_start(home: Path) -> None:
    def archive_mode(server: EmbeddedPostgres) -> str:
        with psycopg.connect(server.dsn()) as conn:
            return str(conn.execute("SHOW archive_mode").fetchone()[0])  # type: ignore[index]

    server = EmbeddedPostgres(home, backup_dir=backup_dir(home))
    try:
        assert archive_mode(server) == "on"  # restarted once to take it
        assert (backup_dir(home) / "wal").is_dir()
    finally:
        server.stop()
    server = EmbeddedPostgres(home)  # ENGRAM_BACKUP_DIR unset since
    try:
        assert archive_mode(server) == "off"
    finally:
        server.stop()


def test_a_restore_of_one_backup_copied_elsewhere_replays_the_archive_its_manifest_names(
    home: Path, opened: list[Home], monkeypatch: pytest.MonkeyPatch
) -> None:
    before, after = marker_text(7), marker_text(8)
    h = open_home(home, opened)
    h.mem.remember(before, operation_id="op-before")
    close_home(opened)
    assert engram("backup") == 0
    h = open_home(home, opened)
    h.mem.remember(after, operation_id="op-after")  # in the archive only
    h.archive_now()
    close_home(opened)
    # The one backup copied to a folder of its own; where its ../../wal would be, a
    # folder any local user could have made (empty: replayed, it would lose the write).
    [info] = backups.list_backups(backup_dir(home))
    copy = home.parent / "x" / "b"
    shutil.copytree(info.path, copy)
    planted = home.parent / "wal"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    # Restored with no ENGRAM_BACKUP_DIR: the new timeline's history goes into the
    # archive replayed all the same, so the next restore takes a timeline of its own.
    monkeypatch.delenv("ENGRAM_BACKUP_DIR")

    assert engram("restore", "--from", str(copy), "--to", "latest") == 0
    assert (backup_dir(home) / "wal" / "00000002.history").is_file()

    h = open_home(home, opened)
    assert h.texts() == sorted([before, after])
    assert list(planted.iterdir()) == []


def test_a_restore_refuses_an_archive_the_server_does_not_own_and_changes_nothing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Home(home).close()
    assert engram("backup") == 0
    wal = backup_dir(home) / "wal"
    before = sorted(p.name for p in home.iterdir())
    capsys.readouterr()

    if os.geteuid() == 0:  # as CI runs: a folder can be given to another user
        os.chown(wal, 65534, 65534)
        assert engram("restore", "--from", str(backup_dir(home))) == 2
        assert "belongs to uid 65534" in capsys.readouterr().err
        os.chown(wal, backups.archive_owner(), -1)
    wal.chmod(0o777)  # the server's, but anyone may add to it
    assert engram("restore", "--from", str(backup_dir(home))) == 2
    assert "may be written by others" in capsys.readouterr().err
    assert sorted(p.name for p in home.iterdir()) == before
    assert not list(home.glob("postgres.before-restore-*"))


def test_a_token_revoked_after_the_backup_stays_revoked_after_a_restore(
    home: Path,
    opened: list[Home],
    redis_url: str,
    serve_web: Callable[..., Served],
    capsys: pytest.CaptureFixture[str],
) -> None:
    Home(home).close()
    secrets = {}
    for name in ("leaked", "kept"):
        assert (
            engram("tokens", "create", "--scope", '{"user_id": "ada"}', "--name", name, "--json")
            == 0
        )
        secrets[name] = json.loads(capsys.readouterr().out)["token"]
    assert engram("backup") == 0
    assert engram("tokens", "revoke", "leaked", "--by", "grace") == 0
    [(where, revocation)] = ForgetLedger(home / "ledger").revocations()
    assert where.startswith("revocations-") and revocation.token == "leaked"
    assert secrets["leaked"] not in (home / "ledger" / where.split(":")[0]).read_text()

    capsys.readouterr()
    assert engram("restore", "--from", str(backup_dir(home)), "--json") == 0
    assert json.loads(capsys.readouterr().out)["tokens_revoked_again"] == 1

    assert engram("tokens", "list", "--json") == 0
    listed = {t["name"]: t for t in json.loads(capsys.readouterr().out)}
    assert listed["leaked"]["revoked_by"] == "grace"
    assert listed["leaked"]["revoked_at"] == revocation.at.isoformat()
    assert listed["kept"]["revoked_at"] is None
    h = open_home(home, opened)
    served = serve_web(database_url=h.server.dsn(), redis_url=redis_url)
    url = served.url + "/api/v1/records/no-such-record"
    leaked = httpx.get(url, headers={"Authorization": f"Bearer {secrets['leaked']}"})
    assert leaked.status_code == 401
    kept = httpx.get(url, headers={"Authorization": f"Bearer {secrets['kept']}"})
    assert kept.status_code == 404  # a live token of the same backup still answers
    audit = h.sql("SELECT requested_by FROM engram_audit WHERE action = 'token.revoke'")
    assert audit == [("ledger-replay",)]
    # A replay after it finds the token revoked already.
    close_home(opened)
    assert engram("forgets", "replay", "--json") == 0
    assert json.loads(capsys.readouterr().out)["tokens_revoked"] == 0


def test_after_a_restore_the_api_answers_404_for_an_operation_it_lost_not_valkeys_reply(
    home: Path,
    opened: list[Home],
    redis_url: str,
    serve_web: Callable[..., Served],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Home(home).close()
    assert engram("backup") == 0
    h = open_home(home, opened)
    embedder = HashingEmbedder(64)
    [kept] = h.store.execute([Operation.build("remember", SCOPE, {"text": "a"}, "op-a")], embedder)
    [(between,)] = h.sql("SELECT clock_timestamp()")
    [lost] = h.store.execute([Operation.build("remember", SCOPE, {"text": "b"}, "op-b")], embedder)
    h.archive_now()
    close_home(opened)
    # Their replies, as the worker that committed them left them in valkey.
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    for result in (kept, lost):
        op_key = (Scope.of(SCOPE).key, result.receipt.operation_id)  # type: ignore[union-attr]
        send_reply(pipe, op_key, encode_reply(result), 3600)
    pipe.execute()
    client.close()

    assert engram("restore", "--from", str(backup_dir(home)), "--to", between.isoformat()) == 0

    capsys.readouterr()
    assert engram("tokens", "create", "--scope", json.dumps(SCOPE), "--name", "p", "--json") == 0
    token = json.loads(capsys.readouterr().out)["token"]
    h = open_home(home, opened)
    served = serve_web(database_url=h.server.dsn(), redis_url=redis_url)

    def operation(op_id: str) -> httpx.Response:
        return httpx.get(
            f"{served.url}/api/v1/operations/{op_id}",
            headers={"Authorization": f"Bearer {token}"},
        )

    lost_answer = operation("op-b")  # the database's truth, as MCP's operation tool says
    assert lost_answer.status_code == 404, lost_answer.text
    assert lost_answer.json()["error"]["code"] == "not_found"
    kept_answer = operation("op-a")
    assert kept_answer.status_code == 200 and kept_answer.json()["state"] == "committed"
    [(by, detail)] = h.sql(
        "SELECT requested_by, detail FROM engram_audit WHERE action = 'database.restore'"
    )
    assert by.startswith("cli:") and detail["target"] == between.isoformat()
    # engram wait says the same, from the same reckoning (Store.lost_to_restore).
    monkeypatch.setenv("DATABASE_URL", h.server.dsn())
    monkeypatch.setenv("REDIS_URL", redis_url)
    capsys.readouterr()
    assert engram("wait", "op-b", "--scope", json.dumps(SCOPE), "--timeout", "5") == 1
    said = capsys.readouterr()
    assert json.loads(said.out)["error"]["code"] == "not_found", said
    assert engram("wait", "op-a", "--scope", json.dumps(SCOPE), "--timeout", "5") == 0
    assert json.loads(capsys.readouterr().out)["operation_id"] == "op-a"


def test_a_restore_into_a_fresh_home_elsewhere_serves_it_as_up_would(
    home: Path, opened: list[Home], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine lost with its disk: the backups copied to a new one, restored into a
    home that never held anything (as root, the CI's user, and as anyone else)."""
    h = open_home(home, opened)
    h.mem.remember("kept", operation_id="op-kept")
    close_home(opened)
    assert engram("backup") == 0
    fresh = home.parent / "fresh"
    monkeypatch.setenv("ENGRAM_HOME", str(fresh))

    try:
        assert engram("restore", "--from", str(backup_dir(home))) == 0
        found = fresh.stat()
        if os.geteuid() == 0:  # the server's user passes through, as `up` leaves a home
            assert (stat.S_IMODE(found.st_mode), found.st_gid) == (0o710, os.getegid())
        else:
            assert stat.S_IMODE(found.st_mode) == 0o700
        h = open_home(fresh, opened)
        assert h.texts() == ["kept"]
        assert not (fresh / backups.RESTORE_STATE).exists()
    finally:
        EmbeddedPostgres.stop_stale(fresh)


def test_the_databases_a_restore_sets_aside_are_named_shown_and_removed_on_request(
    home: Path,
    opened: list[Home],
    redis_url: str,
    serve_web: Callable[..., Served],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = marker_text(10)
    h = open_home(home, opened)
    x = h.mem.remember(f"X: {secret}", operation_id="op-x").records[0]
    h.mem.remember("kept", operation_id="op-kept")
    close_home(opened)
    assert engram("backup") == 0
    h = open_home(home, opened)
    h.mem.forget(x.id, operation_id="forget-x")  # the set-aside database held X
    close_home(opened)
    capsys.readouterr()

    assert engram("restore", "--from", str(backup_dir(home))) == 0
    [aside] = home.glob(f"{backups.SET_ASIDE_PREFIX}*")
    said = capsys.readouterr()
    assert str(aside) in said.out  # previous_database
    assert str(aside) in said.err and "engram restore --discard-previous" in said.err

    monkeypatch.setenv("REDIS_URL", redis_url)
    engram("health")  # no worker here: exit 1, and its report
    [shown] = json.loads(capsys.readouterr().out)["set_aside_databases"]
    assert shown["path"] == str(aside) and shown["size_bytes"] > 0
    h = open_home(home, opened)
    served = serve_web(database_url=h.server.dsn(), redis_url=redis_url)
    page = httpx.get(served.url + "/", headers=OPERATOR)
    assert 'id="set-aside"' in page.text and str(aside) in page.text
    close_home(opened)

    assert engram("restore", "--discard-previous") == 0
    assert not aside.exists()
    assert "removed 1 set-aside database(s)" in capsys.readouterr().out
    # Nothing in the home holds X any more (the restored database never did).
    assert file_hits(home, [secret.encode(), secret.lower().encode()]) == []
    engram("health")
    assert "set_aside_databases" not in json.loads(capsys.readouterr().out)
    h = open_home(home, opened)
    assert h.texts() == ["kept"]


def test_a_restore_skips_a_ledger_line_it_cannot_apply_and_finishes(
    home: Path, opened: list[Home], capsys: pytest.CaptureFixture[str]
) -> None:
    secret = marker_text(9)
    h = open_home(home, opened)
    x = h.mem.remember(f"X: {secret}", operation_id="op-x").records[0]
    h.mem.remember("kept", operation_id="op-kept")
    close_home(opened)
    assert engram("backup") == 0
    h = open_home(home, opened)
    h.mem.forget(x.id, operation_id="forget-x")
    # Then a line as a writer appends it, its checksum right, which no store can take.
    bad = LedgerEntry("other", SCOPE, "o" * 201, datetime.now(UTC), h.store.database_key)
    ForgetLedger(home / "ledger").append([bad])
    close_home(opened)
    capsys.readouterr()

    assert engram("restore", "--from", str(backup_dir(home)), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["forgets_replayed"], report["ledger_lines_refused"]) == (1, 1)
    assert not (home / backups.RESTORE_STATE).exists()
    h = open_home(home, opened)  # served: the marker is gone
    assert h.texts() == ["kept"]
    assert h.sql(f"SELECT to_regclass('{backups.RESTORE_PENDING_TABLE}')") == [(None,)]


def test_a_restore_on_a_new_machine_replays_the_backups_ledger_and_refuses_without_one(
    home: Path, opened: list[Home], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The ledger travels with the backups (appended beside them as it is appended):
    a fresh home restores from them with every forget kept. Without it, the restore
    refuses and changes nothing, unless told --without-ledger, which it says."""
    secret = marker_text(11)
    h = open_home(home, opened)
    x = h.mem.remember(f"Carol therapist note {secret} keep private", operation_id="op-x")
    h.mem.remember("kept", operation_id="op-kept")
    close_home(opened)
    assert engram("backup") == 0
    h = open_home(home, opened)
    h.mem.forget(x.records[0].id, operation_id="forget-x")  # after the backup
    h.archive_now()
    close_home(opened)
    fresh = home.parent / "fresh"
    monkeypatch.setenv("ENGRAM_HOME", str(fresh))
    try:
        assert engram("restore", "--from", str(backup_dir(home)), "--to", "latest") == 0
        h = open_home(fresh, opened)
        assert h.texts() == ["kept"]
        close_home(opened)
        assert file_hits(fresh, [secret.encode(), secret.lower().encode()]) == []
        capsys.readouterr()
        assert engram("forgets", "check", "--json") == 0  # the home's ledger has it now
        assert json.loads(capsys.readouterr().out)["in_ledger"] == 1
    finally:
        EmbeddedPostgres.stop_stale(fresh)

    # The backup folder copied without its ledger, restored on yet another machine.
    shutil.rmtree(backup_dir(home) / "ledger")
    other = home.parent / "other"
    monkeypatch.setenv("ENGRAM_HOME", str(other))
    capsys.readouterr()
    assert engram("restore", "--from", str(backup_dir(home))) == 2
    err = capsys.readouterr().err
    assert "ledger_missing" in err and "Nothing was changed" in err, err
    assert not other.exists() or list(other.iterdir()) == []
    try:
        assert engram("restore", "--from", str(backup_dir(home)), "--without-ledger") == 0
        said = capsys.readouterr()
        assert "WARNING: restored without a forget ledger" in said.err, said.err
        h = open_home(other, opened)
        # Honest about it: the forgotten record is back, and the audit says why.
        assert h.texts() == sorted(["kept", f"Carol therapist note {secret} keep private"])
        [(detail,)] = h.sql("SELECT detail FROM engram_audit WHERE action = 'database.restore'")
        assert "--without-ledger" in detail["ledger"]
        close_home(opened)
    finally:
        EmbeddedPostgres.stop_stale(other)


def test_failing_wal_archiving_is_said_by_health_metrics_the_overview_and_ups_log(
    home: Path,
    opened: list[Home],
    redis_url: str,
    serve_web: Callable[..., Served],
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    h = open_home(home, opened)
    h.archive_now()
    # Another file archived already under the name of the segment written now (as two
    # restores onto one timeline left): never replaced, and archiving stops there.
    [(current,)] = h.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
    planted = backup_dir(home) / "wal" / current
    planted.write_bytes(b"not this segment")
    backups.give_to_server(planted)
    h.mem.remember("a write", operation_id="op-w")
    h.sql("SELECT pg_switch_wal()")

    def failing() -> bool:
        with psycopg.connect(h.server.dsn(), autocommit=True) as conn:
            status = backups.archive_status(conn)
        return status is not None and status.failing

    wait_until(failing, timeout=60, what="the archiver failing")
    assert planted.read_bytes() == b"not this segment"

    monkeypatch.setenv("DATABASE_URL", h.server.dsn())
    monkeypatch.setenv("REDIS_URL", redis_url)
    capsys.readouterr()
    engram("health")  # no worker here: exit 1, and its report
    shown = json.loads(capsys.readouterr().out)["wal_archive"]
    assert shown["status"] == "failing" and shown["last_failed_wal"] == current
    assert engram("metrics") == 0
    exposition = capsys.readouterr().out
    assert "engram_wal_archive_failing 1" in exposition, exposition
    assert "engram_wal_archive_failed_total " in exposition
    served = serve_web(database_url=h.server.dsn(), redis_url=redis_url)
    page = httpx.get(served.url + "/", headers=OPERATOR)
    assert 'id="wal-archive"' in page.text and current in page.text
    metrics = httpx.get(served.url + "/metrics", headers=OPERATOR)
    assert "engram_wal_archive_failing 1" in metrics.text
    capsys.readouterr()
    ArchiveWatch(h.server.dsn(), every_s=0).check()  # up's, every 15 s: on up's log
    assert "ERROR   engram.up: WAL archiving fails" in capsys.readouterr().err

    # Removed (the operator moved it away): archiving goes on, and every door says so.
    planted.unlink()
    h.mem.remember("another write", operation_id="op-w2")
    h.sql("SELECT pg_switch_wal()")  # wakes the archiver, which tries again
    wait_until(lambda: not failing(), timeout=120, what="the archiver archiving again")
    engram("health")
    assert "wal_archive" not in json.loads(capsys.readouterr().out)
