"""The dashboard with ``REDIS_URL`` naming a real valkey cluster (``cluster_fixtures``)
and the jobs on a Redis of their own (``ENGRAM_JOBS_REDIS_URL``), built as ``engram
web`` builds it (``engram.web_cli.build``) and driven through Starlette's TestClient:
the overview, the workers it lists, the dead letters, the backlog search, pausing
and the jobs pages answer, with what is on the cluster and on the jobs' Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from starlette.testclient import TestClient

from engram.jobs import prune
from engram.store import Store
from engram.web import WebConfig
from engram.web_cli import build
from engram.worker import Producer, keys
from engram.worker.admin import deadletters, pause
from engram.worker.consuming.membership import live_workers
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from engram.worker.settings import Settings
from tests.redis_fixtures import wait_until
from tests.web_fixtures import BASE_URL, TOKEN, sign_in
from tests.worker.test_cluster import CONFIG, cluster_worker, scope_on


@dataclass
class OnCluster:
    client: TestClient
    cluster: redis.Redis
    jobs: redis.Redis
    producer: Producer
    worker: Worker

    def csrf(self, path: str = "/") -> str:
        html = self.client.get(path).text
        marker = 'name="csrf" value="'
        start = html.index(marker) + len(marker)
        return html[start : html.index('"', start)]


@pytest.fixture
def dashboard(
    cluster_url: str, redis_url: str, fresh_dsn: str, fresh_store: Store, tmp_path: object
) -> Iterator[OnCluster]:
    settings = Settings.from_env(
        {
            "REDIS_URL": cluster_url,
            "ENGRAM_JOBS_REDIS_URL": redis_url,
            "DATABASE_URL": fresh_dsn,
            "ENGRAM_HOME": str(tmp_path),
            "ENGRAM_PARTITIONS": str(CONFIG.partitions),
            "ENGRAM_LEASE_TTL_MS": str(CONFIG.lease_ttl_ms),
            "ENGRAM_LEASE_MARGIN_MS": str(CONFIG.lease_margin_ms),
        }
    )
    config = WebConfig(token=TOKEN, partitions=CONFIG.partitions, lease_ttl_ms=CONFIG.lease_ttl_ms)
    cluster, jobs = connect_redis(cluster_url), connect_redis(redis_url)
    with (
        build(settings, config, embedder=False) as app,
        TestClient(app, base_url=BASE_URL, follow_redirects=False) as client,
        Producer.from_url(cluster_url, partitions=CONFIG.partitions) as producer,
        cluster_worker(cluster_url, fresh_store) as worker,
    ):
        sign_in(client, "local")
        yield OnCluster(client, cluster, jobs, producer, worker)
    cluster.close()
    jobs.close()


def _op(scope: dict[str, str], operation_id: str) -> str:
    request = {"text": "Bob likes jazz."}
    return json.dumps(
        {"operation_id": operation_id, "kind": "remember", "scope": scope, "request": request}
    )


def test_the_overview_workers_metrics_and_health_on_a_cluster(dashboard: OnCluster) -> None:
    for partition in range(CONFIG.partitions):
        dashboard.producer.remember(scope_on(partition, "web"), "Ada likes tea.").wait(30)
    page = dashboard.client.get("/")
    assert page.status_code == 200
    # The worker, as the overview lists it (its pid and every partition it holds).
    assert wait_until(lambda: dashboard.worker.worker_id.split(":")[1] in page.text)
    assert "Nothing is paused." in page.text
    health = dashboard.client.get("/healthz")
    assert (health.status_code, health.json()) == (
        200,
        {"status": "ok", "postgres": "ok", "redis": "ok", "jobs_redis": "ok"},
    )

    def counted() -> bool:
        text = dashboard.client.get("/metrics").text
        return f"engram_ops_committed_total {CONFIG.partitions}" in text.splitlines()

    wait_until(counted, timeout=10, what="the commits counted")
    assert "engram_workers_live 1" in dashboard.client.get("/metrics").text.splitlines()


def test_dead_letters_made_on_the_cluster_are_listed_shown_and_discarded(
    dashboard: OnCluster,
) -> None:
    scope = scope_on(2, "dead")
    # Sent to a partition that is not its scope's: dead-lettered by the worker.
    dashboard.cluster.xadd(keys.stream(3), {"op": _op(scope, "op-astray")})
    [letter] = wait_until(lambda: deadletters.read(dashboard.cluster), timeout=30)
    assert letter.operation_id == "op-astray"
    listed = dashboard.client.get("/dead-letters")
    assert listed.status_code == 200 and "op-astray" in listed.text
    assert f"/dead-letters/{letter.id}" in dashboard.client.get("/").text  # the latest
    shown = dashboard.client.get(f"/dead-letters/{letter.id}")
    assert shown.status_code == 200 and "op-astray" in shown.text
    api = dashboard.client.get("/api/v1/dead-letters").json()
    assert [d["operation_id"] for d in api["items"]] == ["op-astray"]
    one = dashboard.client.get(f"/api/v1/dead-letters/{letter.id}").json()
    assert one["operation_id"] == "op-astray"
    token = dashboard.csrf("/dead-letters")
    done = dashboard.client.post(f"/dead-letters/{letter.id}/discard", data={"csrf": token})
    assert done.status_code == 303
    assert deadletters.read(dashboard.cluster) == []


def test_a_partition_paused_from_the_page_holds_its_operation_found_in_the_backlog(
    dashboard: OnCluster,
) -> None:
    token = dashboard.csrf("/")
    done = dashboard.client.post("/pause/partition", data={"csrf": token, "partition": "5"})
    assert done.status_code == 303
    assert list(pause.paused_partitions(dashboard.cluster)) == [5]
    assert "Partition <b>#5</b> paused by local" in dashboard.client.get("/").text
    assert dashboard.client.get("/api/v1/paused").json()["partitions"][0]["partition"] == 5
    # A pause takes effect at each worker's next look: wait for the workers' report.
    wait_until(
        lambda: (
            dashboard.worker.worker_id
            in [w["id"] for w in live_workers(dashboard.cluster, CONFIG.lease_ttl_ms)]
            and not pause.not_yet_seen(5, live_workers(dashboard.cluster, CONFIG.lease_ttl_ms))
        ),
        what="every worker to report partition 5 paused",
    )
    # Held in its stream: the operation page finds it in the backlog, waiting.
    pending = dashboard.producer.remember(scope_on(5, "held"), "Ada likes tea.")
    page = dashboard.client.get(f"/operations/{pending.operation_id}")
    assert page.status_code == 200
    assert dashboard.cluster.xlen(keys.stream(5)) == 1
    assert dashboard.client.get("/operations/never-sent").status_code == 404
    api = dashboard.client.get(f"/api/v1/operations/{pending.operation_id}")
    assert api.status_code == 200 and api.json()["state"] == "waiting"

    resumed = dashboard.client.post("/resume/partition/5", data={"csrf": token})
    assert resumed.status_code == 303 and pause.paused_partitions(dashboard.cluster) == {}
    assert pending.wait(30).scope_revision == 1
    # The API's twins.
    api = dashboard.client.post("/api/v1/partitions/6/pause", json={"reason": "api"})
    assert api.status_code == 200 and list(pause.paused_partitions(dashboard.cluster)) == [6]
    api = dashboard.client.post("/api/v1/partitions/6/resume", json={})
    assert api.json()["was_paused"] is True and pause.paused_partitions(dashboard.cluster) == {}


def test_the_jobs_pages_and_their_pause_are_on_the_jobs_redis(dashboard: OnCluster) -> None:
    job_id = prune.enqueue(dashboard.jobs, "history")
    listed = dashboard.client.get("/jobs?queue=engram-maintenance&state=queued")
    assert listed.status_code == 200 and job_id in listed.text
    assert dashboard.client.get(f"/jobs/{job_id}").status_code == 200
    api = dashboard.client.get("/api/v1/jobs?queue=engram-maintenance&state=queued").json()
    assert job_id in [j["id"] for j in api["items"]]
    assert "engram-maintenance" in dashboard.client.get("/").text  # its queue, counted

    token = dashboard.csrf("/")
    assert dashboard.client.post("/pause/jobs", data={"csrf": token}).status_code == 303
    assert pause.jobs_paused(dashboard.jobs) is not None
    assert not dashboard.cluster.exists("rq:suspended", keys.PAUSED_JOBS)
    assert "Jobs paused by local" in dashboard.client.get("/").text
    assert dashboard.client.get("/api/v1/paused").json()["jobs"]["paused"] is True
    assert dashboard.client.post("/api/v1/queues/resume", json={}).status_code == 200
    assert pause.jobs_paused(dashboard.jobs) is None
