"""The dashboard and the API on the real jobs, as ``engram web`` builds them: a reembed
started through the API runs on an RQ jobs worker, its progress and its job show in
the API, the audit says who asked, and recall follows the new active generation."""

from __future__ import annotations

from pathlib import Path

import pytest
from rq import Queue
from starlette.testclient import TestClient

from engram.jobs.keys import MAINTENANCE_QUEUE, REDACTION_QUEUE
from engram.jobs.queues import SERIALIZER
from engram.store import HashingEmbedder, Store
from engram.web import WebConfig
from engram.web_cli import build
from engram.worker.settings import Settings
from tests.jobs_fixtures import context, run_burst
from tests.rq_jobs import enqueue_failing, work
from tests.web_fixtures import BASE_URL, TOKEN, Web, sign_in


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
    with (
        build(settings, WebConfig(token=TOKEN, partitions=4)) as app,
        TestClient(app, base_url=BASE_URL) as web,
    ):
        sign_in(web, "local")
        refused = web.post("/api/v1/reembed", json={"model": "no-such-model"})
        assert refused.status_code == 422, refused.text
        too_long = web.post("/api/v1/reembed", json={"model": "hashing:32", "reason": "x" * 201})
        assert too_long.status_code == 400
        assert [g["status"] for g in web.get("/api/v1/generations").json()["items"]] == ["active"]
        started = web.post(
            "/api/v1/reembed", json={"model": "hashing:32", "reason": "MiniLM trial, ticket 12"}
        )
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
        assert entry.detail == {"model": "hashing:32", "reason": "MiniLM trial, ticket 12"}

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
        build(settings, WebConfig(token=TOKEN), embedder=False) as app,
        TestClient(app, base_url=BASE_URL) as web,
    ):
        sign_in(web, "local")
        text = web.get(page).text
    assert "not available" not in text
    if page == "/jobs":
        assert "engram-reembed" in text and "engram-redaction" in text


def _failed_jobs(web: Web, redis_url: str, n: int) -> list[str]:
    """``n`` of engram's jobs that failed on a real RQ worker, in a queue emptied first."""
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    web.redis.delete(queue.key, queue.failed_job_registry.key)
    ids = [enqueue_failing(queue, f"mem_{i}").id for i in range(n)]
    work(web.store, redis_url, web.redis, queue)
    return ids


def _state(web: Web) -> tuple[int, int]:
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    return len(queue), queue.failed_job_registry.get_job_count(cleanup=False)


def test_retry_all_failed_jobs_after_a_dry_run_with_a_reason(web: Web, redis_url: str) -> None:
    ids = _failed_jobs(web, redis_url, 3)
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
    late = enqueue_failing(queue, "mem_late")
    work(web.store, redis_url, web.redis, queue)
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


def test_a_single_job_retry_takes_a_reason_from_the_api_and_the_form(
    web: Web, redis_url: str
) -> None:
    first, second = _failed_jobs(web, redis_url, 2)
    retried = web.client.post(f"/api/v1/jobs/{first}/retry", json={"reason": "flaky network"})
    assert retried.status_code == 200 and retried.json()["state"] == "queued"
    token = web.csrf(f"/jobs/{second}")
    posted = web.client.post(f"/jobs/{second}/retry", data={"csrf": token, "why": "by hand"})
    assert posted.status_code == 303
    [two, one] = [e for e in web.store.audit.page(limit=2).items]
    assert (one.target, one.detail["reason"]) == (first, "flaky network")
    assert (two.target, two.detail["reason"]) == (second, "by hand")
    assert "flaky network" in web.client.get("/audit").text


def _job_keys(web: Web, job_id: str) -> int:
    return int(web.redis.exists(f"rq:job:{job_id}", f"rq:results:{job_id}"))


def test_discard_all_failed_jobs_after_a_dry_run_unreadable_ones_too(
    web: Web, redis_url: str
) -> None:
    ids = _failed_jobs(web, redis_url, 2)
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    # A failed job whose data is not engram's JSON: never retried, but discarded.
    web.redis.hset("rq:job:planted", mapping={"data": b"\x80\x04garbage", "origin": queue.name})
    web.redis.zadd(queue.failed_job_registry.key, {"planted": 9e12})
    since = max([e.id for e in web.store.audit.page(limit=1).items] or [0])
    ask = {"action": "discard", "filter": {"queue": MAINTENANCE_QUEUE}}
    body = web.client.post("/api/v1/bulk/jobs", json=ask).json()
    assert body["dry_run"] is True and body["count"] == 3 and body["left"] == []
    assert _state(web) == (0, 3) and all(_job_keys(web, i) for i in ids)  # nothing changed
    page = web.client.get(f"/jobs/bulk?queue={MAINTENANCE_QUEUE}&action=discard")
    assert "3</strong> failed jobs would be deleted for good" in page.text
    retry_dry = web.client.post("/api/v1/bulk/jobs", json={**ask, "action": "retry"}).json()
    assert retry_dry["count"] == 2 and retry_dry["left"] == ["planted"]

    token = web.csrf(f"/jobs/bulk?queue={MAINTENANCE_QUEUE}&action=discard")
    form = {"csrf": token, "queue": MAINTENANCE_QUEUE, "action": "discard", "why": "obsolete"}
    posted = web.client.post("/jobs/bulk", data={**form, "count": "3", "digest": body["digest"]})
    assert posted.status_code == 200, posted.text
    assert "Discarded 3 failed jobs of engram-maintenance" in posted.text  # what was done
    assert _state(web) == (0, 0)
    assert [_job_keys(web, i) for i in [*ids, "planted"]] == [0, 0, 0]  # data and results gone
    rows = [e for e in web.store.audit.page(limit=50).items if e.id > since]
    assert sorted(e.target for e in rows) == sorted([*ids, "planted"])
    assert {(e.action, e.detail["reason"], e.detail["bulk"]) for e in rows} == {
        ("job.discard", "obsolete", 3)
    }


def test_a_single_discard_asks_first_and_refuses_a_job_that_did_not_fail(
    web: Web, redis_url: str
) -> None:
    first, second = _failed_jobs(web, redis_url, 2)
    asked = web.client.get(f"/jobs/{first}/discard")
    assert asked.status_code == 200 and "This cannot be undone" in asked.text
    assert _state(web) == (0, 2)  # asking changed nothing
    done = web.client.post(f"/api/v1/jobs/{first}/discard", json={"reason": "a test job"})
    assert done.status_code == 200 and done.json()["id"] == first
    assert _state(web) == (0, 1) and _job_keys(web, first) == 0
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    waiting = enqueue_failing(queue, "mem_waiting")
    refused = web.client.post(f"/api/v1/jobs/{waiting.id}/discard", json={})
    assert refused.status_code == 422 and "only a failed job" in refused.json()["error"]["message"]
    assert len(queue) == 1 and _job_keys(web, waiting.id) == 1  # still queued, untouched
    missing = web.client.post("/api/v1/jobs/no-such-job/discard", json={})
    assert missing.status_code == 404
    [entry] = [e for e in web.store.audit.page(limit=10).items if e.target == first]
    assert (entry.action, entry.detail["reason"]) == ("job.discard", "a test job")
    assert _job_keys(web, second) == 2  # the other failed job is untouched: data, results


def test_a_bulk_retry_leaves_a_listed_job_that_did_not_fail_and_does_all_it_showed(
    web: Web, redis_url: str
) -> None:
    """A job among the failed ones whose own state is another (here: queued again by
    hand, still listed) is left by the dry run, with why; the confirm retries every job
    the dry run took, all of them, and touches that one not."""
    first, second, third = _failed_jobs(web, redis_url, 3)
    web.redis.hset(f"rq:job:{second}", "status", "finished")
    ask = {"action": "retry", "filter": {"queue": MAINTENANCE_QUEUE}}
    dry = web.client.post("/api/v1/bulk/jobs", json=ask).json()
    assert dry["count"] == 2 and sorted(j["id"] for j in dry["items"]) == sorted([first, third])
    assert (dry["left"], dry["left_why"]) == ([second], {second: "finished, not failed"})
    page = web.client.get(f"/jobs/bulk?queue={MAINTENANCE_QUEUE}").text
    assert "2</strong> failed jobs would be put back" in page
    assert f"{second}</a>: finished, not failed" in page
    done = web.client.post("/api/v1/bulk/jobs", json={**ask, "confirm": dry["confirm"]})
    assert done.status_code == 200, done.text
    assert (done.json()["skipped"], done.json()["left"]) == ([], [second])
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    assert sorted(queue.get_job_ids()) == sorted([first, third])
    assert queue.failed_job_registry.get_job_ids(cleanup=False) == [second]  # untouched
    # A discard takes every job listed among the failed ones, as one discard does.
    discard = web.client.post("/api/v1/bulk/jobs", json={**ask, "action": "discard"}).json()
    assert (discard["count"], discard["left"]) == (1, [])


def test_a_job_that_changed_while_a_bulk_retry_went_on_is_skipped_and_said(
    web: Web, redis_url: str
) -> None:
    """The confirm plans again and acts on each job in turn; one the single retry then
    refuses (here: listed in this queue's failed jobs, its hash names another queue, so
    it is in none of that queue's) is skipped and reported, and the others are done."""
    first, second = _failed_jobs(web, redis_url, 2)
    web.redis.hset(f"rq:job:{second}", "origin", REDACTION_QUEUE)
    ask = {"action": "retry", "filter": {"queue": MAINTENANCE_QUEUE}}
    dry = web.client.post("/api/v1/bulk/jobs", json=ask).json()
    assert dry["count"] == 2
    done = web.client.post("/api/v1/bulk/jobs", json={**ask, "confirm": dry["confirm"]})
    assert done.status_code == 200, done.text
    assert done.json()["skipped"] == [
        {"id": second, "reason": f"job {second} is no longer in the failed jobs"}
    ]
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    assert queue.get_job_ids() == [first]
    assert [e.target for e in web.store.audit.page(limit=1).items] == [first]

    # The form says the same, above what a retry would take now.
    web.redis.hset(f"rq:job:{first}", "status", "failed")  # listed again, failed again
    web.redis.zadd(queue.failed_job_registry.key, {first: 9e12})
    web.redis.lrem(queue.key, 0, first)
    token = web.csrf(f"/jobs/bulk?queue={MAINTENANCE_QUEUE}")
    dry = web.client.post("/api/v1/bulk/jobs", json=ask).json()
    form = {"csrf": token, "queue": MAINTENANCE_QUEUE, "action": "retry", "why": "again"}
    posted = web.client.post("/jobs/bulk", data={**form, "count": "2", "digest": dry["digest"]})
    assert posted.status_code == 200, posted.text
    assert "1 of the 2 confirmed were retried; 1 changed" in posted.text
    assert f"{second}</a>: job {second} is no longer in the failed jobs" in posted.text
