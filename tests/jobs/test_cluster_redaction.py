"""A forget on a real valkey cluster (``cluster_fixtures``), redacted by jobs on a Redis
of their own (``ENGRAM_JOBS_REDIS_URL``): committed by an ``engram worker`` on the
cluster, handed to the ``engram jobs`` on the one server, and once its redaction is
complete the text is in no key, no ``DUMP`` and no file of any node of the cluster,
masters and replicas, dead letters included."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator

import pytest
import redis

from engram.jobs import keys as jobs_keys
from engram.store import Store
from engram.worker import Producer, StreamReceipt, keys, partition_of
from engram.worker.admin import deadletters
from engram.worker.embedded.runtime import connect_redis
from tests.cluster_fixtures import ValkeyCluster
from tests.helpers import bytes_hold, files_holding, marker_text, redis_values
from tests.jobs_fixtures import JobsProcess
from tests.redis_fixtures import WorkerProcess, wait_until
from tests.worker.test_cluster import CONFIG, scope_on


def _op(scope: dict[str, str], kind: str, request: dict[str, object], operation_id: str) -> str:
    return json.dumps(
        {"operation_id": operation_id, "kind": kind, "scope": scope, "request": request}
    )


def node_clients(valkey_cluster: ValkeyCluster) -> list[redis.Redis]:
    """A client of each node, masters and replicas (allowed to read there)."""
    clients = []
    for node in valkey_cluster.nodes:
        client = redis.Redis.from_url(valkey_cluster.node_url(node))
        if client.info("replication").get("role") == "slave":
            client.execute_command("READONLY")
        clients.append(client)
    return clients


@pytest.fixture
def uncompressed(cluster_url: str, valkey_cluster: ValkeyCluster) -> Iterator[None]:
    """DUMP payloads and RDB files without LZF on every node, for the test: a
    back-reference could hide the marker's bytes (as in ``test_dead_letter_residue``)."""
    clients = node_clients(valkey_cluster)
    for client in clients:
        client.config_set("rdbcompression", "no")
    yield
    for client in clients:
        with contextlib.suppress(redis.RedisError):
            client.config_set("rdbcompression", "yes")
        client.close()


def holding(valkey_cluster: ValkeyCluster, marker: str) -> list[str]:
    """Every node whose keys, values or ``DUMP``s hold ``marker``, and every file of
    any node that does."""
    found = []
    for node, client in zip(valkey_cluster.nodes, node_clients(valkey_cluster), strict=True):
        with contextlib.closing(client):
            if bytes_hold(redis_values(client), marker):
                found.append(f"node {node.port}: a key")
        found += files_holding(node.folder, marker)
    return found


def _redaction(producer: Producer, scope: dict[str, str], op_id: str) -> str | None:
    reply = producer.results(scope, [op_id]).get(op_id)
    if isinstance(reply, StreamReceipt) and reply.redaction in ("complete", "failed"):
        return reply.redaction
    return None


@pytest.mark.slow
@pytest.mark.usefixtures("uncompressed")
def test_a_forget_on_the_cluster_is_redacted_by_jobs_on_their_own_redis(
    cluster_url: str,
    valkey_cluster: ValkeyCluster,
    redis_url: str,
    fresh_dsn: str,
    fresh_store: Store,
    worker_processes: Callable[..., WorkerProcess],
    jobs_processes: Callable[..., JobsProcess],
) -> None:
    marker = marker_text()
    scope = scope_on(1, "ada-redact")
    cluster = connect_redis(cluster_url)
    jobs = connect_redis(redis_url)
    on_cluster = {"ENGRAM_JOBS_REDIS_URL": redis_url, "ENGRAM_FORGET_LISTENERS": "redis"}
    worker_processes(database_url=fresh_dsn, redis_url=cluster_url, config=CONFIG, env=on_cluster)
    producer = Producer.from_url(cluster_url, partitions=CONFIG.partitions)
    record_id = producer.remember(scope, f"Ada's locker code is {marker}.").wait(30).records[0].id
    # A revise of the record holding the text, sent to a partition not its scope's: a
    # dead letter, behind an unrelated one that keeps the letters' node alive.
    elsewhere = keys.stream((partition_of(scope, CONFIG.partitions) + 1) % CONFIG.partitions)
    cluster.xadd(elsewhere, {"op": _op(scope, "remember", {"text": "Bob likes jazz."}, "op-other")})
    revise = {"id": record_id, "text": f"{marker} (lost)"}
    cluster.xadd(elsewhere, {"op": _op(scope, "revise", revise, "op-lost")})
    wait_until(
        lambda: {"op-other", "op-lost"} <= {d.operation_id for d in deadletters.read(cluster)},
        timeout=30,
        what="the dead letters",
    )
    assert holding(valkey_cluster, marker), "the setup left the text nowhere: nothing to test"

    jobs_processes(
        database_url=fresh_dsn,
        redis_url=cluster_url,
        env={**on_cluster, "ENGRAM_PARTITIONS": str(CONFIG.partitions)},
    )
    forget = producer.forget(scope, record_id)
    assert forget.wait(30).redaction == "pending"
    final = wait_until(
        lambda: _redaction(producer, scope, forget.operation_id), timeout=120, what="the redaction"
    )
    assert final == "complete"

    assert holding(valkey_cluster, marker) == []
    assert [d.operation_id for d in deadletters.read(cluster)] == ["op-other"]
    # The jobs ran on their own Redis: its inbox is drained, the cluster has none.
    assert jobs.llen(jobs_keys.FORGET_INBOX) == 0 and any(jobs.scan_iter("rq:job:redact-*"))
    assert not cluster.exists(jobs_keys.FORGET_INBOX)
    producer.close()
    cluster.close()
    jobs.close()
