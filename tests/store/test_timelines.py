"""``store.timelines``: which timeline and which base backup a restore recovers along,
read from an archive's history files and the backups' labels (no server needed
for the backup itself and --to latest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram.store.backup import BackupInfo, followed
from engram.store.errors import InvalidRequestError
from engram.store.timelines import lineage, plan

SEGMENT = 16 * 1024 * 1024


def _backup(tmp_path: Path, label: str, timeline: int, segment: int) -> BackupInfo:
    folder = tmp_path / "base" / label
    folder.mkdir(parents=True)
    name = f"{timeline:08X}{0:08X}{segment:08X}"
    (folder / "backup_label").write_text(
        f"START WAL LOCATION: 0/{segment * SEGMENT + 0x28:X} (file {name})\n"
        f"CHECKPOINT LOCATION: 0/{segment * SEGMENT + 0x60:X}\n"
        f"START TIMELINE: {timeline}\n"
    )
    at = f"2026-12-07T10:0{segment}:00+00:00"
    return BackupInfo(label, str(folder), at, at, name, 1, 0.1, str(tmp_path / "wal"))


def _history(wal: Path, timeline: int, *lines: tuple[int, int]) -> None:
    text = "".join(f"{tli}\t0/{seg * SEGMENT:X}\tno recovery target\n" for tli, seg in lines)
    (wal / f"{timeline:08X}.history").write_text(text)


@pytest.fixture
def wal(tmp_path: Path) -> Path:
    folder = tmp_path / "wal"
    folder.mkdir()
    return folder


def test_latest_follows_the_newest_timeline_from_a_backup_taken_before_it_branched(
    tmp_path: Path, wal: Path
) -> None:
    older = _backup(tmp_path, "a", 1, 2)
    newer = _backup(tmp_path, "b", 1, 6)  # on timeline 1, after timeline 2 left it
    _history(wal, 2, (1, 4))  # a restore to a time between the two backups

    chosen = plan([older, newer], wal, "latest")

    assert (chosen.backup.label, chosen.timeline) == ("a", "2")
    # The backup itself: its own timeline, whatever came since.
    assert plan([older, newer], wal, None) == type(chosen)(newer, "current")


def test_a_lineage_reaches_its_ancestors_up_to_where_it_left_them(wal: Path) -> None:
    _history(wal, 3, (1, 4), (2, 9))
    line = lineage(wal, 3)
    assert line.reaches(1, 3 * SEGMENT) and not line.reaches(1, 5 * SEGMENT)
    assert line.reaches(2, 8 * SEGMENT) and not line.reaches(2, 9 * SEGMENT)
    assert line.reaches(3, 99 * SEGMENT) and line.switch_lsn == 9 * SEGMENT
    assert lineage(wal, 1).switch_lsn is None


def test_no_backup_recovery_can_follow_the_timeline_from_is_refused(
    tmp_path: Path, wal: Path
) -> None:
    newer = _backup(tmp_path, "b", 1, 6)
    _history(wal, 2, (1, 4))
    with pytest.raises(InvalidRequestError, match="no base backup from which recovery"):
        plan([newer], wal, "latest")


def test_a_target_time_is_checked_only_against_the_segments_recovery_reads(wal: Path) -> None:
    # Timeline 3 left timeline 1 at segment 4 (a restore to a time), while timeline 2
    # had branched from 1 at segment 6 and ran on to segment 9: recovery along 3 reads
    # 1's segments before 4 and its own, never 2's, nor 1's past where 3 left it.
    _history(wal, 3, (1, 4))
    path = lineage(wal, 3).path
    assert followed(f"{1:08X}{0:08X}{3:08X}", path)
    assert followed(f"{3:08X}{0:08X}{4:08X}", path)
    assert followed(f"{3:08X}{0:08X}{12:08X}", path)
    assert not followed(f"{1:08X}{0:08X}{5:08X}", path)
    assert not followed(f"{2:08X}{0:08X}{8:08X}", path)
    # A segment past 0xFF of a log file: the log number counts 256 segments.
    assert followed(f"{3:08X}{1:08X}{2:08X}", path)
    assert not followed(f"{1:08X}{1:08X}{0:08X}", path)
    assert followed(f"{2:08X}{0:08X}{8:08X}", None)
