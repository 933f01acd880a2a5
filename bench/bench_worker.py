"""Stream benchmark: operations end to end (enqueue -> committed receipt), engram
against three baselines built here, measured side by side in one run.

    python -m bench.bench_worker [--ops 50000] [--workers 2] [--repeat 3]

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

Baselines 2 and 3 run as many consumer processes (one consumer group) as engram
has workers (``--workers``, default 2).

1. The maximum of each system: the load is enqueued in bulk, 200 operations
   per round trip, while the consumers run; ops/s = operations / (last answer -
   first enqueue), sustained (by default each run lasts 10 s or more: a burst
   ends before the periodic costs of a steady load come due). Against baseline
   3: target engram >= 1.5x.
2. engram and baseline 3 at the same offered load, 25% and 50% of baseline 3's
   own median maximum (``--loads``), operations enqueued one at a time by 4
   producer threads paced together: receipt p50/p99 and CPU per operation.
   Targets: engram's p99 and CPU per operation no higher than baseline 3's.
3. engram's CPU per operation at 10% of its maximum (``--low``), against that
   at its maximum. Target: at most 2x.

CPU per operation counts the system's own processes (workers or consumers), the
whole PostgreSQL server and valkey; not the benchmark's producers or collector.
Every figure is the median of ``--repeat`` runs, interleaved (engram, baseline,
engram, baseline, ...), so that a noisy minute hits every system. Prints
markdown tables, each target as "met" or "not met".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
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

from bench.common import (
    CpuShares,
    MachineCpu,
    TreeCpu,
    fresh_database,
    median,
    percentile,
    sentences,
)
from engram.store import Operation
from engram.store.server import EmbeddedPostgres
from engram.worker import keys
from engram.worker.embedded.valkey import EmbeddedValkey
from engram.worker.producer import Producer

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

        from engram.store import WordLlamaEmbedder

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
        key = keys.reply("", op_id)  # the baselines' answers: the collector reads the id
        pipe.delete(key)
        pipe.rpush(key, json.dumps({"entry": None, "receipt": {"operation_id": op_id}}))
        pipe.expire(key, 3600)
    pipe.execute()


def naive_consumer(dsn: str, redis_url: str, tx_entries: int, name: str = "c1") -> None:
    """Baselines 2 and 3: read the stream (100 entries at a time); per entry embed and
    INSERT; commit every ``tx_entries`` entries, then answer and acknowledge those.
    Several such processes (each its own ``name``) share the stream's consumer group."""
    client = _redis(redis_url)
    conn, embedder = _plain_writer(dsn)
    with contextlib.suppress(redis.ResponseError):  # the group exists already
        client.xgroup_create(NAIVE_STREAM, "naive", id="0", mkstream=True)
    while True:
        reply: Any = client.xreadgroup("naive", name, {NAIVE_STREAM: ">"}, count=100, block=1000)
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

    def pids(self) -> list[int]:
        """Its own processes (workers, consumers), for CPU accounting."""
        return [p.pid for p in self.processes]

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
        trace: Path | None = None,
    ) -> None:
        super().__init__(dsn, redis_url)
        self.name = f"engram ({workers} worker process{'es' if workers > 1 else ''})"
        self.workers = workers
        self.batch_size = batch_size
        self.env = env or {}  # more settings for the workers (ENGRAM_LLM_*, say)
        # With a directory: the workers note each cycle's stages there (``bench.stages``).
        self.trace = trace
        self.producer = Producer.from_url(redis_url)

    def start(self) -> None:
        from engram.store import Store

        Store.connect(self.dsn).close()  # migrate
        for i in range(self.workers):
            traced = [] if self.trace is None else ["-m", "bench.stages", str(self.trace / f"{i}")]
            self._spawn(
                [*(traced or ["-m", "engram"]), "--log-level", "WARNING", "worker"],
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
        from engram.worker.consuming.leases import Leases
        from engram.worker.defaults import PARTITIONS

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
    def __init__(self, dsn: str, redis_url: str, tx_entries: int, consumers: int) -> None:
        super().__init__(dsn, redis_url)
        self.tx_entries = tx_entries
        self.consumers = consumers
        self.name = (
            f"baseline {2 if tx_entries == 1 else 3}: naive consumer, "
            f"1 transaction per {'entry' if tx_entries == 1 else f'{tx_entries} entries'}"
            f" ({consumers} process{'es' if consumers > 1 else ''})"
        )
        self.client = redis.Redis.from_url(redis_url)

    def start(self) -> None:
        _plain_table(self.dsn)
        with contextlib.suppress(redis.ResponseError):  # one group for every consumer
            self.client.xgroup_create(NAIVE_STREAM, "naive", id="0", mkstream=True)
        for i in range(self.consumers):
            self._spawn(
                [
                    "-c",
                    "from bench.bench_worker import naive_consumer;"
                    f" naive_consumer({self.dsn!r}, {self.redis_url!r}, {self.tx_entries},"
                    f" 'c{i}')",
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
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("__keyevent@0__:rpush")
    while pubsub.get_message(timeout=0.1) is not None:
        pass  # the subscription is live once this returns
    conn.send("ready")
    prefix = f"{keys.PREFIX}:reply:".encode()  # then the scope's tag, ":", the id
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 900
    while len(seen) < expected and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message is None:
            continue
        now = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every process
        key: bytes = message["data"]
        if key.startswith(prefix):  # not another list (RQ's queue, say)
            seen.setdefault(key.removeprefix(prefix).decode().split(":", 1)[-1], now)
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
            # The embedded valkey wants its password (a URL of the form redis://default:PW@...).
            args=(
                {k: kwargs.get(k) for k in ("host", "port", "username", "password")},
                expected,
                child,
            ),
            daemon=True,
        )
        self._process.start()
        if not (self._conn.poll(120) and self._conn.recv() == "ready"):
            raise RuntimeError("the collector process did not start")
        self.expected = expected
        self.sent: dict[str, float] = {}
        self.enqueued: dict[str, float] = {}  # when the enqueue returned (paced runs)
        self.seen: dict[str, float] = {}

    def wait(self, timeout: float) -> bool:
        """Whether every answer came; ``seen`` holds those that did."""
        if self._conn.poll(timeout):
            self.seen = self._conn.recv()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
        return len(self.seen) == self.expected

    def result(
        self, start: float, cpu: CpuShares | None = None, cpu_seconds: float = 0.0
    ) -> Result:
        latencies = {op_id: (self.seen[op_id] - at) * 1000 for op_id, at in self.sent.items()}
        return Result(
            len(self.sent),
            max(self.seen.values()) - start,
            percentile(list(latencies.values()), 50),
            percentile(list(latencies.values()), 99),
            cpu,
            cpu_seconds,
            latencies,
            {op_id: at - start for op_id, at in self.sent.items()},
            {op_id: at - start for op_id, at in self.seen.items()},
            start,
            dict(self.enqueued),
            dict(self.seen),
        )


@dataclass
class Result:
    ops: int
    seconds: float
    p50_ms: float
    p99_ms: float
    # How the machine's CPU time was used meanwhile (None: not on Linux).
    cpu: CpuShares | None = None
    # CPU time of the system's processes meanwhile: its workers (or consumers), the
    # whole PostgreSQL server and valkey; not the benchmark's producers or collector.
    cpu_seconds: float = 0.0
    # Per operation id: its latency, and when it was sent and answered (s after the start).
    latencies_ms: dict[str, float] = field(default_factory=dict)
    sent_s: dict[str, float] = field(default_factory=dict)
    answered_s: dict[str, float] = field(default_factory=dict)
    # The clock readings themselves (``time.perf_counter``, the same clock in every
    # process): the run's start, and per operation id when its enqueue returned (paced
    # runs) and when its answer appeared, for ``stage_breakdown``.
    start: float = 0.0
    enqueued_at: dict[str, float] = field(default_factory=dict)
    answered_at: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.ops / self.seconds

    @property
    def cpu_ms_per_op(self) -> float:
        return self.cpu_seconds * 1000 / self.ops


def drive(
    system: System,
    client: redis.Redis,
    load: list[tuple[str, dict[str, str], str]],
    rate: float | None,
    servers: list[int],
) -> Result:
    """Enqueue ``load`` (in bulk, or one by one at ``rate``/s); wait for every answer.
    CPU is counted for the system's processes and the ``servers`` (PostgreSQL, valkey)."""
    collector = Collector(client, len(load))
    cpu = MachineCpu()
    tree = TreeCpu([*system.pids(), *servers])
    start = time.perf_counter()
    if rate is None:
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
                collector.enqueued[op_id] = time.perf_counter()
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
    return collector.result(start, cpu.shares(), tree.seconds())


def make_load(tag: str, n: int, texts: list[str]) -> list[tuple[str, dict[str, str], str]]:
    return [
        (f"{tag}:{i}", {"user_id": f"user-{i % SCOPES}"}, texts[i % len(texts)] + f" {tag}")
        for i in range(n)
    ]


@dataclass(frozen=True)
class Setup:
    tag: str
    name: str
    make: Callable[[], System]
    n_max: int  # operations of its maximum-rate run


def run_max(
    setup: Setup, client: redis.Redis, servers: list[int], texts: list[str], tag: str
) -> Result:
    """The sustained maximum: the load enqueued in bulk while the consumers run."""
    client.flushall()
    system = setup.make()
    system.start()
    try:
        drive(system, client, make_load(f"{tag}-warm", min(500, setup.n_max), texts), None, [])
        full = drive(system, client, make_load(f"{tag}-max", setup.n_max, texts), None, servers)
    finally:
        system.stop()
    print(
        f"  {system.name}: {full.rate:,.0f} ops/s over {full.seconds:.1f} s;"
        f" p50/p99 {full.p50_ms:.0f}/{full.p99_ms:.0f} ms; {full.cpu_ms_per_op:.2f} ms CPU/op"
        f" (CPU busy {_busy(full)}, stolen {_stolen(full)})",
        file=sys.stderr,
        flush=True,
    )
    return full


def run_paced(
    setup: Setup,
    client: redis.Redis,
    servers: list[int],
    rates: list[float],
    seconds: float,
    texts: list[str],
    tag: str,
) -> list[Result]:
    """One operation at a time at each rate, one system start for all of them."""
    client.flushall()
    system = setup.make()
    system.start()
    results = []
    try:
        drive(system, client, make_load(f"{tag}-warm", 500, texts), None, [])
        system.settle()
        for i, rate in enumerate(rates):
            load = make_load(f"{tag}-{i}", max(int(rate * seconds), 50), texts)
            result = drive(system, client, load, rate, servers)
            results.append(result)
            print(
                f"  {system.name} at {rate:,.0f}/s: p50/p99 {result.p50_ms:.1f}/"
                f"{result.p99_ms:.1f} ms; {result.cpu_ms_per_op:.2f} ms CPU/op"
                f" (CPU busy {_busy(result)}, stolen {_stolen(result)})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        system.stop()
    return results


# The stages of an operation's life, in order, as ``stage_breakdown`` names them.
STAGES = (
    ("enqueue", "the producer's enqueue (XADD, valkey's fsync)"),
    ("busy", "waiting for the consumer to finish the cycle in hand"),
    ("checks", "the cycle's checks before its read (leases, pauses, strays)"),
    ("wake", "the XREADGROUP: sent (or blocked) until it returned the entry"),
    ("triage", "triage and the model phase's bookkeeping"),
    ("embed", "embedding"),
    ("execute", "store.execute besides the two below (pool, replay look-up, results)"),
    ("tx", "the transaction: fence, locks, reads, writes, COMMIT (WAL fsync)"),
    ("answers", "outcomes and answers built"),
    ("to_reply", "until the pipeline with the reply is sent (the next cycle's read)"),
    ("reply", "reply sent until the collector saw it"),
)


def stage_breakdown(result: Result, cycles: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per stage, its length (ms) for each operation of ``result`` found in ``cycles``
    (``bench.stages``); also ``total`` and the cycle's ``ops`` (its operation count)."""
    by_op = {op_id: c for c in cycles if "replied" in c for op_id in c["ops"]}
    out: dict[str, list[float]] = {name: [] for name, _ in STAGES}
    out["total"], out["ops"] = [], []
    for op_id, sent_s in result.sent_s.items():
        c = by_op.get(op_id)
        if c is None or "sent" not in c or op_id not in result.answered_at:
            continue
        sent = result.start + sent_s
        enqueued = result.enqueued_at[op_id]
        # Enqueued before the cycle that read it began: it waited for the one before.
        began = max(enqueued, c["start"])
        execute = c.get("execute_ms", 0.0) - c.get("embed_ms", 0.0) - c.get("tx_ms", 0.0)
        parts = {
            "enqueue": enqueued - sent,
            "busy": max(0.0, c["start"] - enqueued),
            "checks": max(0.0, c["sent"] - began),
            "wake": c["back"] - max(enqueued, c["sent"]),
            "triage": c["commit"] - c["back"],
            "embed": c.get("embed_ms", 0.0) / 1000,
            "execute": execute / 1000,
            "tx": c.get("tx_ms", 0.0) / 1000,
            "answers": c["end"]
            - c["committed"]
            + (c["committed"] - c["commit"] - c.get("execute_ms", 0.0) / 1000),
            "to_reply": c["replied"] - c["end"],
            "reply": result.answered_at[op_id] - c["replied"],
        }
        for name, seconds in parts.items():
            out[name].append(seconds * 1000)
        out["total"].append((result.answered_at[op_id] - sent) * 1000)
        out["ops"].append(float(len(c["ops"])))
    return out


def run_stages(
    setup: Setup,
    client: redis.Redis,
    rates: list[float],
    seconds: float,
    texts: list[str],
    trace: Path,
) -> list[tuple[float, Result, dict[str, list[float]], float]]:
    """engram paced at each rate with its workers noting their stages: per rate, the
    result and its breakdown. Its CPU figures are not reported (the notes cost some)."""
    results = []
    for i, rate in enumerate(rates):
        client.flushall()
        shutil.rmtree(trace, ignore_errors=True)
        trace.mkdir(parents=True)
        system = setup.make()
        assert isinstance(system, Engram)
        system.trace = trace
        system.start()
        try:
            drive(system, client, make_load(f"st{i}-warm", 500, texts), None, [])
            system.settle()
            load = make_load(f"st{i}", max(int(rate * seconds), 50), texts)
            machine = os.getloadavg()[0]
            result = drive(system, client, load, rate, [])
        finally:
            system.stop()
        cycles = stages_of(sorted(trace.iterdir()))
        results.append((rate, result, stage_breakdown(result, cycles), machine))
    return results


def stages_of(paths: list[Path]) -> list[dict[str, Any]]:
    from bench.stages import read_cycles

    return read_cycles(paths)


def commit_floor(dsn: str, n: int = 300) -> tuple[float, float]:
    """The p50 and p99 (ms) of the smallest durable commit on this server (one row's
    INSERT and COMMIT, synchronous_commit on): what any receipt costs at least."""
    times = []
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (n int)")
        conn.commit()
        for i in range(n):
            t = time.perf_counter()
            conn.execute("INSERT INTO bench_floor VALUES (%s)", (i,))
            conn.commit()
            times.append((time.perf_counter() - t) * 1000)
    return percentile(times, 50), percentile(times, 99)


def transaction_costs(
    postgres: EmbeddedPostgres, texts: list[str], n: int = 400
) -> list[tuple[str, float, float, float]]:
    """What one transaction costs, outside the streams, one after another on one
    connection: engram's ``store.execute`` of 1 and of 8 ``remember`` operations, and the
    naive consumer's transaction (embed, INSERT, COMMIT) of 1. Per operation: p50 of
    the wall time per transaction (ms), the caller's CPU (ms, this thread) and the
    PostgreSQL server's (ms, every process)."""
    from pgvector.psycopg import register_vector

    from engram.store import Store, WordLlamaEmbedder, WriteOptions
    from engram.store.values import Fence

    embedder = WordLlamaEmbedder()
    embedder.embed(["warm"])
    store = Store.connect(fresh_database(postgres, "b_tx"))
    conn = psycopg.connect(fresh_database(postgres, "b_tx_naive"))
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    conn.execute(PLAIN_TABLE)
    conn.commit()
    register_vector(conn)
    fence = WriteOptions(fences=(Fence("bench:tx", 1),), check_replays=False)

    def engram(tag: str, per: int) -> Callable[[int], None]:
        def one(i: int) -> None:
            ops = [
                Operation.build(
                    "remember",
                    {"user_id": f"user-{(i * per + j) % SCOPES}"},
                    {"text": f"{texts[(i * per + j) % len(texts)]} {tag}"},
                    f"{tag}:{i}:{j}",
                )
                for j in range(per)
            ]
            store.execute(ops, embedder, options=fence)

        return one

    def naive(tag: str) -> Callable[[int], None]:
        def one(i: int) -> None:
            with conn.transaction():
                text = f"{texts[i % len(texts)]} {tag}"
                vector = embedder.embed([text])[0]
                conn.execute(
                    "INSERT INTO plain_memories VALUES (%s, %s, %s, %s)",
                    (f"{tag}:{i}", "s", text, vector),
                )

        return one

    rows = []
    try:
        for name, per, make in (
            ("engram, 1 operation per transaction", 1, lambda t: engram(t, 1)),
            ("engram, 8 operations per transaction", 8, lambda t: engram(t, 8)),
            ("naive, 1 operation per transaction", 1, naive),
        ):
            count = n // per
            warm = make(f"{per}{name[0]}w")
            for i in range(min(count, 50)):
                warm(i)
            run = make(f"{per}{name[0]}")
            tree = TreeCpu([postgres.pid] if postgres.pid else [])
            cpu = time.thread_time()
            walls = []
            for i in range(count):
                t = time.perf_counter()
                run(i)
                walls.append((time.perf_counter() - t) * 1000)
            ops = count * per
            rows.append(
                (
                    name,
                    percentile(walls, 50) / per,
                    (time.thread_time() - cpu) * 1000 / ops,
                    tree.seconds() * 1000 / ops,
                )
            )
    finally:
        conn.close()
        store.close()
    return rows


@dataclass
class Medians:
    """The median of each figure over a system's runs at one load."""

    rate: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_op: float
    busy: float | None
    stolen: float | None

    @classmethod
    def of(cls, runs: list[Result]) -> Medians:
        shares = [r.cpu for r in runs if r.cpu is not None]
        return cls(
            median([r.rate for r in runs]),
            median([r.p50_ms for r in runs]),
            median([r.p99_ms for r in runs]),
            median([r.cpu_ms_per_op for r in runs]),
            median([c.busy for c in shares]) if shares else None,
            median([c.stolen for c in shares]) if shares else None,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ops",
        type=int,
        default=50_000,
        help="engram's maximum-rate run (the baselines' are scaled to last about as long)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="engram worker processes, and consumer processes of baselines 2 and 3",
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--paced-seconds", type=float, default=8.0, help="length of each paced run")
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
        help="runs of every system (interleaved); medians are reported (0, with --max-rate:"
        " only the runs of --stages)",
    )
    parser.add_argument(
        "--loads",
        default="0.1,0.25,0.5",
        help="fractions of baseline 3's median maximum at which engram and baseline 3 are"
        " paced side by side",
    )
    parser.add_argument(
        "--linger-ms",
        type=int,
        default=0,
        help="also pace engram with ENGRAM_LINGER_MS at this value, at the same loads (0: skip)",
    )
    parser.add_argument(
        "--low",
        type=float,
        default=0.1,
        help="fraction of engram's median maximum at which its CPU per operation is"
        " compared with that at its maximum",
    )
    parser.add_argument(
        "--stages",
        default="0.1,0.25",
        help="fractions of baseline 3's median maximum at which engram runs once more with"
        " its workers noting each operation's stages (bench.stages); empty: skip",
    )
    parser.add_argument(
        "--max-rate",
        type=float,
        default=0,
        help="skip the maximum-rate runs and take this as every system's maximum (ops/s):"
        " for quick paced comparisons",
    )
    parser.add_argument(
        "--tx-costs",
        action="store_true",
        help="only measure what one transaction costs (engram's of 1 and 8 operations, the"
        " naive consumer's of 1), outside the streams, and exit",
    )
    args = parser.parse_args()
    if args.tx_costs:
        _tx_costs_only()
        return

    home = Path(tempfile.mkdtemp(prefix="engram-bench-"))
    postgres = EmbeddedPostgres(home)
    valkey = EmbeddedValkey(home, appendfsync=args.appendfsync).start()
    client = redis.Redis.from_url(valkey.url)
    servers = [pid for pid in (postgres.pid, valkey.pid) if pid]
    try:
        with psycopg.connect(postgres.dsn()) as conn:
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("fsync", "synchronous_commit")
            }
        assert settings == {"fsync": "on", "synchronous_commit": "on"}, settings
        texts = sentences(20_000)
        procs = f"{args.workers} process{'es' if args.workers > 1 else ''}"
        engram = Setup(
            "engram",
            f"engram ({procs}, 16 partitions)",
            lambda: Engram(
                fresh_database(postgres, "b_engram"), valkey.url, args.workers, args.batch_size
            ),
            args.ops,
        )
        setups = [
            engram,
            Setup(
                "rq",
                Rq.name,
                lambda: Rq(fresh_database(postgres, "b_rq"), valkey.url),
                max(args.ops // 20, 500),
            ),
            Setup(
                "naive1",
                f"baseline 2: naive consumer, 1 transaction per entry ({procs})",
                lambda: Naive(fresh_database(postgres, "b_naive1"), valkey.url, 1, args.workers),
                max(args.ops // 4, 2000),
            ),
            Setup(
                "naive100",
                f"baseline 3: naive consumer, 1 transaction per 100 entries ({procs})",
                lambda: Naive(
                    fresh_database(postgres, "b_naive100"), valkey.url, 100, args.workers
                ),
                args.ops,  # with two processes it can be as fast as engram: as long a run
            ),
        ]
        maxima: list[list[Result]] = [[] for _ in setups]
        for r in range(args.repeat if not args.max_rate else 0):  # interleaved: a noisy
            for i, setup in enumerate(setups):  # minute hits everyone
                maxima[i].append(run_max(setup, client, servers, texts, f"{setup.tag}{r}"))
        at_max = [
            Medians.of(runs) if runs else Medians(args.max_rate, 0, 0, 0, None, None)
            for runs in maxima
        ]
        batching = setups[3]
        loads = [at_max[3].rate * float(f) for f in args.loads.split(",") if f]
        low = at_max[0].rate * args.low
        lingering = Setup(
            "linger",
            f"engram, ENGRAM_LINGER_MS={args.linger_ms}",
            lambda: Engram(
                fresh_database(postgres, "b_engram"),
                valkey.url,
                args.workers,
                args.batch_size,
                {"ENGRAM_LINGER_MS": str(args.linger_ms)},
            ),
            args.ops,
        )
        engram_paced: list[list[Result]] = []
        batching_paced: list[list[Result]] = []
        lingering_paced: list[list[Result]] = []
        loads_avg: list[tuple[float, float, float]] = []
        for r in range(args.repeat):  # engram, baseline, engram, baseline, ...
            loads_avg.append(os.getloadavg())
            engram_paced.append(
                run_paced(
                    engram, client, servers, [*loads, low], args.paced_seconds, texts, f"pe{r}"
                )
            )
            batching_paced.append(
                run_paced(batching, client, servers, loads, args.paced_seconds, texts, f"pb{r}")
            )
            if args.linger_ms:
                lingering_paced.append(
                    run_paced(
                        lingering,
                        client,
                        servers,
                        [*loads, low],
                        args.paced_seconds,
                        texts,
                        f"pl{r}",
                    )
                )
        floor = commit_floor(fresh_database(postgres, "b_floor"))
        staged = run_stages(
            engram,
            client,
            [at_max[3].rate * float(f) for f in args.stages.split(",") if f],
            args.paced_seconds,
            texts,
            home / "stages",
        )
    finally:
        client.close()
        valkey.stop()
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)  # a run leaves gigabytes
    if maxima[0]:
        _report(args, [s.name for s in setups], at_max)
    if loads_avg:
        print(
            "\nThe machine's load average (1, 5, 15 min) as each round of paced runs began: "
            + "; ".join(" / ".join(f"{x:.1f}" for x in avg) for avg in loads_avg)
            + "."
        )
    if engram_paced:
        _report_same_load("engram", loads, at_max[3].rate, engram_paced, batching_paced)
    if maxima[0] and engram_paced:
        _report_low("engram", low, at_max[0], [runs[len(loads)] for runs in engram_paced])
    if lingering_paced:
        _report_same_load(lingering.name, loads, at_max[3].rate, lingering_paced, batching_paced)
        if maxima[0]:
            _report_low(
                lingering.name, low, at_max[0], [runs[len(loads)] for runs in lingering_paced]
            )
    if staged:
        _report_stages(staged, at_max[3].rate, floor)


def _tx_costs_only() -> None:
    home = Path(tempfile.mkdtemp(prefix="engram-bench-"))
    postgres = EmbeddedPostgres(home)
    try:
        rows = transaction_costs(postgres, sentences(20_000))
        floor = commit_floor(fresh_database(postgres, "b_floor"))
    finally:
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)
    print(f"\n### One transaction, outside the streams (load average {os.getloadavg()[0]:.1f})\n")
    print("| transaction | wall p50 ms per op | caller CPU ms/op | PostgreSQL CPU ms/op |")
    print("|---|---:|---:|---:|")
    for name, wall, cpu, server in rows:
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {server:.2f} |")
    print(f"\nThe smallest durable commit: p50 {floor[0]:.2f} ms, p99 {floor[1]:.2f} ms.")


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def _report(args: argparse.Namespace, names: list[str], at_max: list[Medians]) -> None:
    print(
        f"\n## Stream benchmark ({os.cpu_count()} CPUs; PostgreSQL fsync and "
        f"synchronous_commit on; valkey appendfsync {args.appendfsync}; "
        f"medians of {args.repeat} interleaved runs)\n"
    )
    print(
        "CPU/op: CPU time of the system's own processes (engram's workers, or the"
        " baseline's consumers), the whole PostgreSQL server (every backend and"
        " background process) and valkey, per operation; the benchmark's producers and"
        " collector are not counted. CPU busy: the whole machine, producers included.\n"
    )
    print("| system | ops/s (max) | p50 / p99 ms at max | CPU ms/op | CPU busy | CPU stolen |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, m in zip(names, at_max, strict=True):
        print(
            f"| {name} | {m.rate:,.0f} | {m.p50_ms:,.0f} / {m.p99_ms:,.0f} |"
            f" {m.cpu_ms_per_op:.2f} | {_share(m.busy)} | {_share(m.stolen)} |"
        )
    engram = at_max[0].rate
    print("\n| engram's maximum vs | ratio | target |\n|---|---:|---|")
    for name, m in zip(names[1:], at_max[1:], strict=True):
        ratio = engram / m.rate
        target = f">= 1.5x: {_met(ratio >= 1.5)}" if name.startswith("baseline 3") else ""
        print(f"| {name} | {ratio:.2f}x | {target} |")


def _report_same_load(
    name: str,
    loads: list[float],
    batching_max: float,
    engram_runs: list[list[Result]],
    batching_runs: list[list[Result]],
) -> None:
    print(
        "\n### At the same offered load, paced one operation at a time"
        f" ({name} against baseline 3)\n"
    )
    print(
        "| load | engram p50 / p99 ms | baseline 3 p50 / p99 ms | engram CPU ms/op |"
        " baseline 3 CPU ms/op | CPU busy (engram / baseline 3) | p99 target | CPU target |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for i, rate in enumerate(loads):
        e = Medians.of([runs[i] for runs in engram_runs])
        b = Medians.of([runs[i] for runs in batching_runs])
        print(
            f"| {rate:,.0f} ops/s ({rate / batching_max:.0%} of baseline 3's max) |"
            f" {e.p50_ms:,.1f} / {e.p99_ms:,.1f} | {b.p50_ms:,.1f} / {b.p99_ms:,.1f} |"
            f" {e.cpu_ms_per_op:.2f} | {b.cpu_ms_per_op:.2f} |"
            f" {_share(e.busy)} / {_share(b.busy)} |"
            f" engram p99 <= baseline's: {_met(e.p99_ms <= b.p99_ms)} |"
            f" engram CPU/op <= baseline's: {_met(e.cpu_ms_per_op <= b.cpu_ms_per_op)} |"
        )


def _report_low(name: str, low: float, at_max: Medians, runs: list[Result]) -> None:
    m = Medians.of(runs)
    ratio = m.cpu_ms_per_op / at_max.cpu_ms_per_op
    print(
        f"\n{name}: CPU per operation at {low:,.0f} ops/s ({low / at_max.rate:.0%} of engram's"
        f" maximum): {m.cpu_ms_per_op:.2f} ms, against {at_max.cpu_ms_per_op:.2f} ms at engram's"
        " maximum:"
        f" {ratio:.1f}x (target <= 2x: {_met(ratio <= 2)}); p50 / p99 there"
        f" {m.p50_ms:.1f} / {m.p99_ms:.1f} ms, CPU busy {_share(m.busy)}."
    )


def _report_stages(
    staged: list[tuple[float, Result, dict[str, list[float]], float]],
    batching_max: float,
    floor: tuple[float, float],
) -> None:
    print(
        "\n### Where an operation's time goes (engram, paced; its workers noting their"
        " stages: bench.stages)\n"
    )
    heads = " | ".join(
        f"{rate:,.0f} ops/s ({rate / batching_max:.0%}; load average {machine:.1f}):"
        " p50 / mean / p99"
        for rate, _, _, machine in staged
    )
    print(f"| stage, ms | {heads} |\n|---|{'---:|' * len(staged)}")
    for name, what in [*STAGES, ("total", "sent until the collector saw the answer")]:
        cells = []
        for _, _, parts, _ in staged:
            v = parts[name]
            mean = sum(v) / len(v) if v else 0.0
            cells.append(f"{percentile(v, 50):.2f} / {mean:.2f} / {percentile(v, 99):.2f}")
        print(f"| {name}: {what} | {' | '.join(cells)} |")
    ops = [sum(parts["ops"]) / max(len(parts["ops"]), 1) for _, _, parts, _ in staged]
    print(
        "| operations per cycle (mean, per operation) | "
        + " | ".join(f"{x:.1f}" for x in ops)
        + " |"
    )
    print(
        f"\nThe smallest durable commit on this PostgreSQL (one row, synchronous_commit on):"
        f" p50 {floor[0]:.2f} ms, p99 {floor[1]:.2f} ms."
    )


def _busy(result: Result) -> str:
    return "?" if result.cpu is None else f"{result.cpu.busy:.0%}"


def _stolen(result: Result) -> str:
    return "?" if result.cpu is None else f"{result.cpu.stolen:.0%}"


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


if __name__ == "__main__":
    main()
