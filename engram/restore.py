"""``engram restore``: the home's PostgreSQL back to a base backup or a point in time,
then every forget of the ledger re-applied, before anything serves it.

First what can be checked is: the base backup and the timeline it recovers along
(``store.timelines.plan``), the WAL archive it replays (the one the operator
names, the backup folder's ``wal``, or the one the backup's own ``backup.json``
names: owned by the server's user, writable by no one else,
``store.backup.check_archive``), the target time against that archive
(``store.backup.check_target``), the sockets' path, and a forget ledger covering
the backup (the home's, or the copy beside the backups; else
``LedgerMissingError`` unless ``--without-ledger``): a restore refused for any of
them changes nothing. Then, under the home lock (refused while
``engram up`` holds it), in this order, each step safe to run again:

1. ``ENGRAM_HOME/restore.json`` is written (flushed): from here to the last step
   the home's server does not start (``store.server``), so nothing serves.
2. The current database folder is moved aside (``postgres.before-restore-<time>``;
   on a re-run, the half-made copy of the run before is removed instead), the
   backups' copy of the ledger merged into the home's, and the base backup copied
   in, with ``recovery.signal``.
3. The server is started by us, on a socket of its own (``ENGRAM_HOME/restore-run``),
   with the recovery settings on its command line only: it replays the archive up
   to the target and promotes onto a new timeline, archiving into
   ``ENGRAM_BACKUP_DIR`` from there on (its history file first, waited for: the
   next restore's timeline is numbered after it). Interrupted before that, the folder cannot be
   started by anything else (PostgreSQL refuses ``recovery.signal`` without a
   ``restore_command``).
4. The marker table (``engram_restore_pending``) is created: from here the database
   itself refuses every store but the restore's (``Store.connect``), wherever it
   is started.
5. The ledger is replayed (``store.ledger_replay.replay``): each forget the restored
   database does not know is applied, and each token revoked since is revoked again
   (a line the store would refuse is named in the log and skipped). When the
   ledger lists any forget, the freed space that may still hold a forgotten text
   is rewritten out of the tables' files (``VACUUM FULL``: nothing else runs),
   and the WAL that held it removed (segments switched and checkpointed, not
   recycled).
6. The marker is dropped, the server stopped, ``restore.json`` removed.

A restore killed anywhere is finished by running it again: it starts over from
the base backup, and the ledger's replay is idempotent.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from engram.store import Store, audit, timelines
from engram.store import backup as backups
from engram.store.errors import ConfigError, LedgerMissingError
from engram.store.files import fsync_dir
from engram.store.home import check_socket_path, share_with_server
from engram.store.ledger import ForgetLedger
from engram.store.ledger_replay import replay
from engram.store.server import data_dir as postgres_dir
from engram.worker.settings import Settings

from .home import HomeSession
from .procs import ProcessRecord, die_with_parent

log = logging.getLogger(__name__)

COMMAND = "engram restore"
SOCKET_DIR = "restore-run"
LOG_FILE = "restore.log"
_READY_S = 600.0  # recovery replays the archive: up to this long
_ARCHIVED_S = 120.0  # a segment the restored server archives: up to this long


@dataclass(frozen=True, slots=True)
class RestoreReport:
    backup: str
    archive: str
    target: str
    timeline: int
    ledger: str
    replayed: int
    tokens_revoked: int
    lines_refused: int
    set_aside: str | None
    archiving: str
    seconds: float
    replay_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "backup": self.backup,
            "archive": self.archive,
            "target": self.target,
            "timeline": self.timeline,
            "ledger": self.ledger,
            "forgets_replayed": self.replayed,
            "tokens_revoked_again": self.tokens_revoked,
            "ledger_lines_refused": self.lines_refused,
            "previous_database": self.set_aside,
            "archiving": self.archiving,
            "seconds": self.seconds,
            "replay_seconds": self.replay_seconds,
        }


@dataclass(frozen=True, slots=True)
class _Ledgers:
    """The forget ledgers of a restore: the home's, which it replays (the copy beside the
    backups merged into it first), and that copy. ``covered``: one of them covers the
    backup (False only with ``--without-ledger``)."""

    home: ForgetLedger
    copy: ForgetLedger | None
    covered: bool


def run_restore(
    settings: Settings,
    source: Path,
    to: str | None,
    archive: Path | None = None,
    *,
    without_ledger: bool = False,
) -> RestoreReport:
    if settings.database_url:
        raise ConfigError(
            "engram restore restores the embedded home's PostgreSQL; DATABASE_URL is set:"
            " restore your own server with your tools, then run `engram forgets replay`"
        )
    target = backups.parse_time(to) if to else None
    backups.ensure_server_user()  # as root, the user the archive must belong to
    found = backups.candidates(source, target if isinstance(target, datetime) else None)
    wal = backups.check_archive(backups.archive_of(source, found[-1], archive))
    chosen = timelines.plan(found, wal, target)
    info = chosen.backup
    home = Path(settings.home)
    _preflight(home, wal, info, target, chosen)
    ledgers = _ledgers(settings, source, info, without_ledger)
    archive_into = backups.prepare_dir(settings.backup_dir) if settings.backup_dir else None
    t0 = time.monotonic()
    session = HomeSession(home, COMMAND).open()
    try:
        # As `up` leaves it: as root, the server's user passes through the home (0710,
        # its group) to the database folder; a fresh home is made 0700, which it cannot.
        share_with_server(home)
        finish = _finish_command(source, to, archive, without_ledger)
        aside = _set_aside(home, info, target, finish)
        if ledgers.copy is not None:  # the backups' lines the home's ledger lacks
            ledgers.copy.mirror_into(ledgers.home.directory)
        backups.place(info, postgres_dir(home))
        recovery = backups.recovery_settings(wal, target, chosen.timeline, archive_into)
        with _recovering(session, home, recovery) as dsn:
            timeline = _timeline(dsn)
            _mark(dsn, info, target)
            archiving = _archive_history(dsn, home, archive_into, wal, timeline)
            r0 = time.monotonic()
            with Store.connect(dsn, restoring=True, max_connections=2) as store:
                result = replay(store, ledgers.home)
                # What committed before this row and is not in the database was lost to
                # the restore: a reply valkey still caches for it is not believed
                # (web.views.receipts).
                store.audit.record(
                    f"cli:{getpass.getuser()}"[:200],
                    "database.restore",
                    audit.DATABASE,
                    {
                        "backup": info.label,
                        "target": _target_text(target),
                        "timeline": timeline,
                        "ledger": _ledger_text(ledgers),
                    },
                )
            replay_s = time.monotonic() - r0
            if result.failed:  # named in the log, one by one; the rest was applied
                log.warning("ledger lines the restore skipped", extra={"lines": result.failed})
            archiving = _scrub(dsn, result.in_ledger > 0, archive_into) or archiving
            _unmark(dsn)
        (home / backups.RESTORE_STATE).unlink()
        fsync_dir(home)
    finally:
        session.close()
    return RestoreReport(
        backup=info.label,
        archive=str(wal),
        target=_target_text(target),
        timeline=timeline,
        ledger=_ledger_text(ledgers),
        replayed=result.reapplied,
        tokens_revoked=result.tokens_revoked,
        lines_refused=result.failed,
        set_aside=str(aside) if aside else None,
        archiving=archiving or ("on" if archive_into else "off: ENGRAM_BACKUP_DIR is not set"),
        seconds=round(time.monotonic() - t0, 3),
        replay_seconds=round(replay_s, 3),
    )


def _preflight(
    home: Path,
    wal: Path,
    info: backups.BackupInfo,
    target: datetime | str | None,
    chosen: timelines.Plan,
) -> None:
    """What can be checked before anything moves, so that a refused restore changes
    nothing: the target time against the archive along the timeline chosen, the
    sockets' path (the archive and the server's user were, before)."""
    path = timelines.lineage(wal, int(chosen.timeline)).path if chosen.timeline.isdigit() else None
    backups.check_target(wal, info, target, path)
    check_socket_path(home.resolve() / SOCKET_DIR / ".s.PGSQL.5432", "PostgreSQL")


def _ledgers(
    settings: Settings, source: Path, info: backups.BackupInfo, without_ledger: bool
) -> _Ledgers:
    """The ledgers a restore of ``info`` reads: the home's, and the copy beside the
    backups (merged into the home's: a fresh home on a new machine has none of its
    own). One of them must cover the backup (hold what the ledger held when it was
    taken; a backup that recorded nothing: exist), or ``LedgerMissingError``, before
    anything moves, unless ``without_ledger``."""
    home = ForgetLedger(settings.ledger_dir)
    where = backups.ledger_of(source, info)
    copy = None
    if where is not None and where.exists():
        copy = ForgetLedger(backups.check_ledger_copy(where))
    found = [ledger for ledger in (home, copy) if ledger is not None]
    if info.ledger is None:
        covered = any(ledger.directory.is_dir() for ledger in found)
    else:
        covered = any(ledger.covers(info.ledger) for ledger in found)
    if not covered and not without_ledger:
        looked = ", ".join(str(ledger.directory) for ledger in found) or str(home.directory)
        raise LedgerMissingError(
            f"no forget ledger covers base backup {info.label} (looked in {looked}"
            + ("" if where is None or copy is not None else f" and {where}, missing")
            + "): restored without it, the database would bring back every record forgotten"
            " since the backup. Nothing was changed. Point ENGRAM_FORGET_LEDGER_DIR at the"
            " ledger, or copy the backup folder's ledger with it; to restore anyway, give"
            " --without-ledger"
        )
    return _Ledgers(home, copy, covered)


WITHOUT_LEDGER = (
    "none covering the backup (--without-ledger): a record forgotten since the backup may be back"
)


def _ledger_text(ledgers: _Ledgers) -> str:
    return str(ledgers.home.directory) if ledgers.covered else WITHOUT_LEDGER


def _finish_command(
    source: Path, to: str | None, archive: Path | None, without_ledger: bool = False
) -> str:
    """The command that runs this restore again (to finish it, if it is interrupted)."""
    argv = ["engram", "restore", "--from", str(Path(source).resolve())]
    if to:
        argv += ["--to", to]
    if archive is not None:
        argv += ["--archive", str(Path(archive).resolve())]
    if without_ledger:
        argv.append("--without-ledger")
    return shlex.join(argv)


def _target_text(target: datetime | str | None) -> str:
    if target is None:
        return "the backup"
    return target if isinstance(target, str) else target.isoformat()


def _set_aside(
    home: Path, info: backups.BackupInfo, target: datetime | str | None, finish: str
) -> Path | None:
    """Write the state file first (``finish``: the command that finishes this restore),
    then move the database there aside (a first run) or remove the half-made copy a run
    before this one left. Returns the folder set aside."""
    state_file = home / backups.RESTORE_STATE
    data = postgres_dir(home)
    state: dict[str, Any] = {}
    if state_file.exists():
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(state_file.read_text())
    aside = state.get("set_aside")
    if not aside:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = str(home.resolve() / f"{backups.SET_ASIDE_PREFIX}{stamp}") if data.exists() else ""
    state.update(
        {
            "finish": finish,
            "backup": info.path,
            "target": _target_text(target),
            "set_aside": aside,
            "started_at": state.get("started_at") or datetime.now(UTC).isoformat(),
        }
    )
    _write_durably(state_file, json.dumps(state))
    if data.exists():
        if aside and not Path(aside).exists():
            data.rename(aside)  # the database that was there: the operator's
        else:
            shutil.rmtree(data)  # a run before this one's half-made copy
    shutil.rmtree(home / SOCKET_DIR, ignore_errors=True)
    return Path(aside) if aside else None


def _write_durably(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
    fsync_dir(path.parent)


@contextmanager
def _recovering(session: HomeSession, home: Path, recovery: dict[str, str]) -> Iterator[str]:
    """The restored server, started by us on a socket only we know, until it has
    promoted; stopped (fast shutdown) when done. Yields its DSN."""
    data = postgres_dir(home)
    sockets = home.resolve() / SOCKET_DIR
    check_socket_path(sockets / ".s.PGSQL.5432", "PostgreSQL")
    sockets.mkdir(mode=0o700, exist_ok=True)
    backups.give_to_server(sockets)
    settings = {
        **recovery,
        # The WAL of the replay's deletes holds the forgotten text's pages: removed at
        # the checkpoints after, never recycled under a new name with it inside.
        "wal_recycle": "off",
        "wal_init_zero": "on",
        "log_min_messages": "warning",
    }
    with open(home / LOG_FILE, "ab") as log_file:
        proc = subprocess.Popen(
            [
                str(backups.pg_bin("postgres")),
                *("-D", str(data), "-k", str(sockets), "-h", ""),
                *(a for k, v in settings.items() for a in ("-c", f"{k}={v}")),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            user=backups.server_user(),
            preexec_fn=die_with_parent(),
        )
    session.record(ProcessRecord.of("postgres", proc.pid, stop_signal=signal.SIGINT))
    dsn = f"postgresql://postgres@/postgres?host={sockets}"
    try:
        _wait_promoted(proc, dsn, home / LOG_FILE)
        yield dsn
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_promoted(proc: subprocess.Popen[bytes], dsn: str, log_path: Path) -> None:
    deadline = time.monotonic() + _READY_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
                if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,):
                    return
        except psycopg.OperationalError:
            pass
        time.sleep(0.2)
    tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
    raise ConfigError(f"the restored PostgreSQL did not finish its recovery ({log_path}):\n{tail}")


def _mark(dsn: str, info: backups.BackupInfo, target: datetime | str | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {backups.RESTORE_PENDING_TABLE}"
            " (source text NOT NULL, target text NOT NULL, started_at timestamptz NOT NULL)"
        )
        conn.execute(f"TRUNCATE {backups.RESTORE_PENDING_TABLE}")
        conn.execute(
            f"INSERT INTO {backups.RESTORE_PENDING_TABLE} VALUES (%s, %s, now())",
            (info.label, _target_text(target)),
        )
        conn.execute("CHECKPOINT")


def _timeline(dsn: str) -> int:
    """The timeline the promoted server writes on."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
    assert row is not None
    return int(str(row[0])[:8], 16)


def _archive_history(
    dsn: str, home: Path, archive_into: Path | None, wal: Path, timeline: int
) -> str | None:
    """The new timeline's history file in the archive, which the next restore reads to
    choose a timeline of its own (else it would take this one's number again, and its
    segments' names). Archived by the server when it archives (waited for); else
    copied into the archive replayed, as ``archive_command`` would. Returns what went
    wrong, if anything (the restore goes on: the database is restored)."""
    name = f"{timeline:08X}.history"
    if archive_into is not None:
        return _wait_archived(dsn, archive_into / backups.WAL / name)
    history = postgres_dir(home) / "pg_wal" / name
    target = wal / name
    if target.exists():
        same = target.read_bytes() == history.read_bytes()
        return None if same else f"{target} exists with other bytes: not replaced"
    tmp = target.with_name(name + ".tmp")
    shutil.copyfile(history, tmp)
    backups.give_to_server(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.link(tmp, target)
    tmp.unlink()
    fsync_dir(wal)
    return None


def _wait_archived(dsn: str, path: Path) -> str | None:
    """Wait until the server has archived ``path``; what went wrong, if it does not (its
    archiving fails, or is not done within ``_ARCHIVED_S``)."""
    deadline = time.monotonic() + _ARCHIVED_S
    while not path.exists():
        with psycopg.connect(dsn, autocommit=True) as conn:
            status = backups.archive_status(conn)
        if status is not None and status.failing:
            return f"WAL archiving fails ({status.last_failed_wal}): see engram health"
        if time.monotonic() > deadline:
            return f"{path.name} not archived within {_ARCHIVED_S:.0f} s"
        time.sleep(0.2)
    return None


def _scrub(dsn: str, forgets: bool, archive_into: Path | None) -> str | None:
    """With any forget in the ledger: the tables rewritten without the freed space that
    may still hold a forgotten text (the replay's, or a forget the recovery replayed
    from the archive: either leaves the bytes in the pages until overwritten). Then
    the WAL that held them removed from the database folder (archived first, when the
    server archives: a checkpoint removes only an archived segment). Returns what went
    wrong with the archiving, if anything."""
    problem = None
    with psycopg.connect(dsn, autocommit=True) as conn:
        if forgets:
            conn.execute("VACUUM FULL")
        for _ in range(2):
            conn.execute("CHECKPOINT")
            row = conn.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone()
            if archive_into is not None and row is not None and problem is None:
                problem = _wait_archived(dsn, archive_into / backups.WAL / str(row[0]))
        conn.execute("CHECKPOINT")
    return problem


def _unmark(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {backups.RESTORE_PENDING_TABLE}")
        conn.execute("CHECKPOINT")
