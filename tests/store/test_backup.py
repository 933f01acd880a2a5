"""The WAL archive's command (run by a real shell) and retention on a backup folder's
files: never a segment overwritten, never half a backup listed, the WAL the oldest
kept backup needs kept. (The backups and restores themselves, on real servers:
tests/engram/test_backup_restore.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engram.store import backup as backups
from engram.store.errors import InvalidRequestError

SEGMENT = "000000010000000000000007"


def archive(folder: Path, source: Path, name: str) -> int:
    command = backups.archive_command(folder).replace("%p", str(source)).replace("%f", name)
    return subprocess.run(["sh", "-c", command], check=False).returncode


def test_a_segment_is_archived_once_and_never_overwritten(tmp_path: Path) -> None:
    folder = tmp_path / "backups with a space"
    (folder / "wal").mkdir(parents=True)
    first, other = tmp_path / "first", tmp_path / "other"
    first.write_bytes(b"A" * 1000)
    other.write_bytes(b"B" * 1000)

    assert archive(folder, first, SEGMENT) == 0
    assert (folder / "wal" / SEGMENT).read_bytes() == b"A" * 1000
    # The same bytes again (the server crashed after archiving it): success.
    assert archive(folder, first, SEGMENT) == 0
    # Other bytes under the same name: refused, the archived segment untouched.
    assert archive(folder, other, SEGMENT) != 0
    assert (folder / "wal" / SEGMENT).read_bytes() == b"A" * 1000
    assert sorted(p.name for p in (folder / "wal").iterdir()) == [SEGMENT]


def fake_backup(folder: Path, label: str, finished: datetime, start_wal: str) -> None:
    path = folder / "base" / label
    path.mkdir(parents=True)
    info = backups.BackupInfo(
        label, str(path), finished.isoformat(), finished.isoformat(), start_wal, 1, 0.1
    )
    (path / backups.INFO_FILE).write_text(json.dumps(info.as_dict()))


def segments(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "wal").iterdir())


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    now = datetime.now(UTC)
    for i, label in enumerate(("b1", "b2", "b3")):
        fake_backup(
            tmp_path, label, now - timedelta(days=10 - 4 * i), f"0000000100000000000000{i + 2:02X}"
        )
    (tmp_path / "base" / "b4.partial").mkdir()  # a backup under way: not listed
    killed = tmp_path / "base" / "b0.partial"  # what a killed backup left, days ago
    killed.mkdir()
    old = (now - timedelta(days=3)).timestamp()
    os.utime(killed, (old, old))
    (tmp_path / "wal").mkdir()
    for name in (
        "000000010000000000000001",
        "000000010000000000000002",
        "000000010000000000000003",
        "000000020000000000000004",
        "00000002.history",
    ):
        (tmp_path / "wal" / name).write_text("x")
    return tmp_path


def test_retention_by_count_keeps_the_newest_and_the_wal_they_need(folder: Path) -> None:
    assert [b.label for b in backups.list_backups(folder)] == ["b1", "b2", "b3"]
    assert backups.prune(folder, "2") == ["b1"]
    assert [b.label for b in backups.list_backups(folder)] == ["b2", "b3"]
    # b2 needs ...03 on: ...01 and ...02 go; the history file stays whatever its age.
    assert segments(folder) == [
        "000000010000000000000003",
        "00000002.history",
        "000000020000000000000004",
    ]
    assert (folder / "base" / "b4.partial").exists()  # under way: left alone
    assert not (folder / "base" / "b0.partial").exists()


def test_retention_by_age_keeps_those_younger_and_always_the_newest(folder: Path) -> None:
    assert backups.prune(folder, "3d") == ["b1", "b2"]  # ended 10 and 6 days ago
    assert [b.label for b in backups.list_backups(folder)] == ["b3"]
    assert backups.prune(folder, "1h") == []  # b3 ended 2 days ago: still the newest


@pytest.mark.parametrize("keep", ["0", "forever", "7w", "-1", ""])
def test_a_bad_retention_is_refused_and_nothing_is_removed(folder: Path, keep: str) -> None:
    with pytest.raises(InvalidRequestError, match="ENGRAM_BACKUP_KEEP"):
        backups.prune(folder, keep)
    assert len(backups.list_backups(folder)) == 3 and len(segments(folder)) == 5


def test_a_restore_target_is_a_time_or_latest() -> None:
    assert backups.parse_time("latest") == "latest"
    assert backups.parse_time("2026-12-04T21:30:00") == datetime(2026, 12, 4, 21, 30, tzinfo=UTC)
    with pytest.raises(InvalidRequestError, match="--to"):
        backups.parse_time("yesterday")
