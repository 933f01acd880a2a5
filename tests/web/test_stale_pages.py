"""Pages that stop changing say what they showed and when (issue 42, item 9): a
generation no longer polled gives the time of its last update, not a frozen "0 s ago";
a retried job's page follows its new run instead of showing the last run's traceback
under "started"; the overview claims to refresh itself only where it does (with
JavaScript on: Chromium, in tests/web/test_operator_browser.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rq import Queue

from engram.jobs.keys import MAINTENANCE_QUEUE
from engram.jobs.queues import SERIALIZER
from engram.web.render import format_time
from tests.rq_jobs import enqueue_failing, work
from tests.web_fixtures import Web

HTMX = {"HX-Request": "true"}


def test_a_generation_no_longer_polled_says_when_it_was_updated(web: Web) -> None:
    web.remember({"user_id": "stale"}, "Some text.")
    pending = web.store.embeddings.begin("stale-model", 12)
    updated = datetime.now(UTC) - timedelta(seconds=30)
    progress = {
        "state": "cancelled", "pass": 1, "done": 4, "total": 10, "skipped": 0, "errors": 0,
        "started_at": (updated - timedelta(minutes=5)).isoformat(),
        "updated_at": updated.isoformat(), "requested_by": "grace", "job_id": "job-s",
    }  # fmt: skip
    web.store.embeddings.set_progress(pending.id, progress)
    part = web.client.get("/generations", headers=HTMX).text
    row = part.split(f'id="progress-{pending.id}"', 1)[1].split("</tr>", 1)[0]
    assert 'hx-trigger="every 2s"' not in part  # not polled: nothing of it will change
    assert f'updated <span class="nowrap updated-at">{format_time(updated)}</span>' in row
    assert " s ago" not in row


def test_a_retried_jobs_page_follows_its_new_run(web: Web, redis_url: str) -> None:
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    job = enqueue_failing(queue, "mem_stale")
    work(web.store, redis_url, web.redis, queue)
    failed = web.client.get(f"/jobs/{job.id}").text
    assert 'id="job-state">failed<' in failed and "Why it failed:" in failed
    assert 'hx-trigger="every 2s"' not in failed
    csrf = web.csrf(f"/jobs/{job.id}")
    assert web.client.post(f"/jobs/{job.id}/retry", data={"csrf": csrf}).status_code == 303
    queued = web.client.get(f"/jobs/{job.id}").text
    assert 'id="job-state">queued<' in queued
    # The last run's failure is not this run's: shown as an earlier run's, and the page
    # polls until this one ends.
    assert "Why it failed:" not in queued and 'id="earlier-run"' in queued
    assert 'hx-get="/jobs/' in queued and 'hx-trigger="every 2s"' in queued
    work(web.store, redis_url, web.redis, queue)  # it fails again
    polled = web.client.get(f"/jobs/{job.id}", headers=HTMX).text
    assert polled.lstrip().startswith('<div id="job"')
    assert 'id="job-state">failed<' in polled and "Why it failed:" in polled
    assert 'hx-trigger="every 2s"' not in polled  # settled: the poll ends


def test_the_overview_says_it_refreshes_only_with_the_script(web: Web) -> None:
    html = web.client.get("/").text
    assert '<span class="with-js" id="refreshes">; this page refreshes itself' in html
    assert '<noscript><p class="small notice" id="no-refresh">' in html
    assert 'id="overview-as-of">As of ' in html


def test_a_next_page_link_from_before_a_restart_leads_to_the_lists_start(web: Web) -> None:
    """Issue 42, item 11: without a dashboard token, a restart signs cursors with a new
    key, and an old "next page" link answered a bare 400."""
    for path, query in [
        ("/dead-letters", "reason=failed&cursor=AAAA.bad"),
        ("/receipts", "kind=forget&cursor=AAAA.bad"),
        ("/audit", "action=job.retry&cursor=AAAA.bad"),
        ("/scopes", "user_id=ada&cursor=AAAA.bad"),
    ]:
        answer = web.client.get(f"{path}?{query}")
        assert answer.status_code == 400, path
        start = query.split("&cursor=", 1)[0]
        assert 'id="list-moved-on"' in answer.text, path
        assert f'<a href="{path}?{start}" id="list-start">' in answer.text, path
    api = web.client.get("/api/v1/receipts?cursor=AAAA.bad")
    assert api.status_code == 400 and api.json()["error"]["code"] == "invalid_request"
