"""The restore drill of issue 38, as an operator runs it from docs/backups.md, through
the CLI on a real ``engram up`` home: a backup, writes, forgets, writes, a second
backup; then restores to the latest point, to a time, from the older base backup,
into a fresh home on another path (the backup folder's ledger its only ledger), and
a point-in-time restore past the one before (its recovery crossing two timeline
switches). After each: exactly the expected records, every forget kept, no
forgotten text in any file of the home, ``engram forgets check`` clean, and the WAL
archiving healthy with each new timeline's history archived.

One home and its steps shared: each restore costs a recovery and a ``VACUUM FULL``.
As root (the CI), the embedded PostgreSQL runs as its own user, so the archive and
the database folders are another user's than the command's; as anyone else, all
are the command's. A normal user's run from a root machine is not exercised here
(it would need a second home and every step run again as that user)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engram.cleanup import clean_home
from engram.store import Store, timelines
from engram.store import backup as backups
from engram.store.server import EmbeddedPostgres
from engram.worker import Producer
from tests.engram.test_backup_restore import file_hits
from tests.engram.test_up import Up, home_env, start_up  # noqa: F401 (a fixture)
from tests.helpers import marker_text
from tests.redis_fixtures import REPO, wait_until

# Five restores and two runs of engram up: minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SCOPES = [{"user_id": "carol"}, {"user_id": "dan"}, {"user_id": "erin"}]


@pytest.fixture
def top() -> Iterator[Path]:
    """A folder for the homes and the backups (short: the sockets' paths)."""
    base = Path(tempfile.mkdtemp(prefix="drill-"))
    yield base
    for home in (base / "h", base / "fresh"):
        if home.exists():
            EmbeddedPostgres.stop_stale(home)
            clean_home(home)
    shutil.rmtree(base, ignore_errors=True)


class Drill:
    """The home the operator drills on, the backup folder, and what was written."""

    def __init__(self, top: Path, start: Callable[..., Up]) -> None:
        self.home = top / "h"
        self.backups = top / "bk"
        self.start = start
        self.forgotten: list[str] = []  # the forgotten records' texts
        self.texts: dict[str, str] = {}  # every text written, by its step's name

    def env(self, home: Path | None = None) -> dict[str, str]:
        return {**home_env(home or self.home), "ENGRAM_BACKUP_DIR": str(self.backups)}

    def up(self, home: Path | None = None) -> tuple[Up, Producer, Store]:
        up = self.start(home or self.home, "--workers", "1", "--no-web", env=self.env(home))
        run = up.wait_ready()
        producer = Producer.from_url(str(run["redis_url"]), partitions=4)
        store = Store.connect(str(run["database_url"]), migrate=False, max_connections=2)
        return up, producer, store

    def cli(
        self, *args: str, home: Path | None = None, database_url: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = self.env(home)
        if database_url is not None:  # the home's server, already running
            env["DATABASE_URL"] = database_url
        return subprocess.run(
            [sys.executable, "-m", "engram", *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )

    def write(self, producer: Producer, step: str, n: int = 1) -> list[str]:
        """``n`` records in each scope, waited for; their ids."""
        ids = []
        for scope in SCOPES:
            for i in range(n):
                text = f"{step} {scope['user_id']} {i}"
                self.texts[text] = step
                pending = producer.remember(
                    scope, text, operation_id=f"{step}-{scope['user_id']}-{i}"
                )
                receipt = pending.wait(60)
                ids.append(receipt.records[0].id)
        return ids

    def restore(self, *args: str, home: Path | None = None) -> dict[str, Any]:
        ran = self.cli("restore", "--from", str(self.backups), *args, "--json", home=home)
        assert ran.returncode == 0, ran.stderr
        report: dict[str, Any] = json.loads(ran.stdout)
        assert report["archiving"] == "on", report
        return report

    def check(self, home: Path, expected_steps: set[str], timeline: int) -> None:
        """The home as the operator checks it after a restore."""
        # No forgotten text in any file of the home (set-aside databases removed).
        needles = [n for t in self.forgotten for n in (t.encode(), t.lower().encode())]
        assert file_hits(home, needles) == []
        server = EmbeddedPostgres(home, backup_dir=self.backups)
        try:
            ran = self.cli("forgets", "check", "--json", home=home, database_url=server.dsn())
            checked = json.loads(ran.stdout)
            assert ran.returncode == 0 and checked["ok"], checked
            assert checked["unknown_to_store"] == 0
            assert checked["tombstones"] == len(self.forgotten)
            with Store.connect(server.dsn(), migrate=False, max_connections=2) as store:
                found = {r.text for s in SCOPES for r in store.records(s)}
                assert not any(t in found for t in self.forgotten)
                want = {t for t, step in self.texts.items() if step in expected_steps}
                assert found == want, (sorted(found - want), sorted(want - found))
            with psycopg.connect(server.dsn(), autocommit=True) as conn:
                status = backups.archive_status(conn)
                row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
            assert status is not None and not status.failing, status
            assert row is not None and int(str(row[0])[:8], 16) == timeline
        finally:
            server.stop()
        for tli in range(2, timeline + 1):  # every timeline's history, for the next restore
            assert (self.backups / "wal" / f"{tli:08X}.history").is_file(), tli
        assert not list((self.backups / "wal").glob("*.tmp"))


def _clock(store: Store) -> datetime:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _archive_now(store: Store, backup_dir: Path) -> None:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone()
    assert row is not None
    segment = backup_dir / "wal" / str(row[0])
    wait_until(segment.exists, timeout=60, what=f"{segment.name} archived")


def test_the_restore_drill_keeps_every_forget_and_restores_past_a_restore(
    top: Path,
    start_up: Callable[..., Up],  # noqa: F811
) -> None:
    drill = Drill(top, start_up)
    up, producer, store = drill.up()
    try:
        drill.write(producer, "before", 2)
        secrets = [f"Carol therapist note {marker_text(40 + i)} keep private" for i in range(3)]
        doomed = []
        for i, (scope, text) in enumerate(zip(SCOPES, secrets, strict=True)):
            doomed.append(producer.remember(scope, text, operation_id=f"doomed-{i}").wait(60))
        ran = drill.cli("backup", "--json")
        assert ran.returncode == 0, ran.stderr
        older = json.loads(ran.stdout)["label"]
        drill.write(producer, "w1")
        t1 = _clock(store)  # after w1, before the forgets
        for i, (scope, receipt) in enumerate(zip(SCOPES, doomed, strict=True)):
            producer.forget(scope, receipt.records[0].id, operation_id=f"forget-{i}").wait(60)
        drill.forgotten = secrets
        for i, scope in enumerate(SCOPES):
            wait_until(
                lambda i=i, scope=scope: _redacted(store, f"forget-{i}", scope),
                timeout=120,
                what="the forgets redacted (and in the ledger)",
            )
        drill.write(producer, "w2")
        assert drill.cli("backup").returncode == 0
        drill.write(producer, "w3")
        _archive_now(store, drill.backups)
    finally:
        producer.close()
        store.close()
        assert up.stop() == 0
    # The ledger's forgets went beside the backups as they were appended.
    mirrored = [p.read_text() for p in (drill.backups / "ledger").glob("forgets-*.jsonl")]
    assert sum(text.count("\n") for text in mirrored) == 3

    everything = {"before", "w1", "w2", "w3"}
    restored_at = datetime.now(UTC)
    report = drill.restore("--to", "latest", "--discard-previous")
    assert report["timeline"] == 2
    # Timeline 2 begins at its restore (not at its parent's records it starts with).
    began = timelines.began(drill.backups / "wal", timelines.lineage(drill.backups / "wal", 2))
    assert began is not None and began >= restored_at
    drill.check(drill.home, everything, 2)

    report = drill.restore("--to", t1.isoformat(), "--discard-previous")
    assert (report["backup"], report["timeline"]) == (older, 3)
    drill.check(drill.home, {"before", "w1"}, 3)

    older_path = str(drill.backups / "base" / older)
    ran = drill.cli("restore", "--from", older_path, "--discard-previous", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["timeline"] == 4
    drill.check(drill.home, {"before"}, 4)

    # A machine lost with its disk: a home on another path, no ledger of its own.
    fresh = top / "fresh"
    report = drill.restore("--to", "latest", home=fresh)
    assert report["timeline"] == 5 and report["forgets_replayed"] == 0
    drill.check(fresh, {"before"}, 5)

    # Served on the new timeline, then restored to a time on it: recovery from the
    # older backup follows timelines 1, 4 and 5.
    up, producer, store = drill.up(fresh)
    try:
        drill.write(producer, "w4")
        t2 = _clock(store)
        drill.write(producer, "w5")
        _archive_now(store, drill.backups)
    finally:
        producer.close()
        store.close()
        assert up.stop() == 0
    report = drill.restore("--to", t2.isoformat(), "--discard-previous", home=fresh)
    assert (report["backup"], report["timeline"]) == (older, 6)
    drill.check(fresh, {"before", "w4"}, 6)


def _redacted(store: Store, operation_id: str, scope: dict[str, str]) -> bool:
    receipt = store.receipt(operation_id, scope)
    return receipt is not None and receipt.redaction == "complete"
