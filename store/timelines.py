"""The timelines of a WAL archive, and which one (and which base backup) a restore
recovers along.

Each restore promotes its server onto a new timeline, whose ``<TLI>.history`` file
the restore archives (``engram.restore``): it lists the timelines it came from and
the position where it left each. PostgreSQL names a new timeline one past the
newest history file it finds in the archive, so with every history file archived
no two restores write segments of the same name.

Which timeline a restore follows (``recovery_target_timeline``):

- the backup itself (no ``--to``): the backup's own (``current``);
- ``--to latest``: the newest timeline in the archive, the one serving last;
- ``--to TIME``: the timeline that was serving at that time, the newest that had
  begun by then. A timeline begins when its restore promotes it; its first archived
  transaction (the restore's own marker, written at once) says when.

And the base backup: the newest (that ended before ``--to``) from which recovery can
follow that timeline: taken on it, or on a timeline it came from before it left it.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .backup import WAL_SEGMENT_BYTES, BackupInfo, pg_bin
from .errors import InvalidRequestError

SEGMENT_BYTES = WAL_SEGMENT_BYTES
_HISTORY = re.compile(r"^([0-9A-F]{8})\.history$")
_LINE = re.compile(r"^\s*(\d+)\s+([0-9A-F]+)/([0-9A-F]+)", re.IGNORECASE)
_START = re.compile(r"START WAL LOCATION: ([0-9A-F]+)/([0-9A-F]+)")
_TIMELINE = re.compile(r"START TIMELINE: (\d+)")
_ENDS = re.compile(r"desc: (?:COMMIT|ABORT) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC")
_NEVER = 2**64  # a timeline not left: it runs on past any position


@dataclass(frozen=True, slots=True)
class Lineage:
    """A timeline and where it came from: (timeline, the position it was left at),
    oldest first, itself last (never left)."""

    timeline: int
    path: tuple[tuple[int, int], ...]

    def reaches(self, timeline: int, lsn: int) -> bool:
        """Whether recovery from ``lsn`` on ``timeline`` can follow this lineage."""
        return any(tli == timeline and lsn < end for tli, end in self.path)

    @property
    def switch_lsn(self) -> int | None:
        """Where this timeline began (its parent's end); None for a first timeline."""
        return self.path[-2][1] if len(self.path) > 1 else None


def lsn(hi: str, lo: str) -> int:
    return (int(hi, 16) << 32) | int(lo, 16)


def lineage(archive: Path, timeline: int) -> Lineage:
    """``timeline``'s lineage, from its history file in ``archive`` (none: it is a
    first timeline, or its history was never archived)."""
    path: list[tuple[int, int]] = []
    history = Path(archive) / f"{timeline:08X}.history"
    if history.is_file():
        for line in history.read_text(errors="replace").splitlines():
            found = _LINE.match(line)
            if found:
                path.append((int(found.group(1)), lsn(found.group(2), found.group(3))))
    return Lineage(timeline, (*path, (timeline, _NEVER)))


def archived_timelines(archive: Path) -> list[int]:
    """The timelines whose history files ``archive`` holds, oldest first."""
    found = (_HISTORY.match(p.name) for p in Path(archive).iterdir())
    return sorted(int(m.group(1), 16) for m in found if m)


def backup_position(info: BackupInfo) -> tuple[int, int]:
    """(timeline, position) where base backup ``info`` begins, from its ``backup_label``."""
    text = (Path(info.path) / "backup_label").read_text()
    start, tli = _START.search(text), _TIMELINE.search(text)
    if start is None or tli is None:
        raise InvalidRequestError(f"base backup {info.label} has no readable backup_label")
    return int(tli.group(1)), lsn(start.group(1), start.group(2))


def began(archive: Path, line: Lineage) -> datetime | None:
    """When ``line``'s timeline began serving: its first archived transaction's end
    (None for a first timeline, or one whose first transaction is not archived)."""
    switch = line.switch_lsn
    if switch is None:
        return None
    segno = switch // SEGMENT_BYTES
    prefix = f"{line.timeline:08X}"
    # The timeline's first segment begins with its parent's records, up to the switch.
    start = ["--start", f"{switch >> 32:X}/{switch & 0xFFFFFFFF:X}"]
    while True:
        segment = Path(archive) / f"{prefix}{segno // 256:08X}{segno % 256:08X}"
        if not segment.is_file():
            return None
        ran = subprocess.run(
            [str(pg_bin("pg_waldump")), "--rmgr=Transaction", *start, str(segment)],
            capture_output=True,
            text=True,
            env={**os.environ, "TZ": "UTC"},
            check=False,
        )
        ends = _ENDS.findall(ran.stdout)
        if ends:
            return datetime.fromisoformat(ends[0]).replace(tzinfo=UTC)
        segno, start = segno + 1, []


@dataclass(frozen=True, slots=True)
class Plan:
    """What a restore recovers: the base backup, and the timeline it follows
    (``current``: the backup's own)."""

    backup: BackupInfo
    timeline: str


def plan(backups: list[BackupInfo], archive: Path, to: datetime | str | None) -> Plan:
    """The base backup among ``backups`` (oldest first, each ended before ``to`` when
    it is a time) and the timeline a restore to ``to`` follows along ``archive``."""
    if not backups:
        raise InvalidRequestError("no base backup to restore")
    if to is None:
        return Plan(backups[-1], "current")
    positions = {b.label: backup_position(b) for b in backups}
    known = set(archived_timelines(archive)) | {tli for tli, _ in positions.values()}
    lines = [lineage(archive, tli) for tli in sorted(known, reverse=True)]
    if isinstance(to, datetime):
        lines = [line for line in lines if _serving_by(archive, line, to)]
    if lines:  # the newest timeline (serving by then): that one, never an older branch
        for b in reversed(backups):
            if lines[0].reaches(*positions[b.label]):
                return Plan(b, str(lines[0].timeline))
    wanted = f"timeline {lines[0].timeline}" if lines else "the timeline serving then"
    raise InvalidRequestError(
        f"no base backup from which recovery can follow {wanted} of {archive} (each"
        " was taken on a timeline left before it began): restore one taken since, or"
        " name a backup with --from"
    )


def _serving_by(archive: Path, line: Lineage, when: datetime) -> bool:
    if line.switch_lsn is None:
        return True
    start = began(archive, line)
    return start is not None and start <= when
