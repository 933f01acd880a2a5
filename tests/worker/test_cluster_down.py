"""A cluster with a slot range no node serves, or one that answers ``CLUSTERDOWN``,
``TRYAGAIN`` or ``READONLY`` while a failover moves its slots, is waited out by a
worker as a server outage is: it keeps running, and what is sent once the cluster
is whole again is committed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import redis

from engram.store import HashingEmbedder, Store
from engram.worker import Producer, QueueUnavailableError, keys
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from tests.cluster_fixtures import ValkeyCluster, _cluster_state
from tests.redis_fixtures import FAST, InProcessWorker, WorkerProcess, wait_until
from tests.worker.test_cluster import CONFIG, scope_on


def _replica_port(cluster: ValkeyCluster, master_port: int) -> int:
    [master] = [n for n in cluster.nodes if n.port == master_port]
    with contextlib.closing(redis.Redis.from_url(cluster.node_url(master))) as client:
        return int(client.info("replication")["slave0"]["port"])


def _state_of_a_live_node(cluster: ValkeyCluster) -> str:
    for node in cluster.nodes:
        if node.alive():
            url = cluster.node_url(node)
            with (
                contextlib.suppress(redis.RedisError),
                contextlib.closing(redis.Redis.from_url(url)) as client,
            ):
                return _cluster_state(client)
    return "unknown"


def _send_to_every_partition(producer: Producer, label: str) -> None:
    pendings = [
        producer.remember(scope_on(p, label), label, operation_id=f"down:{label}:{p}")
        for p in range(CONFIG.partitions)
    ]
    for p in pendings:
        p.wait(60)


def test_a_slot_range_with_no_node_is_waited_out(
    valkey_cluster: ValkeyCluster,
    cluster_url: str,
    fresh_dsn: str,
    fresh_store: Store,
    worker_processes: Callable[..., WorkerProcess],
) -> None:
    url = valkey_cluster.seeds_url  # any node may be down
    worker = worker_processes(database_url=fresh_dsn, redis_url=url, config=CONFIG)
    with Producer.from_url(url, partitions=CONFIG.partitions) as producer:
        _send_to_every_partition(producer, "before")
    with contextlib.closing(valkey_cluster.client()) as client:
        master_port = client.get_node_from_key(keys.stream(0)).port
    replica_port = _replica_port(valkey_cluster, master_port)
    pair = [n for n in valkey_cluster.nodes if n.port in (master_port, replica_port)]
    for node in pair:  # a slot range with no node left to serve it
        valkey_cluster.kill(node)
    wait_until(
        lambda: _state_of_a_live_node(valkey_cluster) == "fail", timeout=30, what="CLUSTERDOWN"
    )
    wait_until(
        lambda: worker.log().count("redis unavailable") >= 3, timeout=30, what="the worker waiting"
    )
    for node in pair:
        valkey_cluster.start_node(node)
    valkey_cluster.wait_ok()
    with Producer.from_url(url, partitions=CONFIG.partitions) as producer:
        _send_to_every_partition(producer, "after")
    assert worker.process.poll() is None
    assert "consumer crashed" not in worker.log()
    assert fresh_store.receipt(f"down:after:{CONFIG.partitions - 1}") is not None


class _AnswersFirst:
    """A pipeline whose first ``failures`` executions raise ``error``, as a cluster's
    node answers while a failover is under way; then the real one."""

    def __init__(self, pipe: Any, state: dict[str, Any]) -> None:
        self._pipe, self._state = pipe, state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        if self._state["left"] > 0:
            self._state["left"] -= 1
            self._pipe.reset()
            raise self._state["error"]
        return self._pipe.execute(*args, **kwargs)


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.MasterDownError("Link with MASTER is down"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.SlotNotCoveredError("Node for slot 42 is not covered"),
    ],
    ids=type,
)
def test_a_failover_answer_is_waited_out(
    redis_url: str, fresh_store: Store, error: Exception
) -> None:
    client = connect_redis(redis_url)
    real_pipeline = client.pipeline
    state: dict[str, Any] = {"left": 0, "error": error}
    client.pipeline = lambda *a, **k: _AnswersFirst(real_pipeline(*a, **k), state)  # type: ignore[method-assign,assignment]
    with (
        Producer.from_url(redis_url, partitions=FAST.partitions) as producer,
        InProcessWorker(Worker(client, fresh_store, HashingEmbedder(64), config=FAST)),
    ):
        producer.remember({"user_id": "fo"}, "one", operation_id="fo:1").wait(30)
        state["left"] = 3  # the next three round trips of the consumer fail
        producer.remember({"user_id": "fo"}, "two", operation_id="fo:2").wait(30)
        assert state["left"] == 0
        # The consumer waited the answers out: it did not crash and lose its partitions.
        assert client.hget(keys.METRICS, 'partitions_lost_total{reason="crashed"}') is None
    assert fresh_store.scope_revision({"user_id": "fo"}) == 2


def test_a_producer_says_unavailable_when_no_node_serves_the_slot(redis_url: str) -> None:
    """The cluster client's own error (no node known for a slot, mid-failover) is the
    typed, retryable refusal every Redis failure is, not a raw exception."""
    with Producer.from_url(redis_url, partitions=FAST.partitions) as producer:
        producer.remember({"user_id": "fo"}, "one", operation_id="fo:ok")  # loads the layout

        def no_node(*args: Any, **kwargs: Any) -> Any:
            raise redis.exceptions.SlotNotCoveredError("Node for slot 42 is not covered")

        producer._add = no_node  # type: ignore[method-assign]  # what the cluster client raises
        with pytest.raises(QueueUnavailableError, match="retry with the same operation id"):
            producer.remember({"user_id": "fo"}, "two", operation_id="fo:2")
