"""The dashboard and the API on the real jobs, as ``engram web`` builds them: a reembed
started through the API runs on an RQ jobs worker, its progress and its job show in
the API, the audit says who asked, and recall follows the new active generation."""

from __future__ import annotations

from pathlib import Path

import pytest
from rq import Queue, SimpleWorker
from starlette.testclient import TestClient

from engram.web_cli import build
from jobs.keys import MAINTENANCE_QUEUE
from jobs.queues import SERIALIZER
from store import HashingEmbedder, Store
from tests.jobs_fixtures import context, run_burst
from tests.web_fixtures import BASE_URL, Web
from web import WebConfig
from worker.settings import Settings


def test_a_reembed_started_through_the_api_runs_on_the_jobs_and_recall_follows_it(
    fresh_store: Store, fresh_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    scope = {"user_id": "web-jobs"}
    mem = fresh_store.session(scope, embedder=HashingEmbedder(64))
    for i in range(40):
        mem.remember(f"Ada keeps note number {i} about green tea.")
    settings = Settings.from_env(
        {
            "ENGRAM_HOME": str(tmp_path / "home"),
            "DATABASE_URL": fresh_dsn,
            "REDIS_URL": redis_url,
            "ENGRAM_EMBEDDER": "hashing:64",
            "ENGRAM_PARTITIONS": "4",
        }
    )
    with build(settings, WebConfig(partitions=4)) as app, TestClient(app, base_url=BASE_URL) as web:
        refused = web.post("/api/v1/reembed", json={"model": "no-such-model"})
        assert refused.status_code == 422, refused.text
        started = web.post("/api/v1/reembed", json={"model": "hashing:32"})
        assert started.status_code == 202, started.text
        job_id = started.json()["job_id"]
        pending = web.get("/api/v1/generations").json()["items"][0]
        assert pending["status"] == "pending" and pending["progress"]["job_id"] == job_id
        assert pending["progress"]["requested_by"] == "local"

        run_burst(context(fresh_store, redis_url), redis_url)

        newest = web.get("/api/v1/generations").json()["items"][0]
        assert (newest["status"], newest["model_id"], newest["vectors"]) == (
            "active",
            "hashing-32",
            40,
        )
        assert newest["progress"]["state"] == "activated"
        assert newest["progress"]["done"] == newest["progress"]["total"] == 40
        job = web.get(f"/api/v1/jobs/{job_id}").json()
        assert job["state"] == "finished", job
        [entry] = [e for e in fresh_store.audit.page().items if e.action == "reembed.start"]
        assert (entry.target, entry.requested_by) == (job_id, "local")

        hits = web.post(
            "/api/v1/recall", json={"scope": scope, "text": "note number 7", "top_k": 3}
        ).json()
        # The dashboard was started with hashing:64; it now embeds with the active model.
        assert hits["vector_search"] is True
        assert any(h["match"] in ("vector", "hybrid") for h in hits["hits"])


@pytest.mark.parametrize("page", ["/generations", "/jobs"])
def test_the_pages_offer_the_jobs_once_they_are_there(
    fresh_dsn: str, fresh_store: Store, redis_url: str, tmp_path: Path, page: str
) -> None:
    settings = Settings.from_env(
        {"ENGRAM_HOME": str(tmp_path), "DATABASE_URL": fresh_dsn, "REDIS_URL": redis_url}
    )
    with (
        build(settings, WebConfig(), embedder=False) as app,
        TestClient(app, base_url=BASE_URL) as web,
    ):
        text = web.get(page).text
    assert "not available" not in text
    if page == "/jobs":
        assert "engram-reembed" in text and "engram-redaction" in text


def _failed_jobs(web: Web, n: int) -> list[str]:
    """``n`` jobs that failed on a real RQ worker, in a queue emptied first."""
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    web.redis.delete(queue.key, queue.failed_job_registry.key)
    ids = [queue.enqueue("tests.rq_jobs.fails", f"mem_{i}").id for i in range(n)]
    SimpleWorker([queue], connection=web.redis, serializer=SERIALIZER).work(burst=True)
    return ids


def _state(web: Web) -> tuple[int, int]:
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    return len(queue), queue.failed_job_registry.get_job_count(cleanup=False)


def test_retry_all_failed_jobs_after_a_dry_run_with_a_reason(web: Web) -> None:
    ids = _failed_jobs(web, 3)
    since = max([e.id for e in web.store.audit.page(limit=1).items] or [0])
    ask = {"action": "retry", "filter": {"queue": MAINTENANCE_QUEUE}}
    dry = web.client.post("/api/v1/bulk/jobs", json=ask)
    assert dry.status_code == 200, dry.text
    body = dry.json()
    assert body["dry_run"] is True and body["count"] == 3
    assert sorted(j["id"] for j in body["items"]) == sorted(ids)
    assert _state(web) == (0, 3)  # the dry run changed nothing
    page = web.client.get(f"/jobs/bulk?queue={MAINTENANCE_QUEUE}")
    assert page.status_code == 200 and "3</strong> failed jobs would be put back" in page.text
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    late = queue.enqueue("tests.rq_jobs.fails", "mem_late")
    SimpleWorker([queue], connection=web.redis, serializer=SERIALIZER).work(burst=True)
    refused = web.client.post("/api/v1/bulk/jobs", json={**ask, "confirm": body["confirm"]})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "selection_changed"
    assert _state(web) == (0, 4)
    confirm = web.client.post("/api/v1/bulk/jobs", json=ask).json()["confirm"]
    done = web.client.post(
        "/api/v1/bulk/jobs", json={**ask, "confirm": confirm, "reason": "the database is back"}
    )
    assert done.status_code == 200 and done.json()["dry_run"] is False
    assert _state(web) == (4, 0)
    rows = [e for e in web.store.audit.page(limit=50).items if e.id > since]
    assert sorted(e.target for e in rows) == sorted([*ids, late.id])
    assert {(e.requested_by, e.action, e.detail["reason"], e.detail["bulk"]) for e in rows} == {
        ("local", "job.retry", "the database is back", 4)
    }


def test_a_single_job_retry_takes_a_reason_from_the_api_and_the_form(web: Web) -> None:
    first, second = _failed_jobs(web, 2)
    retried = web.client.post(f"/api/v1/jobs/{first}/retry", json={"reason": "flaky network"})
    assert retried.status_code == 200 and retried.json()["state"] == "queued"
    token = web.csrf(f"/jobs/{second}")
    posted = web.client.post(f"/jobs/{second}/retry", data={"csrf": token, "why": "by hand"})
    assert posted.status_code == 303
    [two, one] = [e for e in web.store.audit.page(limit=2).items]
    assert (one.target, one.detail["reason"]) == (first, "flaky network")
    assert (two.target, two.detail["reason"]) == (second, "by hand")
    assert "flaky network" in web.client.get("/audit").text
