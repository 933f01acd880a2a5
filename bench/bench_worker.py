"""Stream benchmark: operations end to end (enqueue -> committed receipt), engram
against three baselines built here, measured side by side in one run.

    python -m bench.bench_worker [--ops 50000] [--workers 2] [--appendfsync always|everysec]

Every system consumes the same ``remember`` operations (distinct sentences over
1,000 scopes) from Redis, embeds them with the default WordLlama embedder,
writes them to PostgreSQL (fsync and synchronous_commit on) and answers each
one on its reply key; a collector process notes when each answer appears.
Systems:

* engram: ``Producer`` -> 16 partition streams -> ``engram worker`` processes
  (the full versioned write: record, revision, vector, text index, receipt,
  scope revision; one consumer per worker, one transaction per cycle);
* baseline 1: one RQ job per operation, run by an RQ ``SimpleWorker``;
* baseline 2: a naive stream consumer: per entry, embed, one plain INSERT, one
  transaction, reply, acknowledge;
* baseline 3: the same consumer with one transaction per 100 entries.

For each: the maximum rate (the load is enqueued in bulk, 200 operations per
round trip, while the consumer runs; ops/s = operations / (last answer - first
enqueue)), sustained: by default the load keeps each system busy for at least
as long as its half-max run lasts (a burst of a few seconds ends before the
periodic costs of a steady load come due, and overstates the rate), latency
p50/p99 at that rate (mostly queueing), then p50/p99 at half of it
(operations enqueued one by one by 4 producer threads, paced together at that
rate), once the database has done the upkeep the burst left (VACUUM ANALYZE,
CHECKPOINT). Then engram alone at fractions of its maximum (``--curve``), to show
where its p99 stands as the load grows. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.common import CpuShares, MachineCpu, fresh_database, percentile, sentences
from store import Operation
from store.server import EmbeddedPostgres
from worker import keys
from worker.producer import Producer
from worker.valkey import EmbeddedValkey

REPO = Path(__file__).resolve().parent.parent
SCOPES = 1_000
NAIVE_STREAM = "bench:naive"
RQ_QUEUE = "bench"
# Operations per round trip in the maximum-rate runs.
BULK = 200
# Threads enqueueing one operation at a time in the paced runs, each its share.
PACED_PRODUCERS = 4
PLAIN_TABLE = (
    "CREATE TABLE IF NOT EXISTS plain_memories (id text PRIMARY KEY, scope text NOT NULL,"
    " text text NOT NULL, embedding vector(256) NOT NULL)"
)


# -- the consumers of the baselines (run in their own processes) ----------------------


_conn: psycopg.Connection[Any] | None = None
_embedder: Any = None


def _plain_writer(dsn: str) -> tuple[psycopg.Connection[Any], Any]:
    global _conn, _embedder
    if _conn is None:
        from pgvector.psycopg import register_vector

        from store import WordLlamaEmbedder

        _conn = psycopg.connect(dsn)
        register_vector(_conn)
        _embedder = WordLlamaEmbedder()
    return _conn, _embedder


def rq_job(dsn: str, redis_url: str, op_id: str, scope: str, text: str) -> str:
    """Baseline 1: one operation as one RQ job (embed, INSERT, commit, answer)."""
    conn, embedder = _plain_writer(dsn)
    vector = embedder.embed([text])[0]
    with conn.transaction():
        conn.execute(
            "INSERT INTO plain_memories VALUES (%s, %s, %s, %s)", (op_id, scope, text, vector)
        )
    client = _redis(redis_url)
    _answer(client, [op_id])
    return op_id


_clients: dict[str, redis.Redis] = {}


def _redis(url: str) -> redis.Redis:
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url)
    return _clients[url]


def _answer(client: redis.Redis, op_ids: list[str]) -> None:
    pipe = client.pipeline(transaction=False)
    for op_id in op_ids:
        key = keys.reply(op_id)
        pipe.delete(key)
        pipe.rpush(key, json.dumps({"entry": None, "receipt": {"operation_id": op_id}}))
        pipe.expire(key, 3600)
    pipe.execute()


def naive_consumer(dsn: str, redis_url: str, tx_entries: int) -> None:
    """Baselines 2 and 3: read the stream (100 entries at a time); per entry embed and
    INSERT; commit every ``tx_entries`` entries, then answer and acknowledge those."""
    client = _redis(redis_url)
    conn, embedder = _plain_writer(dsn)
    with contextlib.suppress(redis.ResponseError):  # the group exists already
        client.xgroup_create(NAIVE_STREAM, "naive", id="0", mkstream=True)
    while True:
        reply: Any = client.xreadgroup("naive", "c1", {NAIVE_STREAM: ">"}, count=100, block=1000)
        if not reply:
            continue
        entries = reply[0][1]
        for start in range(0, len(entries), tx_entries):
            chunk = entries[start : start + tx_entries]
            done = []
            with conn.transaction():
                for entry_id, fields in chunk:
                    op = json.loads(fields[b"op"])
                    vector = embedder.embed([op["text"]])[0]
                    conn.execute(
                        "INSERT INTO plain_memories VALUES (%s, %s, %s, %s)",
                        (op["id"], op["scope"], op["text"], vector),
                    )
                    done.append((entry_id, op["id"]))
            _answer(client, [op_id for _, op_id in done])
            client.xack(NAIVE_STREAM, "naive", *[e for e, _ in done])


def rq_worker(redis_url: str) -> None:
    from rq import Queue, SimpleWorker

    client = redis.Redis.from_url(redis_url)
    SimpleWorker([Queue(RQ_QUEUE, connection=client)], connection=client).work(
        logging_level="WARNING"
    )


# -- the systems, as the benchmark drives them ----------------------------------------


class System:
    name = ""

    def __init__(self, dsn: str, redis_url: str) -> None:
        self.dsn = dsn
        self.redis_url = redis_url
        self.processes: list[subprocess.Popen[bytes]] = []

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.processes.append(
            subprocess.Popen(
                [sys.executable, *args],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def start(self) -> None:
        raise NotImplementedError

    def enqueue(self, op_id: str, scope: dict[str, str], text: str) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, items: list[tuple[str, dict[str, str], str]]) -> None:
        """One round trip for many (so that the producer is never the bottleneck)."""
        raise NotImplementedError

    def settle(self) -> None:
        """Do now the upkeep a burst of writes leaves the database (vacuum, analyze,
        the checkpoint), so that the next run is charged with its own load only."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
            conn.execute("CHECKPOINT")

    def stop(self) -> None:
        for p in self.processes:
            p.terminate()
        for p in self.processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.processes.clear()


class Engram(System):
    def __init__(
        self,
        dsn: str,
        redis_url: str,
        workers: int,
        batch_size: int,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(dsn, redis_url)
        self.name = f"engram ({workers} worker process{'es' if workers > 1 else ''})"
        self.workers = workers
        self.batch_size = batch_size
        self.env = env or {}  # more settings for the workers (ENGRAM_LLM_*, say)
        self.producer = Producer.from_url(redis_url)

    def start(self) -> None:
        from store import Store

        Store.connect(self.dsn).close()  # migrate
        for _ in range(self.workers):
            self._spawn(
                ["-m", "engram", "--log-level", "WARNING", "worker"],
                {
                    "DATABASE_URL": self.dsn,
                    "REDIS_URL": self.redis_url,
                    "ENGRAM_BATCH_SIZE": str(self.batch_size),
                    "ENGRAM_EMBEDDER": "wordllama",
                    **self.env,
                },
            )
        self._wait_balanced()

    def _wait_balanced(self) -> None:
        """Measure once the workers share the partitions evenly (not while they rebalance)."""
        from worker.defaults import PARTITIONS
        from worker.leases import Leases

        leases = Leases(self.producer.client, ttl_ms=1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            holders = leases.holders(range(PARTITIONS)).values()
            counts = Counter(h[0] for h in holders if h is not None)
            if (
                sum(counts.values()) == PARTITIONS
                and len(counts) == self.workers
                and max(counts.values()) - min(counts.values()) <= 1
            ):
                return
            time.sleep(0.1)
        raise RuntimeError("the engram workers did not share the partitions within 60 s")

    def enqueue(self, op_id: str, scope: dict[str, str], text: str) -> None:
        self.producer.remember(scope, text, operation_id=op_id)

    def enqueue_bulk(self, items: list[tuple[str, dict[str, str], str]]) -> None:
        self.producer.enqueue_many(
            [
                Operation.build("remember", scope, {"text": text}, op_id)
                for op_id, scope, text in items
            ]
        )


class Naive(System):
    def __init__(self, dsn: str, redis_url: str, tx_entries: int) -> None:
        super().__init__(dsn, redis_url)
        self.tx_entries = tx_entries
        self.name = (
            f"baseline {2 if tx_entries == 1 else 3}: naive consumer, "
            f"1 transaction per {'entry' if tx_entries == 1 else f'{tx_entries} entries'}"
        )
        self.client = redis.Redis.from_url(redis_url)

    def start(self) -> None:
        _plain_table(self.dsn)
        self._spawn(
            [
                "-c",
                "import sys; from bench.bench_worker import naive_consumer;"
                f" naive_consumer({self.dsn!r}, {self.redis_url!r}, {self.tx_entries})",
            ]
        )

    def enqueue(self, op_id: str, scope: dict[str, str], text: str) -> None:
        self.enqueue_bulk([(op_id, scope, text)])

    def enqueue_bulk(self, items: list[tuple[str, dict[str, str], str]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for op_id, scope, text in items:
            pipe.xadd(
                NAIVE_STREAM,
                {
                    "op": json.dumps(
                        {"id": op_id, "scope": json.dumps(scope, sort_keys=True), "text": text}
                    )
                },
            )
        pipe.execute()


class Rq(System):
    name = "baseline 1: one RQ job per operation (SimpleWorker)"

    def __init__(self, dsn: str, redis_url: str) -> None:
        super().__init__(dsn, redis_url)
        from rq import Queue

        self.queue = Queue(RQ_QUEUE, connection=redis.Redis.from_url(redis_url))

    def start(self) -> None:
        _plain_table(self.dsn)
        self._spawn(
            ["-c", f"from bench.bench_worker import rq_worker; rq_worker({self.redis_url!r})"]
        )

    def enqueue(self, op_id: str, scope: dict[str, str], text: str) -> None:
        self.enqueue_bulk([(op_id, scope, text)])

    def enqueue_bulk(self, items: list[tuple[str, dict[str, str], str]]) -> None:
        from rq import Queue

        # By name: run as ``python -m bench.bench_worker``, this module is __main__ here.
        self.queue.enqueue_many(
            [
                Queue.prepare_data(
                    "bench.bench_worker.rq_job",
                    (self.dsn, self.redis_url, op_id, json.dumps(scope, sort_keys=True), text),
                    result_ttl=600,
                )
                for op_id, scope, text in items
            ]
        )


def _plain_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(PLAIN_TABLE)


# -- measuring ------------------------------------------------------------------------


def _collect(redis_kwargs: dict[str, Any], expected: int, conn: Connection) -> None:
    """In its own process: note when each answer appears, then send the times back."""
    client = redis.Redis(**redis_kwargs)
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe("__keyevent@0__:rpush")
    while pubsub.get_message(timeout=0.1) is not None:
        pass  # the subscription is live once this returns
    conn.send("ready")
    prefix = keys.reply("").encode()
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 900
    while len(seen) < expected and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message is None:
            continue
        now = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every process
        key: bytes = message["data"]
        if key.startswith(prefix):  # not another list (RQ's queue, say)
            seen.setdefault(key.removeprefix(prefix).decode(), now)
    conn.send(seen)


class Collector:
    """Notes when each operation's answer appears on its reply key, through keyspace
    notifications (no polling). It runs in a process of its own: in this one it
    would wait for the producer threads' GIL before taking each time."""

    def __init__(self, client: redis.Redis, expected: int) -> None:
        client.config_set("notify-keyspace-events", "El")
        kwargs = client.connection_pool.connection_kwargs
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_collect,
            args=({"host": kwargs["host"], "port": kwargs["port"]}, expected, child),
            daemon=True,
        )
        self._process.start()
        if not (self._conn.poll(120) and self._conn.recv() == "ready"):
            raise RuntimeError("the collector process did not start")
        self.expected = expected
        self.sent: dict[str, float] = {}
        self.seen: dict[str, float] = {}

    def wait(self, timeout: float) -> bool:
        """Whether every answer came; ``seen`` holds those that did."""
        if self._conn.poll(timeout):
            self.seen = self._conn.recv()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
        return len(self.seen) == self.expected

    def result(self, start: float, cpu: CpuShares | None = None) -> Result:
        latencies = {op_id: (self.seen[op_id] - at) * 1000 for op_id, at in self.sent.items()}
        return Result(
            len(self.sent),
            max(self.seen.values()) - start,
            percentile(list(latencies.values()), 50),
            percentile(list(latencies.values()), 99),
            cpu,
            latencies,
            {op_id: at - start for op_id, at in self.sent.items()},
            {op_id: at - start for op_id, at in self.seen.items()},
        )


@dataclass
class Result:
    ops: int
    seconds: float
    p50_ms: float
    p99_ms: float
    # How the machine's CPU time was used meanwhile (None: not on Linux).
    cpu: CpuShares | None = None
    # Per operation id: its latency, and when it was sent and answered (s after the start).
    latencies_ms: dict[str, float] = field(default_factory=dict)
    sent_s: dict[str, float] = field(default_factory=dict)
    answered_s: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.ops / self.seconds


def drive(
    system: System,
    client: redis.Redis,
    load: list[tuple[str, dict[str, str], str]],
    rate: float | None,
    tick_ms: float | None = None,
) -> Result:
    """Enqueue ``load`` (in bulk, or one by one at ``rate``/s, or at ``rate``/s in a
    round trip every ``tick_ms`` for what fell due); wait for every answer."""
    collector = Collector(client, len(load))
    cpu = MachineCpu()
    start = time.perf_counter()
    if rate is not None and tick_ms:
        # A producer that batches its enqueues: each operation is timed from when it
        # fell due, so its wait in the producer counts.
        sent = 0
        while sent < len(load):
            time.sleep(tick_ms / 1000)
            due = min(int((time.perf_counter() - start) * rate) + 1, len(load))
            if due > sent:
                system.enqueue_bulk(load[sent:due])
                collector.sent.update((load[i][0], start + i / rate) for i in range(sent, due))
                sent = due
    elif rate is None:
        for i in range(0, len(load), BULK):
            chunk = load[i : i + BULK]
            t = time.perf_counter()
            system.enqueue_bulk(chunk)
            collector.sent.update((op_id, t) for op_id, _, _ in chunk)
    else:
        # Several producers, as in production: one alone cannot enqueue one by one
        # at these rates (each XADD waits for valkey's fsync).
        def produce(first: int) -> None:
            for i in range(first, len(load), PACED_PRODUCERS):
                op_id, scope, text = load[i]
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                t = time.perf_counter()
                system.enqueue(op_id, scope, text)
                collector.sent[op_id] = t

        producers = [
            threading.Thread(target=produce, args=(k,), daemon=True) for k in range(PACED_PRODUCERS)
        ]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()
    if not collector.wait(timeout=900):
        raise RuntimeError(f"{system.name}: {len(load) - len(collector.seen)} answers missing")
    return collector.result(start, cpu.shares())


def make_load(tag: str, n: int, texts: list[str]) -> list[tuple[str, dict[str, str], str]]:
    return [
        (f"{tag}:{i}", {"user_id": f"user-{i % SCOPES}"}, texts[i % len(texts)] + f" {tag}")
        for i in range(n)
    ]


def measure(
    make: Callable[[], System],
    redis_client: redis.Redis,
    n_max: int,
    half_seconds: float,
    texts: list[str],
    tag: str,
) -> tuple[str, Result, Result]:
    redis_client.flushall()
    system = make()
    system.start()
    try:
        drive(system, redis_client, make_load(f"{tag}-warm", min(500, n_max), texts), None)
        full = drive(system, redis_client, make_load(f"{tag}-max", n_max, texts), None)
        system.settle()
        half_rate = full.rate / 2
        n_half = max(int(half_rate * half_seconds), 50)
        half = drive(system, redis_client, make_load(f"{tag}-half", n_half, texts), half_rate)
    finally:
        system.stop()
    print(
        f"  {system.name}: {full.rate:,.0f} ops/s over {full.seconds:.1f} s;"
        f" p50/p99 {full.p50_ms:.0f}/{full.p99_ms:.0f} ms at max,"
        f" {half.p50_ms:.1f}/{half.p99_ms:.1f} ms at {half_rate:,.0f}/s"
        f" (CPU busy {_busy(full)} / {_busy(half)}, stolen {_stolen(full)} / {_stolen(half)})",
        file=sys.stderr,
        flush=True,
    )
    return system.name, full, half


def curve(
    make: Callable[[], System],
    redis_client: redis.Redis,
    rates: list[float],
    seconds: float,
    texts: list[str],
    tick_ms: float | None = None,
) -> list[tuple[float, Result]]:
    """Latency at each paced rate, one system start for all of them."""
    redis_client.flushall()
    system = make()
    system.start()
    points: list[tuple[float, Result]] = []
    try:
        drive(system, redis_client, make_load("curve-warm", 500, texts), None)
        for i, rate in enumerate(rates):
            load = make_load(f"curve{i}", max(int(rate * seconds), 50), texts)
            result = drive(system, redis_client, load, rate, tick_ms)
            points.append((rate, result))
            print(
                f"  curve: {result.p50_ms:.1f}/{result.p99_ms:.1f} ms at {rate:,.0f}/s"
                f" (CPU busy {_busy(result)}, stolen {_stolen(result)})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        system.stop()
    return points


def _median_run(runs: list[tuple[str, Result, Result]]) -> tuple[str, Result, Result]:
    """The run with the median maximum rate (its latencies with it)."""
    return sorted(runs, key=lambda r: r[1].rate)[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ops",
        type=int,
        default=50_000,
        help="engram's maximum-rate run (the baselines' are scaled to last about as long)",
    )
    parser.add_argument("--workers", type=int, default=2, help="engram worker processes")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--half-seconds", type=float, default=8.0)
    parser.add_argument(
        "--appendfsync",
        choices=("always", "everysec"),
        default="always",
        help="the valkey append-only file's sync policy",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of every system (interleaved); the median is reported",
    )
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument(
        "--tick-ms",
        type=float,
        default=0.0,
        help="also measure engram at half its maximum with producers that enqueue, every"
        " this many ms, what fell due (a diagnostic; 0: skip)",
    )
    parser.add_argument(
        "--curve",
        default="0.2,0.3,0.4,0.5",
        help="fractions of engram's median maximum at which to measure its latency too",
    )
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="engram-bench-"))
    postgres = EmbeddedPostgres(home)
    valkey = EmbeddedValkey(home, appendfsync=args.appendfsync).start()
    client = redis.Redis(port=valkey.port)
    try:
        with psycopg.connect(postgres.dsn()) as conn:
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("fsync", "synchronous_commit")
            }
        assert settings == {"fsync": "on", "synchronous_commit": "on"}, settings
        texts = sentences(20_000)
        runs: list[tuple[str, Callable[[], System], int]] = [
            (
                "engram",
                lambda: Engram(
                    fresh_database(postgres, "b_engram"), valkey.url, args.workers, args.batch_size
                ),
                args.ops,
            )
        ]
        if not args.skip_baselines:
            runs += [
                (
                    "rq",
                    lambda: Rq(fresh_database(postgres, "b_rq"), valkey.url),
                    max(args.ops // 20, 500),
                ),
                (
                    "naive1",
                    lambda: Naive(fresh_database(postgres, "b_naive1"), valkey.url, 1),
                    max(args.ops // 4, 2000),
                ),
                (
                    "naive100",
                    lambda: Naive(fresh_database(postgres, "b_naive100"), valkey.url, 100),
                    max(args.ops // 2, 4000),
                ),
            ]
        by_system: list[list[tuple[str, Result, Result]]] = [[] for _ in runs]
        for r in range(args.repeat):  # interleaved, so that a noisy minute hits everyone
            for i, (tag, make, n) in enumerate(runs):
                by_system[i].append(measure(make, client, n, args.half_seconds, texts, f"{tag}{r}"))
        results = [_median_run(system_runs) for system_runs in by_system]
        fractions = [float(f) for f in args.curve.split(",") if f]
        points = curve(
            runs[0][1],
            client,
            [results[0][1].rate * f for f in fractions],
            args.half_seconds,
            texts,
        )
        half = results[0][1].rate / 2
        batched = (
            curve(runs[0][1], client, [half], args.half_seconds, texts, args.tick_ms)
            if args.tick_ms
            else []
        )
    finally:
        client.close()
        valkey.stop()
        postgres.stop()
    _report(results, args)
    _report_curve(points, results[0][1].rate)
    for rate, result in batched:
        print(
            f"\nengram at half max ({rate:,.0f}/s) with producers enqueueing what fell due every"
            f" {args.tick_ms:g} ms (timed from when each fell due): p50 / p99"
            f" {result.p50_ms:,.1f} / {result.p99_ms:,.1f} ms"
        )


def _report(results: list[tuple[str, Result, Result]], args: argparse.Namespace) -> None:
    print(
        f"\n## Stream benchmark ({os.cpu_count()} CPUs; PostgreSQL fsync and "
        f"synchronous_commit on; valkey appendfsync {args.appendfsync}; "
        f"median of {args.repeat} runs)\n"
    )
    print(
        "| system | ops/s (max) | p50 / p99 ms at max | p50 / p99 ms at half max |"
        " CPU busy at max / half max | CPU stolen at max / half max |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, full, half in results:
        print(
            f"| {name} | {full.rate:,.0f} | {full.p50_ms:,.0f} / {full.p99_ms:,.0f} | "
            f"{half.p50_ms:,.1f} / {half.p99_ms:,.1f} | {_busy(full)} / {_busy(half)} |"
            f" {_stolen(full)} / {_stolen(half)} |"
        )
    if len(results) == 4:
        engram = results[0][1].rate
        print("\n| engram vs | ratio | target |\n|---|---:|---:|")
        for (name, full, _), target in zip(results[1:], ("25x", "2x", "1x (stretch)"), strict=True):
            print(f"| {name} | {engram / full.rate:.1f}x | {target} |")
    half = results[0][2]
    print(
        f"\nengram p99 at half max: {half.p99_ms:.1f} ms (target < 100 ms); "
        f"batch size {args.batch_size}, {args.workers} worker process(es), 16 partitions."
    )


def _report_curve(points: list[tuple[float, Result]], max_rate: float) -> None:
    if not points:
        return
    print(
        "\n| engram, paced at | ops/s | p50 / p99 ms | CPU busy | CPU stolen |"
        "\n|---|---:|---:|---:|---:|"
    )
    for rate, result in points:
        print(
            f"| {rate / max_rate:.0%} of max | {rate:,.0f} | "
            f"{result.p50_ms:,.1f} / {result.p99_ms:,.1f} | {_busy(result)} | {_stolen(result)} |"
        )


def _busy(result: Result) -> str:
    return "?" if result.cpu is None else f"{result.cpu.busy:.0%}"


def _stolen(result: Result) -> str:
    return "?" if result.cpu is None else f"{result.cpu.stolen:.0%}"


if __name__ == "__main__":
    main()
