"""``engram up`` with real processes: one per home, nothing outlives it, a crashed one's
leftovers cleaned by the next."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from engram.cleanup import clean_home
from engram.procs import live_process, wait_gone
from engram.store.home import server_gid
from engram.store.masking import mask_url
from engram.web.config import DEFAULT_PORT
from engram.worker import Producer
from tests.redis_fixtures import REPO, Squatter, unauthenticated_reply, wait_until

pytestmark = pytest.mark.slow


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    log_path: Path
    home: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> dict[str, object]:
        wait_until(
            lambda: "Ctrl-C stops everything" in self.log() or self.process.poll() is not None,
            timeout=90,
            what="engram up to start",
        )
        assert self.process.poll() is None, self.log()
        run: dict[str, object] = json.loads((self.home / "run.json").read_text())
        return run

    def stop(self, signum: int = signal.SIGINT, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Say which child held it up: up logs each step of its stop, and every engram
            # process prints its threads' stacks on SIGUSR1 (into up's log).
            for child in psutil.Process(self.process.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "engram" in " ".join(child.cmdline()):
                        child.send_signal(signal.SIGUSR1)
            with contextlib.suppress(psutil.Error):
                self.process.send_signal(signal.SIGUSR1)
            time.sleep(2)  # for the stacks to be written
            raise AssertionError(f"up did not stop within {timeout:g} s:\n{self.log()}") from None
        # Every child stopped when asked (a worker that hung in its signal handler was
        # killed 30 s later).
        assert "did not stop, killing it" not in self.log(), self.log()
        return code


def home_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        {
            "ENGRAM_HOME": str(home),
            "ENGRAM_EMBEDDER": "hashing:64",
            "ENGRAM_PARTITIONS": "4",
            "ENGRAM_LEASE_TTL_MS": "1000",
            "ENGRAM_DASHBOARD_PORT": str(free_port()),
            "PYTHONPATH": str(REPO),
        }
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def home() -> Iterator[Path]:
    """A home outside pytest's temporary folders: a concurrent pytest run makes those
    private to root again, and the embedded PostgreSQL runs as another user."""
    base = Path(tempfile.mkdtemp(prefix="engram-up-"))
    yield base / "home"
    if (base / "home").exists():
        clean_home(base / "home")  # the last resort, should the code under test fail to
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    """``engram up`` subprocesses; each is stopped at the end, and everything it started."""
    started: list[Up] = []

    def start(
        home: Path, *args: str, env: dict[str, str] | None = None, terminal: bool = False
    ) -> Up:
        """``terminal``: its output a terminal (a pseudo-terminal copied to its log), as
        in a shell; otherwise a file, as under a service manager."""
        log_path = tmp_path / f"up-{len(started)}.log"
        with open(log_path, "wb") as log:
            leader, follower = pty.openpty() if terminal else (None, None)
            process = subprocess.Popen(
                [sys.executable, "-m", "engram", "up", *args],
                env={**home_env(home), **(env or {})},
                stdout=log if follower is None else follower,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        if leader is not None and follower is not None:
            os.close(follower)
            threading.Thread(target=_copy, args=(leader, log_path), daemon=True).start()
        up = Up(process, log_path, home)
        started.append(up)
        return up

    yield start
    for up in started:
        if up.process.poll() is None:
            try:
                up.stop(timeout=60)
            except AssertionError:  # it did not stop in time: the test fails, and the
                up.process.kill()  # process is not left running into the next one
                up.process.wait()
                raise
    for up in started:  # what a killed one left is stopped by its watchdog
        wait_gone(_server_pids(up.home).values(), timeout_s=30)


def _copy(terminal: int, log_path: Path) -> None:
    """What a process writes to its terminal, appended to ``log_path`` until it closes."""
    with open(log_path, "ab", buffering=0) as log:
        while True:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # EIO: every writer closed it
                break
            if not chunk:
                break
            log.write(chunk)
    os.close(terminal)


def engram(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engram", *args],
        env=home_env(home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _server_pids(home: Path) -> dict[str, int]:
    pids = {}
    for name, path in (("postgres", "postgres/postmaster.pid"), ("valkey", "valkey/valkey.pid")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pids[name] = int((home / path).read_text().split()[0])
    return pids


def _everything_of(up: Up) -> dict[str, int]:
    """Every process ``up`` started: servers, workers, its watchdog."""
    children = {
        " ".join(c.cmdline()[-2:]) + f" {c.pid}": c.pid
        for c in psutil.Process(up.process.pid).children()
    }
    return {**_server_pids(up.home), **children}


def _get(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: dict[str, object] = json.loads(response.read())
            return body
    except OSError:
        return None


def _remember(home: Path, text: str) -> subprocess.CompletedProcess[str]:
    return engram(
        home,
        "enqueue",
        "remember",
        "--scope",
        '{"user_id": "up"}',
        "--request",
        json.dumps({"text": text}),
        "--wait",
        "30",
    )


def test_a_second_up_is_refused_and_a_killed_up_leaves_nothing_running(
    home: Path, start_up: Callable[..., Up]
) -> None:
    first = start_up(home)
    run = first.wait_ready()
    processes = _everything_of(first)
    # postgres, valkey, 2 workers, the jobs worker, the dashboard, the watchdog
    assert len(processes) == 7, processes
    health = wait_until(
        lambda: _get(f"{run['dashboard_url']}healthz"), timeout=60, what="the dashboard"
    )
    assert health["status"] == "ok", health

    # Its valkey wants the home's password, which the run file (its owner's only) holds,
    # and nothing printed shows.
    redis_url = str(run["redis_url"])
    password = urlsplit(redis_url).password
    assert password and password not in first.log()
    assert mask_url(redis_url) in first.log()
    assert stat.S_IMODE((home / "run.json").stat().st_mode) == 0o600
    tcp_url = str(run["redis_tcp_url"])  # for other clients; the password is the same
    assert urlsplit(tcp_url).password == password and mask_url(tcp_url) in first.log()
    port = urlsplit(tcp_url).port
    assert port and unauthenticated_reply(port, "KEYS", "*").startswith(b"-NOAUTH")
    with Producer.from_env({"ENGRAM_HOME": str(home)}) as producer:
        assert producer.client.ping()

    second = engram(home, "up")
    assert second.returncode == 4, second
    assert f"in use by engram up (pid {first.process.pid})" in second.stderr
    assert mask_url(redis_url) in second.stderr and str(run["database_url"]) in second.stderr
    assert password not in second.stderr + second.stdout
    assert "left running" not in second.stderr + second.stdout  # it touched nothing
    assert json.loads((home / "run.json").read_text()) == run
    assert _remember(home, "The first up still serves.").returncode == 0

    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    assert wait_gone(processes.values(), timeout_s=15), {
        n: p for n, p in processes.items() if live_process(p)
    }
    assert not (home / "run.json").exists()

    # The next up starts on the same home, with the same Redis port, and its data.
    third = start_up(home)
    assert third.wait_ready()["redis_url"] == run["redis_url"]
    again = _remember(home, "The first up still serves.")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["scope_revision"] == 2
    assert third.stop() == 0
    assert third.log().rstrip().endswith("engram: stopped")
    assert password not in third.log()


def test_the_next_up_cleans_what_a_crash_left_and_stops_cleanly(
    home: Path, start_up: Callable[..., Up]
) -> None:
    first = start_up(home)
    first.wait_ready()
    servers = _server_pids(home)
    # A crash that took the watchdog with it: the servers stay, with their files.
    watchdog = next(
        c for c in psutil.Process(first.process.pid).children() if "engram.watchdog" in c.cmdline()
    )
    watchdog.kill()
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    assert all(live_process(p) for p in servers.values())
    # And a dead pid, plus one of a live stranger, left in the library's handle file.
    stranger = subprocess.Popen(["sleep", "120"])
    try:
        handles = home / "postgres" / ".handle_pids.json"
        handles.write_text(json.dumps([first.process.pid, 999_999, stranger.pid]))

        second = start_up(home)
        second.wait_ready()
        assert wait_gone(servers.values(), timeout_s=1)  # stopped before the new ones started
        assert "a process left running child=postgres" in second.log()
        new_servers = _server_pids(home)
        assert assert_distinct(servers, new_servers)
        assert second.stop() == 0
        assert wait_gone(new_servers.values(), timeout_s=15)
        assert stranger.poll() is None  # not ours: untouched

        # Pid files naming a live stranger, as if the servers had died and their pids
        # been reused: taken for stale, not for the servers.
        pgdata = home / "postgres"
        (pgdata / "postmaster.pid").write_text(
            f"{stranger.pid}\n{pgdata}\n1700000000\n5432\n{pgdata}\n\n  1 2\nready\n"
        )
        (home / "valkey" / "valkey.pid").write_text(f"{stranger.pid}\n")
        # engram demo on the stopped home: it starts PostgreSQL and stops it again.
        demo = engram(home, "demo", timeout=120)
        assert demo.returncode == 0, demo.stderr
        assert "revision 2" in demo.stdout
        assert not (home / "postgres" / "postmaster.pid").exists()
        migrate = engram(home, "migrate")
        assert (migrate.returncode, migrate.stdout) == (0, "schema is up to date\n"), migrate
        assert not (home / "postgres" / "postmaster.pid").exists()
        assert not [
            p
            for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "postgres" and str(home) in " ".join(p.info["cmdline"] or [])
        ]
    finally:
        stranger.kill()
        stranger.wait()


def assert_distinct(before: dict[str, int], after: dict[str, int]) -> bool:
    return set(before) == set(after) and not set(before.values()) & set(after.values())


def test_demo_and_reads_use_a_running_up_and_leave_it_running(
    home: Path, start_up: Callable[..., Up]
) -> None:
    up = start_up(home)
    up.wait_ready()
    servers = _server_pids(home)
    demo = engram(home, "demo", timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert engram(home, "migrate").returncode == 0
    scopes = engram(home, "scopes", "--json")
    assert scopes.returncode == 0, scopes.stderr
    assert {"user_id": "engram-demo"} in [s["scope"] for s in json.loads(scopes.stdout)]
    assert all(live_process(p) for p in servers.values())
    ping = engram(home, "valkey-cli", "PING")
    assert (ping.returncode, ping.stdout) == (0, "PONG\n"), ping.stderr
    # ``kill -USR1`` has a process print where each of its threads is, and go on.
    worker = next(
        c for c in psutil.Process(up.process.pid).children() if c.cmdline()[-1] == "worker"
    )
    worker.send_signal(signal.SIGUSR1)
    wait_until(
        lambda: 'worker/consuming/worker.py", line' in up.log(), timeout=20, what="the stacks"
    )
    assert "engram-consumer" in up.log() or 'consuming/consumer.py", line' in up.log()
    assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
    assert up.stop() == 0


def test_up_logs_one_line_per_change_after_its_banner(
    home: Path, start_up: Callable[..., Up]
) -> None:
    up = start_up(home)
    up.wait_ready()
    worker = next(
        c for c in psutil.Process(up.process.pid).children() if c.cmdline()[-1] == "worker"
    )
    worker.kill()  # a worker dies: up says so, and starts another
    wait_until(lambda: "worker-" in up.log().split("Ctrl-C stops everything.")[1], timeout=20)
    assert up.stop() == 0
    after = up.log().split("Ctrl-C stops everything.\n")[1].splitlines()
    assert "partition" not in "\n".join(after)  # the workers' churn stays out of it
    assert any("exited, restarting" in line for line in after), after
    assert after[-1] == "engram: stopped", after
    # Every line is up's own: the state changes, each once.
    assert all(" engram." in line for line in after[:-1]), after
    for change in ("stopping", "workers stopped", "valkey stopped", "postgres stopped"):
        assert sum(line.endswith(change) for line in after) == 1, (change, after)


def test_a_taken_default_port_gives_way_to_a_free_one_served_from_the_banner_on(
    home: Path, start_up: Callable[..., Up]
) -> None:
    with socket.socket() as taker:
        with contextlib.suppress(OSError):  # already taken by another program: as good
            taker.bind(("127.0.0.1", DEFAULT_PORT))
            taker.listen()
        up = start_up(home, env={"ENGRAM_DASHBOARD_PORT": ""})
        run = up.wait_ready()
        url = str(run["dashboard_url"])
        # The first request after the banner is served: the port was bound before it.
        with urllib.request.urlopen(f"{url}healthz", timeout=30) as response:
            assert response.status == 200
        port = urlsplit(url).port
        assert port and port != DEFAULT_PORT
        assert f"dashboard   {url}" in up.log()
        assert f"port {DEFAULT_PORT} was taken" in up.log()
        assert up.stop() == 0


def test_a_taken_port_that_was_set_stops_up_with_the_reason_and_nothing_left(
    home: Path, start_up: Callable[..., Up]
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taker:
        port = taker.getsockname()[1]
        up = start_up(home, env={"ENGRAM_DASHBOARD_PORT": str(port)})
        wait_until(lambda: up.process.poll() is not None, timeout=60, what="up to refuse")
    assert up.process.returncode == 2, up.log()
    assert f"port {port} on 127.0.0.1 is taken" in up.log()
    assert "engram is up" not in up.log()
    assert not (home / "run.json").exists()
    assert not [p for p in _server_pids(home).values() if live_process(p)]
    assert not _processes_of(home)


def test_a_killed_embedded_server_comes_back_on_the_same_url(
    home: Path, start_up: Callable[..., Up]
) -> None:
    up = start_up(home)
    run = up.wait_ready()
    for name, url_key in (("postgres", "database_url"), ("valkey", "redis_url")):
        killed = _server_pids(home)[name]
        os.kill(killed, signal.SIGKILL)
        assert wait_gone([killed], timeout_s=10)
        if name == "valkey":  # an enqueue needs it (PostgreSQL's outage it waits out)
            wait_until(lambda: "valkey restarted" in up.log(), timeout=60, what="valkey")
        remembered = engram(
            home,
            "enqueue",
            "remember",
            "--scope",
            '{"user_id": "up"}',
            "--request",
            json.dumps({"text": f"Sent after {name} was killed."}),
            "--wait",
            "90",
            timeout=120,
        )
        assert remembered.returncode == 0, (remembered.stderr, up.log())
        # The server serves a moment before up has said so and noted its pid.
        pid = _server_pids(home)[name]
        assert pid != killed and live_process(pid)
        wait_until(lambda n=name, p=pid: _recorded_pid(home, n) == p, timeout=30, what="run file")
        assert f"{name} restarted" in up.log()
        assert json.loads((home / "run.json").read_text())[url_key] == run[url_key]
    assert up.process.poll() is None
    assert up.stop() == 0
    assert not [p for p in _server_pids(home).values() if live_process(p)]


def test_nothing_of_engram_goes_over_tcp_so_a_squatter_on_valkeys_port_hears_nothing(
    home: Path, start_up: Callable[..., Up]
) -> None:
    up = start_up(home)
    run = up.wait_ready()
    assert _remember(home, "Sent through the sockets.").returncode == 0
    health = wait_until(
        lambda: _get(f"{run['dashboard_url']}healthz"), timeout=60, what="the dashboard"
    )
    assert health["status"] == "ok", health  # it reached both servers too
    # Every process of engram, and both servers, hold no TCP connection: listeners only
    # (valkey's port, the dashboard's), and what the dashboard serves. PostgreSQL has
    # no TCP port at all.
    dashboard_port = urlsplit(str(run["dashboard_url"])).port
    assert _tcp_connections(up, dashboard_port) == [], up.log()
    assert psutil.Process(_server_pids(home)["postgres"]).net_connections("inet") == []

    # valkey dies, and another program takes its port before it is started again.
    tcp_url = urlsplit(str(run["redis_tcp_url"]))
    assert tcp_url.port and tcp_url.password
    killed = _server_pids(home)["valkey"]
    os.kill(killed, signal.SIGKILL)
    assert wait_gone([killed], timeout_s=10)
    squatter = wait_until(lambda: Squatter.take(tcp_url.port), what="valkey's port")
    try:
        # Meanwhile the workers, the jobs worker and the dashboard reconnect, a command
        # of the home tries, and up tries to start valkey again: it cannot listen on
        # its port, and up says so once the start's readiness check has given up.
        assert _remember(home, "Sent while valkey is down.").returncode != 0
        wait_until(lambda: "valkey did not start again" in up.log(), timeout=60, what="a restart")
    finally:
        received = squatter.close()
    assert not [r for r in received if b"AUTH" in r or tcp_url.password.encode() in r]
    assert received == []  # nothing of engram's even connected

    # The port free again, valkey comes back and everything finds it on its socket.
    wait_until(lambda: "valkey restarted" in up.log(), timeout=60, what="valkey")
    again = _remember(home, "Sent once valkey is back.")
    assert again.returncode == 0, (again.stderr, up.log())
    assert _tcp_connections(up, dashboard_port) == []
    assert "open to other users" not in up.log()  # as root too: made so, kept so

    # The home and the URLs engram's own are given: sockets in folders only we enter.
    gid = server_gid()  # as root, the embedded PostgreSQL's own user passes through
    assert stat.S_IMODE(home.stat().st_mode) == (0o700 if gid is None else 0o710)
    assert gid is None or home.stat().st_gid == gid
    assert str(run["database_url"]).endswith(f"?host={home.resolve() / 'postgres'}")
    socket_path = home.resolve() / "valkey" / "valkey.sock"
    assert run["redis_url"] == run["jobs_redis_url"]
    assert str(run["redis_url"]) == f"unix://default:{tcp_url.password}@{socket_path}?db=0"
    assert up.stop() == 0


def _tcp_connections(up: Up, dashboard_port: int | None) -> list[tuple[str, object]]:
    """The TCP connections (not listeners, not those the dashboard serves) of ``up``,
    its children and its servers."""
    root = psutil.Process(up.process.pid)
    procs = [root, *root.children(recursive=True)]
    procs += [psutil.Process(p) for p in _server_pids(up.home).values()]
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in proc.net_connections("tcp"):
                served = conn.laddr and conn.laddr.port == dashboard_port
                if conn.status != psutil.CONN_LISTEN and not served:
                    found.append((" ".join(proc.cmdline()[-2:]), conn))
    return found


def _recorded_pid(home: Path, name: str) -> int | None:
    """The pid of ``name`` in the home's run file (the one its watchdog would stop)."""
    processes = json.loads((home / "run.json").read_text())["processes"]
    return next((int(p["pid"]) for p in processes if p["name"] == name), None)


def _processes_of(home: Path) -> list[psutil.Process]:
    """Live processes started for ``home`` (it is in their environment)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("ENGRAM_HOME") == str(home):
                found.append(proc)
    return found


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ENGRAM_LEASE_TTL_MS", "soon"),  # the workers'
        ("ENGRAM_JOBS_TICK", "5"),  # the jobs' (a duration without its unit)
        ("ENGRAM_REDIS_PURGE_FILES", "maybe"),
        ("ENGRAM_WEB_STATEMENT_TIMEOUT", "1 minute"),  # the dashboard's
        ("ENGRAM_MCP_WAIT_S", "soon"),  # the MCP endpoint's
    ],
)
def test_up_refuses_a_setting_it_cannot_read_before_starting_anything(
    tmp_path: Path, variable: str, value: str
) -> None:
    home = tmp_path / "home"
    refused = subprocess.run(
        [sys.executable, "-m", "engram", "up"],
        env={**home_env(home), variable: value},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert f"{variable} must be " in refused.stderr
    assert not home.exists()


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_up_refuses_a_worker_count_below_one_before_starting_anything(
    tmp_path: Path, workers: str
) -> None:
    home = tmp_path / "home"
    refused = engram(home, "up", "--workers", workers)
    assert refused.returncode == 2
    assert "must be at least 1" in refused.stderr
    assert not home.exists()
    env_refused = subprocess.run(
        [sys.executable, "-m", "engram", "up"],
        env={**home_env(home), "ENGRAM_WORKERS": workers},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert env_refused.returncode == 2, env_refused.stderr
    assert "must be at least 1" in env_refused.stderr
    assert not (home / "postgres").exists()
