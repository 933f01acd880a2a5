"""``engram restore``: the home's PostgreSQL back to a base backup or a point in time,
then every forget of the ledger re-applied, before anything serves it.

First what can be checked is: the base backup, and the WAL archive it replays
(the one the operator names, the backup folder's ``wal``, or the one the backup's
own ``backup.json`` names: owned by the server's user, writable by no one else,
``store.backup.check_archive``), the target time against that archive
(``store.backup.check_target``) and the sockets' path: a restore refused for any
of them changes nothing. Then, under the home lock (refused while
``engram up`` holds it), in this order, each step safe to run again:

1. ``ENGRAM_HOME/restore.json`` is written (flushed): from here to the last step
   the home's server does not start (``store.server``), so nothing serves.
2. The current database folder is moved aside (``postgres.before-restore-<time>``;
   on a re-run, the half-made copy of the run before is removed instead) and the
   base backup copied in, with ``recovery.signal``.
3. The server is started by us, on a socket of its own (``ENGRAM_HOME/restore-run``),
   with the recovery settings on its command line only: it replays the archive up
   to the target and promotes. Interrupted before that, the folder cannot be
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

from engram.store import Store, audit
from engram.store import backup as backups
from engram.store.errors import ConfigError
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


@dataclass(frozen=True, slots=True)
class RestoreReport:
    backup: str
    archive: str
    target: str
    replayed: int
    tokens_revoked: int
    lines_refused: int
    set_aside: str | None
    seconds: float
    replay_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "backup": self.backup,
            "archive": self.archive,
            "target": self.target,
            "forgets_replayed": self.replayed,
            "tokens_revoked_again": self.tokens_revoked,
            "ledger_lines_refused": self.lines_refused,
            "previous_database": self.set_aside,
            "seconds": self.seconds,
            "replay_seconds": self.replay_seconds,
        }


def run_restore(
    settings: Settings, source: Path, to: str | None, archive: Path | None = None
) -> RestoreReport:
    if settings.database_url:
        raise ConfigError(
            "engram restore restores the embedded home's PostgreSQL; DATABASE_URL is set:"
            " restore your own server with your tools, then run `engram forgets replay`"
        )
    target = backups.parse_time(to) if to else None
    backups.ensure_server_user()  # as root, the user the archive must belong to
    info = backups.choose(source, target if isinstance(target, datetime) else None)
    wal = backups.check_archive(backups.archive_of(source, info, archive))
    home = Path(settings.home)
    _preflight(home, wal, info, target)
    t0 = time.monotonic()
    session = HomeSession(home, COMMAND).open()
    try:
        # As `up` leaves it: as root, the server's user passes through the home (0710,
        # its group) to the database folder; a fresh home is made 0700, which it cannot.
        share_with_server(home)
        aside = _set_aside(home, info, target, _finish_command(source, to, archive))
        backups.place(info, postgres_dir(home))
        with _recovering(session, home, backups.recovery_settings(wal, target)) as dsn:
            _mark(dsn, info, target)
            r0 = time.monotonic()
            with Store.connect(dsn, restoring=True, max_connections=2) as store:
                result = replay(store, ForgetLedger(settings.ledger_dir))
                # What committed before this row and is not in the database was lost to
                # the restore: a reply valkey still caches for it is not believed
                # (web.views.receipts).
                store.audit.record(
                    f"cli:{getpass.getuser()}"[:200],
                    "database.restore",
                    audit.DATABASE,
                    {"backup": info.label, "target": _target_text(target)},
                )
            replay_s = time.monotonic() - r0
            if result.failed:  # named in the log, one by one; the rest was applied
                log.warning("ledger lines the restore skipped", extra={"lines": result.failed})
            _scrub(dsn, result.in_ledger > 0)
            _unmark(dsn)
        (home / backups.RESTORE_STATE).unlink()
        fsync_dir(home)
    finally:
        session.close()
    return RestoreReport(
        backup=info.label,
        archive=str(wal),
        target=_target_text(target),
        replayed=result.reapplied,
        tokens_revoked=result.tokens_revoked,
        lines_refused=result.failed,
        set_aside=str(aside) if aside else None,
        seconds=round(time.monotonic() - t0, 3),
        replay_seconds=round(replay_s, 3),
    )


def _preflight(
    home: Path, wal: Path, info: backups.BackupInfo, target: datetime | str | None
) -> None:
    """What can be checked before anything moves, so that a refused restore changes
    nothing: the target time against the archive, the sockets' path (the archive and
    the server's user were, before)."""
    backups.check_target(wal, info, target)
    check_socket_path(home.resolve() / SOCKET_DIR / ".s.PGSQL.5432", "PostgreSQL")


def _finish_command(source: Path, to: str | None, archive: Path | None) -> str:
    """The command that runs this restore again (to finish it, if it is interrupted)."""
    argv = ["engram", "restore", "--from", str(Path(source).resolve())]
    if to:
        argv += ["--to", to]
    if archive is not None:
        argv += ["--archive", str(Path(archive).resolve())]
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


def _scrub(dsn: str, forgets: bool) -> None:
    """With any forget in the ledger: the tables rewritten without the freed space that
    may still hold a forgotten text (the replay's, or a forget the recovery replayed
    from the archive: either leaves the bytes in the pages until overwritten). Then
    the WAL that held them removed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if forgets:
            conn.execute("VACUUM FULL")
        for _ in range(2):
            conn.execute("CHECKPOINT")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")


def _unmark(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {backups.RESTORE_PENDING_TABLE}")
        conn.execute("CHECKPOINT")
