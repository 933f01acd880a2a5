"""Fixtures for the stream tests: one real valkey-server (append-only file on, but
not flushed to disk at each write: no test crashes it, and a test that kills valkey
starts a durable one of its own) for the whole run, flushed before each test that
asks for it; workers run in this process or as ``engram worker`` subprocesses, always
stopped by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from engram.procs import die_with_parent
from engram.store import LLM, Embedder, HashingEmbedder, Store
from engram.worker import keys
from engram.worker.consuming import groups
from engram.worker.consuming.partition import ForgetHook
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey
from engram.worker.settings import WorkerConfig

REPO = Path(__file__).resolve().parent.parent

# Short leases so that takeovers in the tests take about a second.
FAST = WorkerConfig(
    partitions=4, batch_size=64, block_ms=100, lease_ttl_ms=1000, lease_margin_ms=200
)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def not_acknowledged(client: redis.Redis, partition: int) -> int:
    """How many of ``partition``'s entries the workers were given and have not
    acknowledged: 0 before a worker first read the stream and so made its group."""
    try:
        return int(client.xpending(keys.stream(partition), keys.GROUP)["pending"])
    except redis.ResponseError as exc:
        if groups.is_missing(exc):
            return 0
        raise


def unauthenticated_reply(port: int, *command: str) -> bytes:
    """The first line of the server's reply to ``command`` sent by a client that never
    authenticated (plain RESP: redis-py would send HELLO first and fail at that)."""
    request = f"*{len(command)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in command)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request.encode())
        return sock.makefile("rb").readline()


class Squatter:
    """A program that took a server's port while the server was down: it keeps what
    each client that connects sends it (until the client closes, or says nothing
    more for a second)."""

    def __init__(self, port: int) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind(("127.0.0.1", port))
        except OSError:
            self.listener.close()
            raise
        self.listener.listen(64)
        self.listener.settimeout(0.1)
        self.received: list[bytes] = []  # one per connection
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @classmethod
    def take(cls, port: int) -> Squatter | None:
        """The squatter on ``port``, or None while another program still holds it."""
        with contextlib.suppress(OSError):
            return cls(port)
        return None

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            reader = threading.Thread(target=self._read, args=(conn,), daemon=True)
            reader.start()
            self._threads.append(reader)

    def _read(self, conn: socket.socket) -> None:
        data = b""
        with conn:
            conn.settimeout(1.0)
            with contextlib.suppress(OSError):
                while chunk := conn.recv(4096):
                    data += chunk
        with self._lock:
            self.received.append(data)

    def close(self) -> list[bytes]:
        """Stop listening; what every client that connected sent."""
        self._stop.set()
        self._threads[0].join(timeout=10)  # then no reader is added any more
        for reader in self._threads[1:]:
            reader.join(timeout=10)
        self.listener.close()
        return self.received

    def __enter__(self) -> Squatter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedValkey]:
    server = EmbeddedValkey(tmp_path_factory.mktemp("valkey"), appendfsync="no").start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(valkey: EmbeddedValkey) -> str:
    """The session valkey, emptied for this test."""
    client = redis.Redis.from_url(valkey.url)  # the session valkey wants its password
    client.flushall()
    client.close()
    return valkey.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = connect_redis(redis_url)
    yield client
    client.close()


class InProcessWorker:
    """A ``Worker`` running on a thread of the test process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the worker did not stop"


@pytest.fixture
def start_worker(redis_url: str) -> Callable[..., InProcessWorker]:
    """``with start_worker(store) as w:`` runs a worker until the block ends."""

    def start(
        store: Store,
        embedder: Embedder | None = None,
        *,
        config: WorkerConfig = FAST,
        worker_id: str | None = None,
        llm: LLM | None = None,
        on_forget: ForgetHook | None = None,
    ) -> InProcessWorker:
        client = connect_redis(redis_url)
        return InProcessWorker(
            Worker(
                client,
                store,
                embedder or HashingEmbedder(64),
                llm=llm,
                config=config,
                worker_id=worker_id,
                on_forget=on_forget,
            )
        )

    return start


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signum)

    def stop(self, timeout: float = 20.0) -> int:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.signal(signal.SIGKILL)
        self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def spawn(command: str, env: dict[str, str], log_path: Path) -> WorkerProcess:
    """``engram <command>`` as a subprocess of the test, its output in ``log_path``."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "engram", "--log-level", "INFO", command],
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            preexec_fn=die_with_parent(),  # SIGTERM if the test run dies, however it dies
        )
    return WorkerProcess(process, log_path)


def stop_all(started: list[WorkerProcess]) -> None:
    """SIGTERM each (SIGKILL if it does not stop), by pid."""
    for proc in started:
        if proc.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.stop(timeout=10)
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait()


@pytest.fixture
def worker_processes(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``engram worker`` subprocesses; every one is stopped (by pid) at the end."""
    started: list[WorkerProcess] = []

    def start(**settings: Any) -> WorkerProcess:
        proc = spawn("worker", worker_env(**settings), tmp_path / f"worker-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    stop_all(started)


def worker_env(
    *,
    database_url: str,
    redis_url: str,
    config: WorkerConfig = FAST,
    embedder: str = "hashing:64",
    env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an ``engram worker`` with ``config`` on these servers."""
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "ENGRAM_EMBEDDER": embedder,
        "ENGRAM_PARTITIONS": str(config.partitions),
        "ENGRAM_BATCH_SIZE": str(config.batch_size),
        "ENGRAM_BLOCK_MS": str(config.block_ms),
        "ENGRAM_LEASE_TTL_MS": str(config.lease_ttl_ms),
        "ENGRAM_LEASE_MARGIN_MS": str(config.lease_margin_ms),
        "ENGRAM_MAX_DELIVERIES": str(config.max_deliveries),
        "ENGRAM_DB_POOL_SIZE": "4",
        **(env or {}),
    }


# -- embedders the stream tests plug into workers (``ENGRAM_EMBEDDER=module:factory``) --


class PoisonEmbedder(HashingEmbedder):
    """The test hashing embedder, except that it fails on any text holding ``POISON``."""

    def __init__(self) -> None:
        super().__init__(64)

    def embed(self, texts: Any) -> Any:
        if any("POISON" in t for t in texts):
            raise ValueError("this embedder cannot embed that text")
        return super().embed(texts)


class SlowEmbedder(HashingEmbedder):
    """The test hashing embedder, slowed by ``ENGRAM_TEST_EMBED_DELAY_S`` per call; each call
    appends a line to ``ENGRAM_TEST_EMBED_MARK`` first, so a test knows a batch is in hand."""

    def __init__(self) -> None:
        super().__init__(64)
        self.delay_s = float(os.environ.get("ENGRAM_TEST_EMBED_DELAY_S", "0"))
        self.mark = os.environ.get("ENGRAM_TEST_EMBED_MARK")

    def embed(self, texts: Any) -> Any:
        if self.mark:
            with open(self.mark, "a") as f:
                f.write(f"{len(texts)}\n")
        time.sleep(self.delay_s)
        return super().embed(texts)
