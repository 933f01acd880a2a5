"""The embedded valkey-server: loopback, append-only file, data kept across restarts."""

from __future__ import annotations

import gc
import socket
import subprocess
from pathlib import Path

import redis

from worker.valkey import EmbeddedValkey, cli_path


def test_it_keeps_queued_entries_across_a_restart(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path).start()
    try:
        client = redis.Redis(port=server.port, decode_responses=True)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "always"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert (tmp_path / "valkey").is_dir()
        client.xadd("engram:ops:{0}", {"op": "{}"})
        client.close()
        port = server.port
        server.kill()  # as a crash: only the append-only file survives
        server = EmbeddedValkey(tmp_path, port=port).start()
        client = redis.Redis(port=server.port)
        assert client.xlen("engram:ops:{0}") == 1
        client.close()
    finally:
        server.stop()
    assert server.pid == 0


def test_a_server_left_running_on_its_folder_is_stopped_first(tmp_path: Path) -> None:
    orphan = EmbeddedValkey(tmp_path).start()  # its owner "died" without stopping it
    orphan_pid = orphan.pid
    client = redis.Redis(port=orphan.port)
    client.set("kept", "1")
    client.close()
    fresh = EmbeddedValkey(tmp_path).start()
    try:
        assert fresh.pid != orphan_pid
        import psutil

        assert not psutil.pid_exists(orphan_pid)
        client = redis.Redis(port=fresh.port)
        assert client.get("kept") == b"1"  # SIGTERM let it sync its file
        client.close()
    finally:
        fresh.stop()


def test_a_stopped_server_collected_late_leaves_the_next_one_of_its_folder_running(
    tmp_path: Path,
) -> None:
    """The library's server object of a stopped run may be collected any time later (a
    reference cycle defers it to the garbage collector); that must not stop the server
    started on the same folder since, nor delete its pid file."""
    first = EmbeddedValkey(tmp_path).start()
    stale = first._server  # as a reference cycle would keep it
    first.stop()
    second = EmbeddedValkey(tmp_path).start()
    try:
        pid = second.pid
        del stale
        gc.collect()
        assert (tmp_path / "valkey" / "valkey.pid").read_text().strip() == str(pid)
        client = redis.Redis(port=second.port, socket_timeout=5)
        assert client.ping()
        client.close()
    finally:
        second.stop()


def test_a_home_keeps_its_port_across_restarts_unless_someone_took_it(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path).start()
    port = server.port
    server.stop()
    server = EmbeddedValkey(tmp_path).start()
    try:
        assert server.port == port
        assert (tmp_path / "valkey" / "port").read_text().strip() == str(port)
    finally:
        server.stop()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        moved = EmbeddedValkey(tmp_path).start()
        new_port = moved.port
        try:
            assert new_port != port
            client = redis.Redis(port=moved.port)
            assert client.ping()
            client.close()
        finally:
            moved.stop()
    finally:
        squatter.close()
    again = EmbeddedValkey(tmp_path).start()  # the new port is the one kept now
    try:
        assert again.port == new_port
    finally:
        again.stop()


def test_the_bundled_valkey_cli_reaches_the_server(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path).start()
    try:
        out = subprocess.run(
            [cli_path(), "-u", server.url, "PING"], capture_output=True, text=True, timeout=10
        )
        assert (out.returncode, out.stdout) == (0, "PONG\n")
    finally:
        server.stop()
