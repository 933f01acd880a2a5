"""``engram up``: the embedded servers (unless configured), the schema, and the workers.

With no ``DATABASE_URL`` it starts the embedded PostgreSQL, with no
``REDIS_URL`` the embedded valkey-server, both under ``ENGRAM_HOME``. It
migrates, runs the workers as ``engram worker`` subprocesses (restarting one
that dies), prints where everything is, and on Ctrl-C or SIGTERM stops the
workers (each finishes its batch in hand), then the servers it started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

from store import Store
from store.errors import EngramError
from store.server import EmbeddedPostgres
from worker.runtime import RUN_FILE, write_run_file
from worker.settings import Settings
from worker.valkey import EmbeddedValkey

log = logging.getLogger(__name__)

# A worker that stops sooner than this after its start is restarted only after a pause.
_RESTART_PAUSE_S = 2.0
_STOP_TIMEOUT_S = 30.0


@dataclass(slots=True)
class _Child:
    index: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


class Workers:
    """``count`` worker subprocesses, kept running until ``stop``."""

    def __init__(self, count: int, env: dict[str, str]) -> None:
        self.count = count
        self.env = env
        self.children: list[_Child] = []

    def start(self) -> None:
        self.children = [self._spawn(i) for i in range(self.count)]

    def _spawn(self, index: int) -> _Child:
        process = subprocess.Popen([sys.executable, "-m", "engram", "worker"], env=self.env)
        log.info("worker process started", extra={"index": index, "pid": process.pid})
        return _Child(index, process)

    def check(self) -> None:
        """Restart a worker that exited (not too eagerly, if it keeps failing)."""
        for i, child in enumerate(self.children):
            code = child.process.poll()
            if code is None:
                continue
            if time.monotonic() - child.started < _RESTART_PAUSE_S:
                continue
            log.warning(
                "worker process exited, restarting",
                extra={"index": child.index, "pid": child.process.pid, "code": code},
            )
            self.children[i] = self._spawn(child.index)

    def stop(self) -> None:
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for child in self.children:
            try:
                child.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning(
                    "worker process did not stop, killing it", extra={"pid": child.process.pid}
                )
                child.process.kill()
                child.process.wait()


def run_up(settings: Settings, *, workers: int, demo: bool = False) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    postgres: EmbeddedPostgres | None = None
    valkey: EmbeddedValkey | None = None
    pool: Workers | None = None
    try:
        database_url = settings.database_url
        if database_url is None:
            postgres = EmbeddedPostgres(settings.home)
            database_url = postgres.dsn()
        redis_url = settings.redis_url
        if redis_url is None:
            valkey = EmbeddedValkey(settings.home).start()
            redis_url = valkey.url
        with Store.connect(database_url):
            pass  # migrates
        run_file = write_run_file(settings.home, database_url=database_url, redis_url=redis_url)
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "ENGRAM_HOME": str(settings.home),
        }
        pool = Workers(workers, env)
        pool.start()
        _print_where(settings, database_url, redis_url, postgres, valkey, workers, run_file)
        if demo:
            _stream_demo(redis_url, settings)
        while not stop.wait(1.0):
            pool.check()
        print("engram: stopping", flush=True)
        return 0
    finally:
        if pool is not None:
            pool.stop()
        with contextlib.suppress(OSError):
            (settings.home / RUN_FILE).unlink()
        if valkey is not None:
            valkey.stop()
        if postgres is not None:
            postgres.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _print_where(
    settings: Settings,
    database_url: str,
    redis_url: str,
    postgres: EmbeddedPostgres | None,
    valkey: EmbeddedValkey | None,
    workers: int,
    run_file: object,
) -> None:
    pg = f"embedded, data in {postgres.data_dir}" if postgres else "DATABASE_URL"
    vk = f"embedded, data in {valkey.data_dir}" if valkey else "REDIS_URL"
    print(
        f"engram is up (ENGRAM_HOME={settings.home.resolve()})\n"
        f"  PostgreSQL  {database_url}  ({pg})\n"
        f"  Redis       {redis_url}  ({vk})\n"
        f"  workers     {workers} x `engram worker`, "
        f"{settings.worker.partitions} partition streams\n"
        f"  run file    {run_file}\n"
        'try:  engram enqueue remember --scope \'{"user_id": "ada"}\' '
        '--request \'{"text": "Ada lives in London."}\' --wait 10\n'
        "Ctrl-C stops everything.",
        flush=True,
    )


def _stream_demo(redis_url: str, settings: Settings) -> None:
    """Remember then revise through the streams, and print the receipts."""
    from worker.producer import Producer

    with Producer.from_url(redis_url, partitions=settings.worker.partitions) as producer:
        scope = {"user_id": "engram-demo"}
        first = producer.remember(
            scope, "The demo user lives in London.", operation_id="demo:stream:remember:1"
        ).wait(60)
        print(
            f"demo: {first.kind} -> {[r.as_dict() for r in first.records]}"
            f" (scope revision {first.scope_revision}, replayed {first.replayed})",
            flush=True,
        )
        record_id = first.records[0].id
        second = producer.revise(
            scope,
            record_id,
            text="The demo user lives in Paris.",
            expected_revision=1,
            operation_id="demo:stream:revise:1",
        )
        try:
            receipt = second.wait(60)
            print(f"demo: revise -> {[r.as_dict() for r in receipt.records]}", flush=True)
        except EngramError as exc:  # e.g. a revision conflict
            print(f"demo: revise -> {type(exc).__name__}", flush=True)
