"""Job data in Redis is untrusted: the jobs pages and the jobs API (``web.rqjobs``) read
it as JSON only. A planted pickle that would create a file when unpickled creates
nothing, and its job shows as "unreadable"; engram's own jobs name their function. A
JSON job of any other function is unreadable too: never retried, one or in bulk."""

from __future__ import annotations

import pickle
import zlib
from pathlib import Path
from typing import Any

import pytest
from rq import Queue

from engram.jobs import keys, prune, queues
from engram.web import rqjobs
from tests.helpers import Planted
from tests.rq_jobs import enqueue_failing, work
from tests.web_fixtures import Web

QUEUE = keys.MAINTENANCE_QUEUE


def _plant(web: Web, job_id: str, path: Path, *, compressed: bool, **fields: Any) -> None:
    payload = pickle.dumps(Planted(path))
    data = zlib.compress(payload) if compressed else payload
    web.redis.hset(
        f"rq:job:{job_id}",
        mapping={
            "data": data,
            "meta": payload,
            "origin": QUEUE,
            "description": job_id,
            "created_at": "2024-01-01T00:00:00.000000Z",
            **fields,
        },
    )


@pytest.fixture
def planted(web: Web, tmp_path: Path) -> Path:
    """A failed job and a queued job whose data and meta are pickles, and one whose
    hash is garbage; the file any unpickling would create."""
    path = tmp_path / "pwned"
    _plant(web, "planted-failed", path, compressed=True, status="failed")
    web.redis.zadd(f"rq:failed:{QUEUE}", {"planted-failed": 9_999_999_999})
    _plant(web, "planted-queued", path, compressed=False, status="queued")
    web.redis.rpush(f"rq:queue:{QUEUE}", "planted-queued")
    _plant(web, "planted-garbled", path, compressed=False, status="failed", created_at="\xff?")
    web.redis.zadd(f"rq:failed:{QUEUE}", {"planted-garbled": 9_999_999_998})
    return path


def test_planted_pickles_are_never_unpickled_and_show_as_unreadable(
    web: Web, planted: Path
) -> None:
    real = prune.enqueue(web.redis, "history")  # an engram job, JSON, never run here
    pages = [
        "/",
        "/jobs",
        f"/jobs?queue={QUEUE}&state=failed",
        f"/jobs?queue={QUEUE}&state=queued",
        "/jobs/planted-failed",
        "/jobs/planted-queued",
        "/jobs/planted-garbled",
    ]
    for path in pages:
        response = web.client.get(path)
        assert response.status_code == 200, (path, response.text[:300])
        assert not planted.exists(), path
    assert "unreadable" in web.client.get(f"/jobs?queue={QUEUE}&state=failed").text
    assert "unreadable" in web.client.get("/jobs/planted-failed").text
    queued = web.client.get(f"/jobs?queue={QUEUE}&state=queued").text
    assert "unreadable" in queued and "engram.jobs.prune.prune_job" in queued

    failed = web.client.get(f"/api/v1/jobs?queue={QUEUE}&state=failed")
    assert failed.status_code == 200
    assert {(j["id"], j["function"], j["arguments"]) for j in failed.json()["items"]} == {
        ("planted-failed", "unreadable", "unreadable"),
        ("planted-garbled", "unreadable", "unreadable"),
    }
    items = web.client.get(f"/api/v1/jobs?queue={QUEUE}&state=queued").json()["items"]
    assert {j["id"]: j["function"] for j in items} == {
        "planted-queued": "unreadable",
        real: "engram.jobs.prune.prune_job",
    }
    assert web.client.get(f"/api/v1/jobs/{real}").json()["arguments"] == "'history', None"
    one = web.client.get("/api/v1/jobs/planted-failed")
    assert one.status_code == 200 and one.json()["function"] == "unreadable"

    # Retrying one would hand it to a worker: refused, and it stays where it was.
    retried = web.client.post("/api/v1/jobs/planted-failed/retry")
    assert retried.status_code == 422 and "unreadable" in retried.json()["error"]["message"]
    assert web.redis.zscore(f"rq:failed:{QUEUE}", "planted-failed") is not None

    # The one reader of jobs (``web.rqjobs``, under the pages and the API) in its own words.
    assert not rqjobs.get(web.redis, "planted-failed").readable  # type: ignore[union-attr]
    assert not rqjobs.get(web.redis, "planted-queued").readable  # type: ignore[union-attr]
    assert real.startswith("prune-history-")
    assert queues.fetch(web.redis, "planted-failed") is None
    assert not planted.exists()


def _plant_failed_json(web: Web, function: str, *args: Any) -> str:
    """A failed job in JSON, as RQ would leave one, naming ``function``: its id."""
    queue = Queue(QUEUE, connection=web.redis, serializer=queues.SERIALIZER)
    job = queue.enqueue(function, *args)
    web.redis.lrem(queue.key, 0, job.id)
    web.redis.hset(job.key, "status", "failed")
    web.redis.zadd(queue.failed_job_registry.key, {job.id: 9_999_999_999})
    return str(job.id)


def test_a_failed_job_of_another_function_is_never_retried_nor_run(
    web: Web, redis_url: str, tmp_path: Path
) -> None:
    bait = tmp_path / "made"
    queue = Queue(QUEUE, connection=web.redis, serializer=queues.SERIALIZER)
    web.redis.delete(queue.key, queue.failed_job_registry.key)
    foreign = _plant_failed_json(web, "os.makedirs", str(bait))
    own = enqueue_failing(queue, "mem_1").id
    work(web.store, redis_url, web.redis, queue)  # the engram job fails for real
    listed = web.client.get(f"/api/v1/jobs?queue={QUEUE}&state=failed").json()["items"]
    assert {j["id"]: j["function"] for j in listed} == {
        foreign: "unreadable",
        own: "engram.jobs.prune.prune_job",
    }
    assert "unreadable" in web.client.get(f"/jobs/{foreign}").text

    # One at a time: the API and the form refuse it; it stays among the failed jobs.
    refused = web.client.post(f"/api/v1/jobs/{foreign}/retry", json={})
    assert refused.status_code == 422 and "unreadable" in refused.json()["error"]["message"]
    form = web.client.post(f"/jobs/{foreign}/retry", data={"csrf": web.csrf(f"/jobs/{own}")})
    assert form.status_code == 422
    # In bulk: left, and why; the confirm retries the engram job only.
    ask = {"action": "retry", "filter": {"queue": QUEUE}}
    dry = web.client.post("/api/v1/bulk/jobs", json=ask).json()
    assert (dry["count"], [j["id"] for j in dry["items"]]) == (1, [own])
    assert (dry["left"], dry["left_why"]) == ([foreign], {foreign: "unreadable"})
    page = web.client.get(f"/jobs/bulk?queue={QUEUE}").text
    assert f"{foreign}</a>: unreadable" in page
    done = web.client.post("/api/v1/bulk/jobs", json={**ask, "confirm": dry["confirm"]})
    assert done.status_code == 200 and done.json()["skipped"] == []
    assert queue.get_job_ids() == [own]
    assert web.redis.zscore(queue.failed_job_registry.key, foreign) is not None

    # Whatever now takes the queue (a plain RQ worker here: no check of its own) never
    # meets it.
    work(web.store, redis_url, web.redis, queue)
    assert not bait.exists()
    assert [a.target for a in web.store.audit.page(limit=20).items if a.action == "job.retry"][
        :1
    ] == [own]


def test_a_planted_job_set_aside_reads_as_failed_and_can_be_discarded(
    web: Web, tmp_path: Path
) -> None:
    """Issue 42, item 6: a planted job the jobs worker set aside (its hash still says
    ``queued``) was listed among the failed jobs as "enqueued never", its page's badge
    said "queued" and offered no Discard, though the docs say such a job can be."""
    _plant(web, "planted-set-aside", tmp_path / "pwned", compressed=False, status="queued")
    queues.set_aside(web.redis, "planted-set-aside", QUEUE)  # what the jobs worker does
    page = web.client.get("/jobs/planted-set-aside").text
    assert 'id="job-state">failed</span>' in page
    assert "badge queued" not in page
    assert 'id="discard" href="/jobs/planted-set-aside/discard"' in page
    assert "set it aside among the failed jobs" in page
    listed = web.client.get(f"/jobs?queue={QUEUE}&state=failed").text
    row = listed.split('href="/jobs/planted-set-aside"', 1)[1].split("</tr>", 1)[0]
    assert "never" not in row and 'data-label="enqueued">unknown<' in row
    assert web.client.get("/api/v1/jobs/planted-set-aside").json()["state"] == "failed"

    asked = web.client.get("/jobs/planted-set-aside/discard").text
    assert 'id="confirm-discard"' in asked and "Only a failed job" not in asked
    csrf = web.csrf("/jobs/planted-set-aside/discard")
    gone = web.client.post("/jobs/planted-set-aside/discard", data={"csrf": csrf, "why": "planted"})
    assert gone.status_code == 303
    assert web.redis.zscore(f"rq:failed:{QUEUE}", "planted-set-aside") is None
    assert not web.redis.exists("rq:job:planted-set-aside")
    [row_] = [e for e in web.store.audit.about("planted-set-aside") if e.action == "job.discard"]
    assert row_.detail == {"queue": QUEUE, "reason": "planted"}
    assert not (tmp_path / "pwned").exists()
