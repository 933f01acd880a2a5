"""The database a one-off command (migrate, demo, the reads, export) works on.

``DATABASE_URL`` when set; else the one the ``engram up`` running on
``ENGRAM_HOME`` publishes (it is left running); else the home's embedded
PostgreSQL, started for the command under the home lock and stopped after it,
whatever happens (a watchdog stops it if the command is killed).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import psycopg_pool
import redis

from engram.store import Store
from engram.store.errors import ConfigError
from engram.store.ledger import ForgetLedger
from engram.store.server import EmbeddedPostgres
from engram.store.server import data_dir as postgres_dir
from engram.worker.embedded.runtime import configured_or_published, connect_redis, redis_url
from engram.worker.settings import Settings

from .home import HomeInUseError, HomeSession
from .procs import ProcessRecord

log = logging.getLogger(__name__)

# How long a command waits for an ``up`` that is starting to publish its database.
_WAIT_S = 60.0


@contextmanager
def command_database(settings: Settings, command: str, *, create: bool = False) -> Iterator[str]:
    """Yield the URL of the database ``command`` works on: the configured one, the running
    ``up``'s, or the home's embedded server, started for the command and stopped after
    it. With ``create``, a home with no database yet gets one; without, that is a
    ``ConfigError`` (reading needs something to read). (A long-running process finds
    its database with ``worker.runtime.database_url`` instead: it never starts one.)"""
    if settings.database_url:
        yield settings.database_url
        return
    if not create and not (postgres_dir(settings.home) / "PG_VERSION").exists():
        raise ConfigError(
            f"no database in ENGRAM_HOME {Path(settings.home).resolve()}: "
            "set DATABASE_URL, or start `engram up`"
        )
    deadline = time.monotonic() + _WAIT_S
    while True:
        published = configured_or_published(settings, "database_url")
        if published:
            yield published
            return
        try:
            session = HomeSession(settings.home, command).open()
            break
        except HomeInUseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        server = EmbeddedPostgres(settings.home, backup_dir=settings.backup_dir)
        if server.pid:
            session.record(ProcessRecord.of("postgres", server.pid, stop_signal=signal.SIGINT))
        try:
            yield server.dsn()
        finally:
            server.stop()
    finally:
        session.close()


@contextmanager
def open_store(
    settings: Settings, command: str, *, connections: int = 2, ledger: ForgetLedger | None = None
) -> Iterator[Store]:
    """The store a one-off command reads or audits in (never migrated: ``up`` or
    ``engram migrate`` does that). ``ledger``: where what it revokes is appended."""
    with (
        command_database(settings, command) as dsn,
        Store.connect(
            dsn,
            migrate=False,
            max_connections=connections,
            read_dsn=settings.database_read_url,  # the reads that allow it, on a replica
            ledger=ledger,
        ) as store,
    ):
        yield store


def wait_for_store(
    dsn: str,
    pool_size: int,
    *,
    read_dsn: str | None = None,
    ledger: ForgetLedger | None = None,
) -> Store:
    """The store of a long-running process (a worker, the jobs), once PostgreSQL answers:
    it may start before the database, or during an outage (retried with back-off).
    ``read_dsn`` (DATABASE_READ_URL): its replica, which need not answer yet. ``ledger``:
    where its forgets are appended (the jobs' redaction, store.ledger)."""
    delay = 1.0
    while True:
        try:
            return Store.connect(
                dsn, migrate=False, max_connections=pool_size, read_dsn=read_dsn, ledger=ledger
            )
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            log.warning(
                "database unavailable, will retry",
                extra={"error": type(exc).__name__, "retry_in_s": delay},
            )
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


@contextmanager
def open_redis(settings: Settings) -> Iterator[redis.Redis]:
    """The Redis a one-off command works on (``REDIS_URL``, else the running ``up``'s)."""
    client = connect_redis(redis_url(settings))
    try:
        yield client
    finally:
        client.close()
