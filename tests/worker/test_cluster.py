"""engram on a real valkey cluster (3 masters, 1 replica each: ``cluster_fixtures``):
the URL forms, every operation kind on every partition through Producer, Worker and
store, the per-scope order with workers killed, and the CLI."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from engram.cli import main
from engram.store import HashingEmbedder, Operation, Store
from engram.store.errors import ConfigError
from engram.worker import Pending, Producer, QueueUnavailableError, StreamReceipt, keys
from engram.worker.admin import deadletters
from engram.worker.consuming.membership import live_workers
from engram.worker.consuming.reads import FIRST_BLOCK_MS, ClusterReads
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from engram.worker.producer import NotReplicatedError
from engram.worker.protocol import partition_of
from engram.worker.settings import WorkerConfig
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.cluster_fixtures import ValkeyCluster
from tests.redis_fixtures import InProcessWorker, WorkerProcess, wait_until
from tests.worker.test_chaos import assert_applied_once

# Enough partitions that every master serves some.
CONFIG = WorkerConfig(
    partitions=8, batch_size=64, block_ms=100, lease_ttl_ms=1000, lease_margin_ms=200
)


@pytest.fixture
def cluster_client(cluster_url: str) -> Iterator[redis.Redis]:
    client = connect_redis(cluster_url)
    yield client
    client.close()


@pytest.fixture
def producer(cluster_url: str) -> Iterator[Producer]:
    with Producer.from_url(cluster_url, partitions=CONFIG.partitions) as p:
        yield p


def cluster_worker(url: str, store: Store, worker_id: str | None = None) -> InProcessWorker:
    return InProcessWorker(
        Worker(connect_redis(url), store, HashingEmbedder(64), config=CONFIG, worker_id=worker_id)
    )


def scope_on(partition: int, tag: str) -> dict[str, str]:
    """A scope whose operations go to ``partition``."""
    for i in range(10_000):
        scope = {"user_id": f"{tag}-{i}"}
        if partition_of(scope, CONFIG.partitions) == partition:
            return scope
    raise AssertionError(f"no scope for partition {partition}")


# -- the URL ---------------------------------------------------------------------------


def test_any_node_or_several_seeds_name_the_cluster(
    valkey_cluster: ValkeyCluster, cluster_url: str, redis_url: str
) -> None:
    for url in [cluster_url, valkey_cluster.node_url(valkey_cluster.nodes[-1])]:
        client = connect_redis(url)
        assert isinstance(client, RedisCluster)
        assert len(client.get_primaries()) == 3
        client.close()
    # Several seeds, the first of them down: the others answer.
    seeds = valkey_cluster.seeds_url.replace("@127.0.0.1:", "@127.0.0.1:1,127.0.0.1:", 1)
    client = connect_redis(seeds)
    assert isinstance(client, RedisCluster)
    client.set("engram:test", "1")
    assert client.get("engram:test") == b"1"
    client.close()
    # One server stays a one-server client.
    single = connect_redis(redis_url)
    assert type(single) is redis.Redis
    single.close()


@pytest.mark.parametrize(
    "url",
    [
        "",
        "nonsense",
        "http://127.0.0.1:6379/0",
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:70000/0",
        "redis://h1:1,,h2:2/0",
        "redis://h1:1,h2:2/3",  # a cluster has database 0 only
        "redis://127.0.0.1:6379/db",
    ],
)
def test_a_bad_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        connect_redis(url)
    assert "secret" not in str(caught.value)


# -- reading ---------------------------------------------------------------------------


def test_reads_take_every_stream_at_once_and_block_on_one_in_turn(
    cluster_client: redis.Redis,
) -> None:
    streams = [keys.stream(p) for p in range(CONFIG.partitions)]
    for stream in streams:
        cluster_client.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    reads = ClusterReads(cluster_client, "reader")
    # Idle: each empty read blocks twice as long as the one before, up to the block
    # asked for (10, 20, 40, 80, 160, 200, 200 ms): one block, never one per stream.
    blocks = []
    for _ in range(7):
        blocks.append(min(200, reads.next_block_ms))
        assert reads.read(streams, count=10, block_ms=200) == {}
    assert blocks == [10, 20, 40, 80, 160, 200, 200]
    waited = reads.next_block_ms
    assert reads.read(streams, count=10, block_ms=None) == {}  # no block at all
    assert reads.next_block_ms == waited
    for stream in (streams[1], streams[6]):  # two streams, on two masters
        cluster_client.xadd(stream, {"op": "x"})
    sent: list[str] = []

    def unsent(pipe: Any) -> None:  # the last cycle's answers go in the same pipeline
        pipe.set("engram:test:{9}", "answered")
        sent.append("yes")

    found = reads.read(streams, count=10, block_ms=5000, unsent=unsent)
    assert sorted(found) == sorted(s.encode() for s in (streams[1], streams[6]))
    assert all(len(entries) == 1 for entries in found.values())
    assert sent and cluster_client.get("engram:test:{9}") == b"answered"
    # An entry arriving on a stream other than the one the blocking read waits on is
    # found by the next read: within one block.
    threading.Timer(0.05, lambda: cluster_client.xadd(streams[3], {"op": "y"})).start()
    started = time.monotonic()
    found = {}
    while not found:
        found = reads.read(streams, count=10, block_ms=300)
    assert list(found) == [streams[3].encode()]
    assert time.monotonic() - started < 0.3 + 0.25
    # Work was found: the next wait is short again.
    assert reads.next_block_ms == FIRST_BLOCK_MS


def test_light_load_latency_stays_within_one_block(
    cluster_url: str, fresh_store: Store, producer: Producer
) -> None:
    with cluster_worker(cluster_url, fresh_store):
        producer.remember(scope_on(0, "warm"), "warm up").wait(10)
        took = []
        for partition in range(CONFIG.partitions):
            time.sleep(0.15)  # idle: the worker is in a blocking read
            started = time.monotonic()
            producer.remember(scope_on(partition, "light"), "one at a time").wait(10)
            took.append(time.monotonic() - started)
    # The commit itself takes some ms; the wait for the read at most one block. The
    # median, not the slowest: one operation may meet a stall of this shared machine,
    # while a read that waited a block per node would make every one slow.
    assert statistics.median(took) < CONFIG.block_ms / 1000 + 0.25, took


# -- through a worker ------------------------------------------------------------------


def every_kind(producer: Producer, scope: dict[str, str], tag: str) -> list[StreamReceipt]:
    first = producer.remember(scope, "Ada lives in London.", id=f"mem_{tag}").wait(10)
    revised = producer.revise(scope, f"mem_{tag}", text="Ada lives in Paris.").wait(10)
    retracted = producer.retract(scope, f"mem_{tag}", expected_revision=2).wait(10)
    extracted = producer.extract(
        scope,
        [{"id": "m1", "message": {"role": "user", "content": "I drink tea."}}],
        infer=False,
    ).wait(10)
    forgot = producer.forget(scope, f"mem_{tag}").wait(10)
    return [first, revised, retracted, extracted, forgot]


def test_every_kind_round_trips_on_every_partition(
    valkey_cluster: ValkeyCluster,
    cluster_url: str,
    cluster_client: redis.Redis,
    fresh_store: Store,
    producer: Producer,
) -> None:
    cluster: Any = cluster_client
    masters = {cluster.get_node_from_key(keys.stream(p)).port for p in range(CONFIG.partitions)}
    assert len(masters) == 3, "the partitions do not span every master"
    with cluster_worker(cluster_url, fresh_store):
        for partition in range(CONFIG.partitions):
            scope = scope_on(partition, "kinds")
            receipts = every_kind(producer, scope, f"p{partition}")
            assert [r.kind for r in receipts] == [
                "remember",
                "revise",
                "retract",
                "extract",
                "forget",
            ]
            assert [r.scope_revision for r in receipts] == [1, 2, 3, 4, 5]
            assert receipts[-1].revisions == (1, 2, 3)
            assert fresh_store.get(scope, f"mem_p{partition}") is None
    # Every entry acknowledged and deleted; nothing dead-lettered.
    assert sum(cluster_client.xlen(keys.stream(p)) for p in range(CONFIG.partitions)) == 0
    assert deadletters.count(cluster_client) == 0


def test_enqueue_many_and_a_dead_letter_retried(
    cluster_url: str, cluster_client: redis.Redis, fresh_store: Store, producer: Producer
) -> None:
    ops = [
        Operation.build("remember", scope_on(p, "many"), {"text": f"fact {p}"}, f"many:{p}")
        for p in range(CONFIG.partitions)
    ]
    pending = producer.enqueue_many(ops)  # one pipeline over every master
    assert sorted(p.partition for p in pending) == list(range(CONFIG.partitions))
    # A malformed entry goes to the dead letters; its retry (two slots) goes back.
    cluster_client.xadd(keys.stream(0), {"op": json.dumps({"operation_id": "bad:1"})})
    with cluster_worker(cluster_url, fresh_store):
        assert [p.wait(10).scope_revision for p in pending] == [1] * CONFIG.partitions
        [letter] = wait_until(lambda: deadletters.page(cluster_client), what="the dead letter")
        assert letter.partition == 0
        assert deadletters.retry(cluster_client, letter.id) is not None
        [again] = wait_until(
            lambda: [d for d in deadletters.page(cluster_client) if d.id != letter.id],
            what="the retried letter dead again",
        )
    assert again.operation_id == "bad:1"
    assert deadletters.get(cluster_client, letter.id) is None


def _entry_key(p: Pending) -> tuple[int, int]:
    ms, seq = p.entry_id.split("-")
    return int(ms), int(seq)


@pytest.mark.slow
def test_three_workers_one_killed_keep_every_scope_in_order(
    cluster_url: str,
    fresh_dsn: str,
    fresh_store: Store,
    worker_processes: Callable[..., WorkerProcess],
) -> None:
    scopes = [{"user_id": f"order-{i}"} for i in range(32)]
    sent: dict[str, list[Pending]] = defaultdict(list)
    lock = threading.Lock()
    workers = [
        worker_processes(database_url=fresh_dsn, redis_url=cluster_url, config=CONFIG)
        for _ in range(3)
    ]
    setup = Producer.from_url(cluster_url, partitions=CONFIG.partitions)
    pids = {str(w.pid) for w in workers}
    try:
        wait_until(
            lambda: pids <= {w.get("pid") for w in live_workers(setup.client, 10_000)},
            timeout=30,
            what="three live workers",
        )
    except AssertionError:
        seen = live_workers(setup.client, 10_000)
        raise AssertionError(f"{seen}\n" + "\n".join(w.log()[-3000:] for w in workers)) from None

    killed = threading.Event()
    after_kill = [0] * 4

    def produce(n: int) -> None:
        """At least 400 operations, and at least 100 of them after the kill."""
        producer = Producer.from_url(cluster_url, partitions=CONFIG.partitions)
        rng = random.Random(n)
        j = 0
        while j < 400 or after_kill[n] < 100:
            scope = scopes[rng.randrange(len(scopes))]
            p = producer.remember(scope, f"p{n}-{j}", operation_id=f"order:{n}:{j}")
            with lock:
                sent[scope["user_id"]].append(p)
            after_kill[n] += killed.is_set()
            j += 1
            time.sleep(rng.random() * 0.008)

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in producers:
        t.start()

    def victim_holds_partitions() -> bool:
        found = [
            w
            for w in live_workers(setup.client, CONFIG.lease_ttl_ms)
            if w.get("pid") == str(workers[0].pid)
        ]
        return bool(found and found[0].get("partitions")) and sum(map(len, sent.values())) > 200

    try:
        wait_until(victim_holds_partitions, timeout=30, what="the victim to hold partitions, busy")
    except AssertionError:
        killed.set()  # let the producers end
        raise
    acquired_before = sum(w.log().count("partition acquired") for w in workers[1:])
    workers[0].signal(signal.SIGKILL)  # mid-load: its partitions move to the others
    workers[0].process.wait()
    killed.set()  # the load goes on past the kill: each producer sends 100 more at least
    for t in producers:
        t.join()
    every = [p for ps in sent.values() for p in ps]
    for p in every:
        p.wait(60)
    for s in scopes:
        # A scope's entries share a stream: their ids are the order of enqueue.
        expected = [p.operation_id for p in sorted(sent[s["user_id"]], key=_entry_key)]
        receipts = sorted(fresh_store.receipts(scope=s, limit=1000), key=lambda r: r.scope_revision)
        assert [r.scope_revision for r in receipts] == list(range(1, len(expected) + 1))
        assert [r.operation_id for r in receipts] == expected
    assert_applied_once(fresh_store, fresh_dsn, every)
    assert all(w.process.poll() is None for w in workers[1:])
    # The survivors took the victim's partitions over.
    assert sum(w.log().count("partition acquired") for w in workers[1:]) > acquired_before


# -- the CLI ---------------------------------------------------------------------------


def test_enqueue_wait_metrics_and_health_on_the_cluster(
    cluster_url: str,
    fresh_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("REDIS_URL", cluster_url)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(CONFIG.partitions))
    monkeypatch.setenv("ENGRAM_LEASE_TTL_MS", str(CONFIG.lease_ttl_ms))
    assert main(["health"]) == 1  # no worker yet
    capsys.readouterr()
    with cluster_worker(cluster_url, fresh_store):
        for partition in range(CONFIG.partitions):
            code = main(
                [
                    "enqueue",
                    "remember",
                    "--scope",
                    json.dumps(scope_on(partition, "cli")),
                    "--request",
                    '{"text": "Ada lives in London."}',
                    "--operation-id",
                    f"cli:{partition}",
                    "--wait",
                    "10",
                ]
            )
            assert code == 0
            receipt = json.loads(capsys.readouterr().out)
            assert receipt["operation_id"] == f"cli:{partition}"
            assert receipt["scope_revision"] == 1
        assert main(["health"]) == 0
        assert json.loads(capsys.readouterr().out) == {
            "live_workers_on_this_host": 1,
            "stranded_entries": 0,
            "stranded_streams": [],
        }

        def committed_counted() -> bool:
            assert main(["metrics"]) == 0
            out = capsys.readouterr().out.splitlines()
            return f"engram_ops_committed_total {CONFIG.partitions}" in out

        wait_until(committed_counted, timeout=5, what="the commits counted")


# -- waiting for replicas ----------------------------------------------------------------


def _replica_of(valkey_cluster: ValkeyCluster, key: str) -> redis.Redis:
    """A client of the replica serving ``key``'s slot, allowed to read there."""
    client = valkey_cluster.client()
    master = client.get_node_from_key(key)
    client.close()
    with contextlib.closing(
        redis.Redis.from_url(valkey_cluster.node_url(_node(valkey_cluster, master.port)))
    ) as on_master:
        port = int(on_master.info("replication")["slave0"]["port"])
    direct = redis.Redis.from_url(valkey_cluster.node_url(_node(valkey_cluster, port)))
    direct.execute_command("READONLY")
    return direct


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _node(valkey_cluster: ValkeyCluster, port: int) -> Any:
    return next(n for n in valkey_cluster.nodes if n.port == port)


def test_an_enqueue_waits_for_its_replica(
    valkey_cluster: ValkeyCluster, cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", cluster_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(CONFIG.partitions))
    monkeypatch.setenv("ENGRAM_WAIT_REPLICAS", "1")
    with Producer.from_env() as producer:
        assert producer.wait_replicas == 1
        for partition in range(CONFIG.partitions):
            pending = producer.remember(scope_on(partition, "wait"), "held twice")
            replica = _replica_of(valkey_cluster, keys.stream(partition))
            # WAIT returned: the replica holds the entry already, no polling needed.
            [(entry_id, _)] = replica.xrange(keys.stream(partition), count=1)
            assert _s(entry_id) == pending.entry_id
            replica.close()
        bulk = producer.enqueue_many(
            [Operation.build("remember", scope_on(p, "wb"), {"text": "x"}) for p in range(3)]
        )
        assert len(bulk) == 3


def test_too_few_replicas_is_a_retryable_error(cluster_url: str, redis_url: str) -> None:
    for url in (cluster_url, redis_url):  # one replica each; one server has none
        wanted = 2 if url == cluster_url else 1
        with Producer.from_url(url, partitions=CONFIG.partitions, wait_replicas=wanted) as p:
            p.wait_replicas_ms = 200
            started = time.monotonic()
            with pytest.raises(NotReplicatedError) as caught:
                p.remember({"user_id": "few"}, "held once", operation_id="few:1")
            assert time.monotonic() - started < 2
            assert isinstance(caught.value, QueueUnavailableError)
            assert "retry with the same operation id" in str(caught.value)
            # It is in the stream all the same: a retry is a replay, not a loss.
            stream = keys.stream(partition_of({"user_id": "few"}, CONFIG.partitions))
            assert p.client.xlen(stream) == 1


@pytest.mark.slow
def test_a_master_killed_under_load_loses_no_replicated_enqueue(
    valkey_cluster: ValkeyCluster,
    cluster_url: str,
    fresh_dsn: str,
    fresh_store: Store,
    worker_processes: Callable[..., WorkerProcess],
) -> None:
    """With ``wait_replicas=1`` every acknowledged enqueue is on a replica: the failover
    loses none. An enqueue refused during it may or may not be there (``maybe``)."""
    url = valkey_cluster.seeds_url  # the killed master may be the first node
    workers = [
        worker_processes(database_url=fresh_dsn, redis_url=url, config=CONFIG) for _ in range(2)
    ]
    stop = threading.Event()
    acknowledged: list[Pending] = []
    refused: list[str] = []

    def produce(n: int) -> None:
        producer = Producer.from_url(url, partitions=CONFIG.partitions, wait_replicas=1)
        i = 0
        while not stop.is_set():
            op_id = f"fo:{n}:{i}"
            try:
                acknowledged.append(
                    producer.remember({"user_id": f"fo-{n}-{i % 20}"}, f"f{i}", operation_id=op_id)
                )
            except QueueUnavailableError:
                refused.append(op_id)
                time.sleep(0.05)
            i += 1
            time.sleep(0.003)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)
        took = valkey_cluster.kill_master_of(keys.stream(0))
        assert took < 30
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert refused, "no enqueue met the failover"
    for p in acknowledged:
        p.wait(60)
    assert_applied_once(fresh_store, fresh_dsn, acknowledged, maybe=refused)
    assert all(w.process.poll() is None for w in workers)
    assert "consumer crashed" not in "".join(w.log() for w in workers)
