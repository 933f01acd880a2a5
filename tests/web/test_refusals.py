"""A refused form is never a dead end, and a done action says what it did (issue 29,
item 7): a bulk confirmation refused because its selection changed (409) shows the dry
run of what matches now with the filter and the why as typed; a reembed refused (422)
shows the form as typed, why, and the model names there are; a model name is matched
in any case; a bulk retry or discard that succeeded names what it did, with links."""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import urlencode

from rq import Queue

from engram.jobs.keys import MAINTENANCE_QUEUE
from engram.jobs.queues import SERIALIZER
from engram.worker import keys
from tests.rq_jobs import enqueue_failing, work
from tests.web.test_bulk import letter, stream
from tests.web.test_jobs import _failed_jobs
from tests.web_fixtures import Web

WHY = "replayed after the outage, ticket 7"


def field(html: str, name: str) -> str:
    """The value of the form field ``name`` (the first one) on a page."""
    found = re.search(rf'name="{name}"[^>]*value="([^"]*)"', html)
    assert found, f"no field {name}"
    return unescape(found[1])


def dry_run_form(web: Web, url: str, *names: str) -> dict[str, str]:
    html = web.client.get(url).text
    return {"csrf": web.csrf(url), **{n: field(html, n) for n in names}}


def test_a_changed_selection_shows_what_matches_now_with_the_filter_and_why(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    letter(web, "failed", user="a")
    kept = letter(web, "deliveries")
    url = "/dead-letters/bulk?action=discard&reason=failed"
    form = dry_run_form(web, url, "action", "reason", "partition", "count", "digest")
    late = letter(web, "failed", user="b")  # the selection changes after the dry run
    refused = web.client.post("/dead-letters/bulk", data={**form, "why": WHY})
    assert refused.status_code == 409
    html = refused.text
    assert "selection_changed" in html and 'id="bulk-refused"' in html
    assert "Nothing was done" in html and "confirm again" in html
    # The operator's input is kept: the filter, the why; the count is what matches now.
    assert field(html, "why") == WHY and field(html, "reason") == "failed"
    assert field(html, "count") == "2" and late in html
    assert len(stream(web)) == 3  # nothing done
    again = {**form, "count": field(html, "count"), "digest": field(html, "digest"), "why": WHY}
    done = web.client.post("/dead-letters/bulk", data=again)
    assert done.status_code == 200 and [i.decode() for i, _ in stream(web)] == [kept]
    assert "Discarded 2 dead letters" in done.text and "None." not in done.text
    assert 'href="/dead-letters?reason=failed"' in done.text and 'href="/audit"' in done.text


def test_a_bulk_retry_names_each_operation_to_follow(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    first, second = letter(web, "failed", user="a"), letter(web, "failed", user="b")
    ops = {f[b"operation_id"].decode(): json.loads(f[b"op"])["scope"] for _, f in stream(web)}
    url = "/dead-letters/bulk?action=retry&reason=failed"
    form = dry_run_form(web, url, "action", "reason", "count", "digest")
    done = web.client.post("/dead-letters/bulk", data={**form, "why": WHY})
    assert done.status_code == 200, done.text
    assert "Retried 2 dead letters" in done.text and first in done.text and second in done.text
    for op, scope in ops.items():  # an operation id is its scope's: the link names it
        assert f'href="/operations/{op}?{urlencode(scope)}"' in done.text
    assert "partition " in done.text and "ticket 7" in done.text


def test_a_bulk_jobs_refusal_keeps_the_why_and_a_success_says_what_it_did(
    web: Web, redis_url: str
) -> None:
    ids = _failed_jobs(web, redis_url, 2)
    url = f"/jobs/bulk?queue={MAINTENANCE_QUEUE}"
    form = dry_run_form(web, url, "queue", "action", "count", "digest")
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    late = enqueue_failing(queue, "mem_late")
    work(web.store, redis_url, web.redis, queue)
    refused = web.client.post("/jobs/bulk", data={**form, "why": WHY})
    assert refused.status_code == 409 and 'id="bulk-refused"' in refused.text
    assert field(refused.text, "why") == WHY and field(refused.text, "count") == "3"
    again = {**form, "count": "3", "digest": field(refused.text, "digest"), "why": WHY}
    done = web.client.post("/jobs/bulk", data=again)
    assert done.status_code == 200, done.text
    assert f"Retried 3 failed jobs of {MAINTENANCE_QUEUE}" in done.text
    for job_id in [*ids, late.id]:
        assert f'href="/jobs/{job_id}"' in done.text
    assert f'href="/jobs?queue={MAINTENANCE_QUEUE}&amp;state=queued"' in done.text


def test_a_refused_reembed_keeps_what_was_typed_and_names_the_models(web: Web) -> None:
    csrf = web.csrf("/generations")
    typed = {"csrf": csrf, "model": "sentence-transformers/MiniLM-L6", "why": "a better model"}
    refused = web.client.post("/generations/reembed", data=typed)
    assert refused.status_code == 422 and web.starts == []
    html = refused.text
    assert "unregistered_model" in html and 'id="reembed-refused"' in html
    assert field(html, "model") == typed["model"] and field(html, "why") == "a better model"
    assert "wordllama[:DIMS], minilm, hashing[:DIMS]" in html  # what to ask for instead
    assert "<h1>Embedding generations</h1>" in html  # the page, not a bare "422"


def test_a_model_name_in_any_case_starts_that_model_and_says_so(web: Web) -> None:
    csrf = web.csrf("/generations")
    started = web.client.post(
        "/generations/reembed", data={"csrf": csrf, "model": "MiniLM", "confirm": "yes"}
    )
    assert started.status_code == 303 and web.starts == [("minilm", "local")]
    assert started.headers["location"] == "/generations?started=reembed-1"
    page = web.client.get(started.headers["location"]).text
    assert 'id="reembed-started"' in page and 'href="/jobs/reembed-1"' in page
    assert web.client.get("/generations?started=..%2Fx").status_code == 400


def test_an_error_page_leads_back_to_the_form_it_came_from(web: Web) -> None:
    csrf = web.csrf("/generations")
    back = "http://127.0.0.1:8700/dead-letters/bulk?action=retry&reason=failed"
    bad = web.client.post(
        "/dead-letters/bulk",
        data={"csrf": csrf, "action": "retry", "partition": "x"},
        headers={"referer": back},
    )
    assert bad.status_code == 400
    assert 'href="/dead-letters/bulk?action=retry&amp;reason=failed"' in bad.text
    elsewhere = web.client.post(
        "/dead-letters/bulk",
        data={"csrf": csrf, "action": "retry", "partition": "x"},
        headers={"referer": "http://127.0.0.1:8700//evil.example/x"},
    )
    assert 'id="go-back"' not in elsewhere.text
