"""``engram up`` with ``REDIS_URL`` naming a real valkey cluster (``cluster_fixtures``)
and no ``ENGRAM_JOBS_REDIS_URL``: the streams run on the cluster, the jobs on the
home's embedded valkey (RQ cannot use a cluster), which the children and the commands
of the home find; a forget goes from a worker on the cluster to the jobs and back."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from engram.store import Store
from engram.store.masking import mask_url
from engram.worker import Producer, StreamReceipt
from engram.worker.embedded.runtime import connect_redis
from tests.engram.test_up import Up, _get, engram, home, start_up  # noqa: F401 (fixtures)
from tests.redis_fixtures import wait_until

pytestmark = pytest.mark.slow


def _redaction(producer: Producer, scope: dict[str, str], op_id: str) -> str | None:
    reply = producer.results(scope, [op_id]).get(op_id)
    if isinstance(reply, StreamReceipt) and reply.redaction in ("complete", "failed"):
        return reply.redaction
    return None


def test_up_on_a_cluster_runs_the_jobs_on_its_embedded_valkey(
    home: Path,  # noqa: F811
    start_up: Callable[..., Up],  # noqa: F811
    cluster_url: str,
    fresh_dsn: str,
    fresh_store: Store,
) -> None:
    up = start_up(home, "--workers", "1", env={"REDIS_URL": cluster_url, "DATABASE_URL": fresh_dsn})
    run = up.wait_ready()
    jobs_url = str(run["jobs_redis_url"])
    assert run["redis_url"] == cluster_url and jobs_url != cluster_url
    assert f"jobs Redis  {mask_url(jobs_url)}  (embedded" in up.log()
    assert (home / "valkey" / "valkey.pid").exists()

    # The commands of the home find the jobs there; the dashboard reaches both.
    wait_until(
        lambda: engram(home, "jobs-health").returncode == 0, timeout=60, what="the jobs worker"
    )
    health = wait_until(
        lambda: _get(f"{run['dashboard_url']}healthz"), timeout=60, what="the dashboard"
    )
    assert health == {"status": "ok", "postgres": "ok", "redis": "ok", "jobs_redis": "ok"}

    with Producer.from_url(cluster_url, partitions=4) as producer:
        record_id = producer.remember({"user_id": "up"}, "Ada lives in Lisbon.").wait(60)
        forget = producer.forget({"user_id": "up"}, record_id.records[0].id)
        assert forget.wait(30).redaction == "pending"
        final = wait_until(
            lambda: _redaction(producer, {"user_id": "up"}, forget.operation_id),
            timeout=120,
            what="redaction",
        )
    assert final == "complete", up.log()
    # RQ's keys are on the embedded valkey, none on the cluster.
    jobs = connect_redis(jobs_url)
    cluster = connect_redis(cluster_url)
    with contextlib.closing(jobs), contextlib.closing(cluster):
        assert any(jobs.scan_iter("rq:job:redact-*"))
        assert not any(cluster.scan_iter("rq:*"))
    paused = engram(home, "paused", "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["jobs"]["paused"] is False
    assert up.stop() == 0
    with (
        pytest.raises(redis.ConnectionError),
        contextlib.closing(redis.Redis.from_url(jobs_url)) as c,
    ):
        c.ping()  # stopped with ``up``


def test_up_refuses_a_cluster_named_for_the_jobs(
    home: Path,  # noqa: F811
    start_up: Callable[..., Up],  # noqa: F811
    cluster_url: str,
    fresh_dsn: str,
) -> None:
    env = {"REDIS_URL": cluster_url, "DATABASE_URL": fresh_dsn}
    env["ENGRAM_JOBS_REDIS_URL"] = cluster_url
    up = start_up(home, env=env)
    assert up.process.wait(timeout=60) == 2
    assert "ENGRAM_JOBS_REDIS_URL names a Redis Cluster" in up.log()
    assert "Traceback" not in up.log() and not (home / "valkey").exists()
