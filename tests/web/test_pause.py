"""Pausing from the dashboard and the API: the overview shows what is paused (who, since
when, why) with real, CSRF-checked forms; every action leaves an audit row under the
operator signed in; the API does the same as JSON."""

from __future__ import annotations

from typing import Any

import pytest

from engram.worker.admin import pause
from tests.web_fixtures import Browser, Web

# Resolves when htmx has handled the next answer to one of its requests (swapped or not).
NEXT_HTMX_ANSWER = (
    "() => new Promise(done => document.addEventListener('htmx:afterRequest', done, {once: true}))"
)


def audit_rows(w: Web, action: str) -> list[Any]:
    return [e for e in w.store.audit.page(limit=200).items if e.action == action]


def test_the_overview_pauses_and_resumes_a_partition(web: Web) -> None:
    page = web.client.get("/").text
    assert "Nothing is paused." in page and 'action="/pause/partition"' in page
    token = web.csrf("/")
    before = len(audit_rows(web, "partition.pause"))

    # Without the CSRF token nothing happens.
    refused = web.client.post("/pause/partition", data={"partition": "2", "reason": "x"})
    assert refused.status_code == 403 and pause.paused_partitions(web.redis) == {}

    done = web.client.post(
        "/pause/partition",
        data={"csrf": token, "partition": "2", "reason": "<b>reindex</b>"},
    )
    assert (done.status_code, done.headers["location"]) == (303, "/")
    [(number, held)] = pause.paused_partitions(web.redis).items()
    assert (number, held.by, held.reason) == (2, "local", "<b>reindex</b>")
    page = web.client.get("/", headers={"HX-Request": "true"}).text
    assert "Partition <b>#2</b> paused by local" in page
    assert "&lt;b&gt;reindex&lt;/b&gt;" in page  # escaped, like any text
    assert 'action="/resume/partition/2"' in page
    [row, *_] = audit_rows(web, "partition.pause")
    assert len(audit_rows(web, "partition.pause")) == before + 1
    assert (row.requested_by, row.target, row.detail) == (
        "local",
        "2",
        {"reason": "<b>reindex</b>"},
    )

    assert web.client.post("/resume/partition/2", data={"csrf": token}).status_code == 303
    assert pause.paused_partitions(web.redis) == {}
    assert audit_rows(web, "partition.resume")[0].detail == {"was_paused": True}
    assert "Nothing is paused." in web.client.get("/").text

    out_of_range = web.client.post("/pause/partition", data={"csrf": token, "partition": "4"})
    assert out_of_range.status_code == 404 and pause.paused_partitions(web.redis) == {}
    garbled = web.client.post("/pause/partition", data={"csrf": token, "partition": "two"})
    assert garbled.status_code == 400


def test_a_reason_too_long_is_refused_not_cut_short(web: Web) -> None:
    """Issue 42, item 11: a 5,000-character pause reason was silently cut to 200 while a
    long reembed why was refused. One rule: past 200 characters, a 400 that changes
    nothing, from the forms as from the API."""
    token = web.csrf("/")
    before = len(audit_rows(web, "partition.pause"))
    long = "why " * 1250
    refused = web.client.post(
        "/pause/partition", data={"csrf": token, "partition": "1", "reason": long}
    )
    assert refused.status_code == 400 and "200 characters at most" in refused.text
    assert pause.paused_partitions(web.redis) == {}
    assert len(audit_rows(web, "partition.pause")) == before
    assert web.client.post("/pause/jobs", data={"csrf": token, "reason": long}).status_code == 400
    assert "Nothing is paused." in web.client.get("/").text
    held = web.client.post("/pause/partition", data={"csrf": token, "partition": "1"})
    assert held.status_code == 303
    resume = web.client.post("/resume/partition/1", data={"csrf": token, "reason": long})
    assert resume.status_code == 400 and set(pause.paused_partitions(web.redis)) == {1}
    assert web.client.post("/resume/partition/1", data={"csrf": token}).status_code == 303


def test_the_overview_pauses_and_resumes_the_jobs(web: Web) -> None:
    token = web.csrf("/")
    assert web.client.post("/pause/jobs", data={"csrf": token}).status_code == 303
    assert pause.jobs_paused(web.redis) is not None
    page = web.client.get("/").text
    assert "Jobs paused by local" in page and 'action="/resume/jobs"' in page
    assert 'action="/pause/jobs"' not in page
    assert audit_rows(web, "jobs.pause")[0].requested_by == "local"
    assert web.client.post("/resume/jobs", data={"csrf": token}).status_code == 303
    assert pause.jobs_paused(web.redis) is None
    assert audit_rows(web, "jobs.resume")[0].detail == {"was_paused": True}


def test_the_api_pauses_lists_and_resumes(web: Web) -> None:
    api = web.client
    paused = api.post("/api/v1/partitions/3/pause", json={"reason": "migration"})
    assert paused.status_code == 200
    body = paused.json()
    assert (body["partition"], body["paused"], body["by"], body["reason"]) == (
        3,
        True,
        "local",
        "migration",
    )
    assert api.post("/api/v1/queues/pause").status_code == 200  # no body: no reason
    listed = api.get("/api/v1/paused").json()
    assert [(p["partition"], p["reason"]) for p in listed["partitions"]] == [(3, "migration")]
    assert listed["jobs"]["paused"] is True and listed["jobs"]["by"] == "local"
    assert audit_rows(web, "partition.pause")[0].target == "3"

    assert api.post("/api/v1/partitions/4/pause", json={}).status_code == 404
    assert api.post("/api/v1/partitions/x/pause", json={}).status_code == 400
    assert api.post("/api/v1/partitions/1/pause", json={"why": "?"}).status_code == 422
    assert api.post("/api/v1/partitions/1/pause", json={"reason": "r" * 201}).status_code == 422
    form = api.post("/api/v1/partitions/1/pause", data={"reason": "x"})
    assert form.status_code == 415  # a cross-site form cannot send JSON
    assert pause.paused_numbers(web.redis) == {3}

    resumed = api.post("/api/v1/partitions/3/resume")
    assert resumed.json() == {"partition": 3, "paused": False, "was_paused": True}
    again = api.post("/api/v1/partitions/3/resume", json={})
    assert again.json()["was_paused"] is False
    assert api.post("/api/v1/queues/resume").json() == {"paused": False, "was_paused": True}
    assert api.get("/api/v1/paused").json() == {
        "partitions": [],
        "jobs": {"paused": False, "by": None, "at": None, "reason": ""},
    }
    # Pausing is a POST; its path is no job's.
    assert api.get("/api/v1/queues/pause").status_code == 405


@pytest.mark.usefixtures("web")
def test_a_pause_by_rq_itself_shows_as_paused(web: Web) -> None:
    from rq.suspension import suspend

    suspend(web.redis)
    assert web.client.get("/api/v1/paused").json()["jobs"]["by"] == "rq"
    pause.resume_jobs(web.redis)


def test_pause_and_resume_from_the_overview_in_chromium(
    serve_web: Any,
    browser: Browser,
    store: Any,
    dsn: str,
    redis_url: str,
) -> None:
    from playwright.sync_api import expect

    from engram.worker.embedded.runtime import connect_redis

    served = serve_web(database_url=dsn, redis_url=redis_url)
    client = connect_redis(redis_url)
    page = browser.page
    page.goto(served.url + "/")
    page.select_option("#pause-partition", "1")
    page.fill("#pause-reason", "reindexing")
    # What is typed survives the overview's poll (the fields are preserved by htmx).
    with page.expect_response(lambda r: r.url.rstrip("/") == served.url and r.ok):
        pass
    expect(page.locator("#pause-reason")).to_have_value("reindexing")
    page.get_by_role("button", name="Pause partition").click()
    expect(page.locator("#paused")).to_contain_text("Partition #1 paused by local")
    expect(page.locator("#paused")).to_contain_text("reindexing")
    assert pause.paused_numbers(client) == {1}
    browser.shot("overview-paused")
    # The why typed into Resume survives the poll too (issue 42, item 7): a swap of the
    # region (its "As of" time moves on) leaves it as typed, and it reaches the audit.
    page.fill("#resume-reason-1", "reindexed, all caught up")
    as_of = page.locator("#overview-as-of").inner_text()
    expect(page.locator("#overview-as-of")).not_to_have_text(as_of)
    expect(page.locator("#resume-reason-1")).to_have_value("reindexed, all caught up")
    page.get_by_role("button", name="Resume partition 1").click()
    expect(page.locator("#paused")).to_contain_text("Nothing is paused.")
    assert pause.paused_numbers(client) == set()
    [resumed] = [e for e in store.audit.page(limit=20).items if e.action == "partition.resume"][:1]
    assert resumed.detail.get("reason") == "reindexed, all caught up"
    # A press held across the overview's poll still clicks: the refresh does not swap
    # the button out from under the pointer (the browser would drop the click).
    page.get_by_role("button", name="Pause jobs").hover()
    page.mouse.down()
    page.evaluate(NEXT_HTMX_ANSWER)  # the poll, answered while the button is held
    page.mouse.up()
    expect(page.locator("#paused")).to_contain_text("Jobs paused by local")
    page.get_by_role("button", name="Resume jobs").click()
    expect(page.locator("#paused")).to_contain_text("Nothing is paused.")
    assert browser.dialogs == [] and not [m for m in browser.console if "pageerror" in m]
    client.close()
