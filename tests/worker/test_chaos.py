"""Workers as real processes, under failure: several at once, killed, paused, and
PostgreSQL or valkey restarted under load. Marked slow; they still run in CI."""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engram.store import Store
from engram.store.server import EmbeddedPostgres
from engram.worker import Pending, Producer, QueueUnavailableError, keys
from engram.worker.consuming.membership import live_workers
from engram.worker.embedded.valkey import EmbeddedValkey
from engram.worker.settings import WorkerConfig
from tests.redis_fixtures import FAST, WorkerProcess, not_acknowledged, wait_until

pytestmark = pytest.mark.slow

StartProcess = Callable[..., WorkerProcess]
SLOW_EMBEDDER = "tests.redis_fixtures:SlowEmbedder"


@pytest.fixture
def db(fresh_dsn: str) -> Iterator[Store]:
    """A database of the test's own, migrated (workers start with migrate=False)."""
    with Store.connect(fresh_dsn) as store:
        yield store


def _entry_key(p: Pending) -> tuple[int, int]:
    ms, seq = p.entry_id.split("-")
    return int(ms), int(seq)


def receipt_counts(dsn: str) -> Counter[str]:
    with psycopg.connect(dsn) as conn:
        return Counter(r[0] for r in conn.execute("SELECT operation_id FROM engram_receipts"))


def assert_applied_once(
    store: Store, dsn: str, acknowledged: list[Pending], maybe: list[str] = ()
) -> None:  # type: ignore[assignment]
    """Every acknowledged enqueue has exactly one receipt; nothing else was applied
    except, at most once, an enqueue whose outcome its producer could not know."""
    counts = receipt_counts(dsn)
    assert all(counts[p.operation_id] == 1 for p in acknowledged), "an operation is missing"
    assert set(counts) <= {p.operation_id for p in acknowledged} | set(maybe)
    assert max(counts.values(), default=1) == 1
    with psycopg.connect(dsn) as conn:
        # No scope moved on without a receipt, nor took one twice.
        rows = conn.execute(
            "SELECT s.revision, count(c.operation_id) FROM engram_scopes s"
            " LEFT JOIN engram_receipts c ON c.scope_id = s.id GROUP BY s.id, s.revision"
        ).fetchall()
    assert all(revision == n for revision, n in rows)


def test_four_workers_keep_every_scope_in_enqueue_order(
    db: Store, fresh_dsn: str, redis_url: str, worker_processes: StartProcess
) -> None:
    config = WorkerConfig(
        partitions=8, batch_size=32, block_ms=100, lease_ttl_ms=1000, lease_margin_ms=200
    )
    scopes = [{"user_id": f"order-{i}"} for i in range(40)]
    sent: dict[str, list[Pending]] = defaultdict(list)
    texts: dict[str, str] = {}
    lock = threading.Lock()
    setup = Producer.from_url(redis_url, partitions=config.partitions)
    for i, s in enumerate(scopes):
        sent[s["user_id"]].append(setup.remember(s, "v-start", id=f"mem_order_{i}"))
    workers = [
        worker_processes(database_url=fresh_dsn, redis_url=redis_url, config=config)
        for _ in range(2)
    ]

    def produce(n: int) -> None:
        producer = Producer.from_url(redis_url, partitions=config.partitions)
        rng = random.Random(n)
        for j in range(150):
            i = rng.randrange(len(scopes))
            p = producer.revise(scopes[i], f"mem_order_{i}", text=f"p{n}-{j}")
            with lock:
                sent[scopes[i]["user_id"]].append(p)
                texts[p.operation_id] = f"p{n}-{j}"
            time.sleep(rng.random() * 0.01)

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in producers:
        t.start()
    time.sleep(0.5)  # two more workers join under load: partitions move while busy
    workers += [
        worker_processes(database_url=fresh_dsn, redis_url=redis_url, config=config)
        for _ in range(2)
    ]
    for t in producers:
        t.join()
    for pendings in sent.values():
        for p in pendings:
            p.wait(30)
    wait_until(
        lambda: len(live_workers(setup.client, config.lease_ttl_ms)) == 4, what="four live workers"
    )
    for i, s in enumerate(scopes):
        # Entries of one scope share a stream: their ids are the order of enqueue.
        expected = sorted(sent[s["user_id"]], key=_entry_key)
        receipts = sorted(db.receipts(scope=s, limit=1000), key=lambda r: r.scope_revision)
        assert [r.operation_id for r in receipts] == [p.operation_id for p in expected]
        history = [rev.text for rev in db.history(s, f"mem_order_{i}")]
        assert history == ["v-start"] + [texts[p.operation_id] for p in expected[1:]]
    assert_applied_once(db, fresh_dsn, [p for ps in sent.values() for p in ps])
    assert all(w.process.poll() is None for w in workers)


def test_a_worker_killed_mid_batch_loses_nothing_and_doubles_nothing(
    db: Store, fresh_dsn: str, redis_url: str, worker_processes: StartProcess, tmp_path: Path
) -> None:
    mark = tmp_path / "embedding"
    victim = worker_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        embedder=SLOW_EMBEDDER,
        env={"ENGRAM_TEST_EMBED_DELAY_S": "0.4", "ENGRAM_TEST_EMBED_MARK": str(mark)},
    )
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    sent = [producer.remember({"user_id": f"kill-{i % 20}"}, f"fact {i}") for i in range(300)]
    # Kill it while it holds a batch it has not committed (it is embedding one).
    wait_until(
        lambda: mark.exists() and len(mark.read_text().splitlines()) >= 3,
        timeout=30,
        what="the victim to be busy",
    )
    victim.signal(signal.SIGKILL)
    victim.process.wait()
    client = producer.client
    pending = sum(not_acknowledged(client, p) for p in range(FAST.partitions))
    assert pending > 0, "the victim held no batch when it died"
    worker_processes(database_url=fresh_dsn, redis_url=redis_url)
    receipts = [p.wait(30) for p in sent]
    assert {r.operation_id for r in receipts} == {p.operation_id for p in sent}
    assert_applied_once(db, fresh_dsn, sent)
    assert sum(not_acknowledged(client, p) for p in range(FAST.partitions)) == 0
    assert client.xlen(keys.DEAD_LETTERS) == 0


def test_a_paused_worker_commits_nothing_for_the_partition_it_lost(
    db: Store, fresh_dsn: str, redis_url: str, worker_processes: StartProcess, tmp_path: Path
) -> None:
    mark = tmp_path / "embedding"
    paused = worker_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        embedder=SLOW_EMBEDDER,
        env={"ENGRAM_TEST_EMBED_DELAY_S": "2.0", "ENGRAM_TEST_EMBED_MARK": str(mark)},
    )
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    client = producer.client
    [info] = wait_until(lambda: live_workers(client, FAST.lease_ttl_ms), what="the worker")
    paused_id = info["id"]
    scope = {"user_id": "paused"}
    first = producer.remember(scope, "written during the pause", id="mem_paused")
    wait_until(mark.exists, what="the worker to hold the batch")
    paused.signal(signal.SIGSTOP)  # mid-batch, and for longer than its lease
    try:
        worker_processes(database_url=fresh_dsn, redis_url=redis_url)
        receipt = first.wait(20)
        assert receipt.replayed is False and receipt.scope_revision == 1
        later = [producer.revise(scope, "mem_paused", text=f"v{i}") for i in range(4)]
        assert [p.wait(10).scope_revision for p in later] == [2, 3, 4, 5]
    finally:
        paused.signal(signal.SIGCONT)
    # It wakes up inside its commit: the store refuses it (fenced), it stops there.
    wait_until(
        lambda: client.hget(keys.worker(paused_id), "fenced") is not None,
        timeout=20,
        what="the resumed worker to be fenced",
    )
    time.sleep(1.0)
    stats = client.hgetall(keys.worker(paused_id))
    assert int(stats.get(b"committed", 0)) == 0
    receipts = sorted(db.receipts(scope=scope), key=lambda r: r.scope_revision)
    assert [r.operation_id for r in receipts] == [first.operation_id] + [
        p.operation_id for p in later
    ]
    assert [h.text for h in db.history(scope, "mem_paused")] == [
        "written during the pause",
        "v0",
        "v1",
        "v2",
        "v3",
    ]
    assert paused.process.poll() is None  # alive, and back to work on its new share


def _produce_until(
    stop: threading.Event,
    producer: Producer,
    acknowledged: list[Pending],
    failed: list[str],
    errors: list[BaseException],
    tag: str,
) -> None:
    i = 0
    while not stop.is_set():
        op_id = f"{tag}:{i}"
        try:
            acknowledged.append(
                producer.remember({"user_id": f"{tag}-{i % 10}"}, f"fact {i}", operation_id=op_id)
            )
        except QueueUnavailableError as exc:
            failed.append(op_id)
            errors.append(exc)
            time.sleep(0.05)
        i += 1
        time.sleep(0.003)


def _run_load(
    redis_url: str, outage: Callable[[], None], retry: Retry | None = None
) -> tuple[list[Pending], list[str], list[BaseException]]:
    stop = threading.Event()
    acknowledged: list[Pending] = []
    failed: list[str] = []
    errors: list[BaseException] = []
    kwargs = {"retry": retry} if retry is not None else {}
    threads = [
        threading.Thread(
            target=_produce_until,
            args=(
                stop,
                Producer.from_url(redis_url, partitions=FAST.partitions, **kwargs),
                acknowledged,
                failed,
                errors,
                f"load{n}",
            ),
        )
        for n in range(2)
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        outage()
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    return acknowledged, failed, errors


def test_postgres_restarted_under_load(
    redis_url: str, worker_processes: StartProcess, tmp_path: Path
) -> None:
    server = EmbeddedPostgres(tmp_path / "pg")  # its own server: the shared one stays up
    try:
        dsn = server.dsn()
        with Store.connect(dsn) as store:
            workers = [worker_processes(database_url=dsn, redis_url=redis_url) for _ in range(2)]

            def restart() -> None:
                nonlocal server
                server.stop()
                time.sleep(1.5)
                server = EmbeddedPostgres(tmp_path / "pg")

            acknowledged, failed, _ = _run_load(redis_url, restart)
            assert not failed  # Redis was up: every enqueue was acknowledged
            for p in acknowledged:
                p.wait(60)
            assert_applied_once(store, dsn, acknowledged)
            assert all(w.process.poll() is None for w in workers)
            assert any("database unavailable" in w.log() for w in workers)
    finally:
        server.stop()


def test_valkey_restarted_under_load(
    db: Store, fresh_dsn: str, worker_processes: StartProcess, tmp_path: Path
) -> None:
    valkey = EmbeddedValkey(tmp_path / "vk").start()  # appendonly yes, appendfsync always
    port = valkey.port
    try:
        workers = [worker_processes(database_url=fresh_dsn, redis_url=valkey.url) for _ in range(2)]
        wait_until(
            lambda: len(live_workers(redis.Redis.from_url(valkey.url), FAST.lease_ttl_ms)) == 2,
            what="two live workers",
        )

        def crash_and_restart() -> None:
            nonlocal valkey
            valkey.kill()  # SIGKILL: what survives is what the append-only file holds
            time.sleep(1.0)
            valkey = EmbeddedValkey(tmp_path / "vk", port=port).start()

        acknowledged, failed, errors = _run_load(
            valkey.url, crash_and_restart, retry=Retry(NoBackoff(), 0)
        )
        assert failed, "no enqueue met the outage"
        assert all("retry with the same operation id" in str(e) for e in errors)
        for p in acknowledged:
            p.wait(60)
        assert_applied_once(db, fresh_dsn, acknowledged, maybe=failed)
        assert all(w.process.poll() is None for w in workers)
    finally:
        valkey.stop()
