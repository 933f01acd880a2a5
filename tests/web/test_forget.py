"""Forgetting a record from the dashboard: confirmation, CSRF-protected POST through the
streams, the operation followed to its receipt, then only a tombstone left."""

from __future__ import annotations

import contextlib
import re
from typing import Any
from urllib.parse import urlencode

import psycopg
import redis

from engram.jobs import redaction
from engram.worker import keys
from tests.helpers import rows_containing
from tests.redis_fixtures import FAST, wait_until
from tests.web_fixtures import Web

SECRET = "Ada's passport number is X1234567."


def entries_added(web: Web) -> int:
    """How many operations were ever enqueued on the partition streams: what a refusal
    leaves as it was. (A stream's length is no measure: it falls as the worker
    acknowledges, a moment after the receipt a test waited for.)"""
    added = 0
    for p in range(FAST.partitions):
        with contextlib.suppress(redis.ResponseError):  # no such stream: none added
            added += int(web.redis.xinfo_stream(keys.stream(p))["entries-added"])
    return added


def test_forget_from_the_dashboard_leaves_only_a_tombstone(
    web: Web,
    start_worker: Any,
    jobs_processes: Any,
    scope: dict[str, str],
    dsn: str,
    redis_url: str,
) -> None:
    # The real redaction: the worker hands the forget to an ``engram jobs`` process.
    jobs_processes(database_url=dsn, redis_url=redis_url)
    with start_worker(web.store, on_forget=redaction.hand_over):
        rid = web.producer.remember(scope, SECRET).wait(10).records[0].id
        web.producer.revise(scope, rid, text=SECRET + " Renewed.", expected_revision=1).wait(10)
        confirm = web.client.get(f"/forget/{rid}")
        assert confirm.status_code == 200 and "2 revision(s)" in confirm.text
        assert "This cannot be undone." in confirm.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', confirm.text).group(1)  # type: ignore[union-attr]

        # Without the form's token, or with a forged one, nothing is enqueued.
        enqueued = entries_added(web)
        for data in ({}, {"csrf": "0" * 40}):
            refused = web.client.post(f"/forget/{rid}", data=data)
            assert refused.status_code == 403 and "CSRF" in refused.text
        assert entries_added(web) == enqueued and web.store.get(scope, rid) is not None

        posted = web.client.post(f"/forget/{rid}", data={"csrf": csrf})
        assert posted.status_code == 303
        status_url = posted.headers["location"]
        assert status_url.startswith("/operations/dashboard:forget:")

        def page_when(badge: str) -> str | None:
            html = web.client.get(status_url, headers={"HX-Request": "true"}).text
            return html if f"badge {badge}" in html else None

        html = wait_until(lambda: page_when("committed"), what="the forget committed")
        if "badge complete" not in html:
            assert "badge pending" in html and "hx-trigger" in html, "pending: it polls"
        html = wait_until(
            lambda: page_when("complete"), timeout=60, what="the redaction to complete"
        )
    assert "hx-trigger" not in html, "done: no more polling"
    assert 'id="redaction"' in html and "badge complete" in html
    assert "revisions deleted</dt><dd>1, 2" in html
    link = f'href="/records/{rid}?{urlencode(scope)}">{rid}</a>'  # a record id is its scope's
    assert f'{link} <span class="badge forgotten">' in html

    # An operation id is its scope's: the page is told whose (?user_id=...).
    op_id, _, query = status_url.removeprefix("/operations/").partition("?")
    assert query == urlencode(web.store.browse.receipt(op_id).receipt.scope.as_dict())  # type: ignore[union-attr]
    receipt = web.store.browse.receipt(op_id)
    assert receipt is not None and receipt.receipt.requested_by == "local"
    assert receipt.named_record == rid

    tombstone = web.client.get(f"/records/{rid}")
    assert tombstone.status_code == 200 and 'id="tombstone"' in tombstone.text
    assert "passport" not in tombstone.text
    sid = web.scope_id(scope)
    assert (
        f'>{rid}</a> <span class="badge forgotten">'
        in web.client.get(f"/scopes/{sid}?status=forgotten").text
    )
    assert op_id in web.client.get("/audit").text
    with psycopg.connect(dsn) as conn:
        assert rows_containing(conn, "passport number") == []


def test_forgetting_an_unknown_record_enqueues_nothing(web: Web) -> None:
    web.remember({"user_id": "someone"}, "A note.")
    csrf = web.csrf()
    missing = web.client.post("/forget/mem_never_was", data={"csrf": csrf})
    assert missing.status_code == 404
    assert web.client.get("/forget/mem_never_was").status_code == 404
    assert entries_added(web) == 0


def test_a_forget_s_why_is_kept_in_the_audit_trail_and_shown_on_its_tombstone(
    web: Web, start_worker: Any, scope: dict[str, str]
) -> None:
    with start_worker(web.store):
        one = web.producer.remember(scope, "Ada's locker code is 4411.").wait(10).records[0].id
        two = web.producer.remember(scope, "Ada's gym is on Elm St.").wait(10).records[0].id
        token = web.csrf(f"/forget/{one}")
        assert 'name="why"' in web.client.get(f"/forget/{one}").text
        posted = web.client.post(
            f"/forget/{one}", data={"csrf": token, "why": "she asked us to, ticket 88"}
        )
        assert posted.status_code == 303
        op_id = posted.headers["location"].rsplit("/", 1)[1].partition("?")[0]
        wait_until(lambda: web.store.get(scope, one) is None, what="the first forget")

        # Through the API: the reason goes with a forget only, and is checked first.
        forget = {"kind": "forget", "scope": scope, "request": {"id": two}}
        enqueued, audited = entries_added(web), len(web.store.audit.about(two))
        assert enqueued == 3  # the two remembers and the first forget
        for body in (
            {**forget, "reason": "x" * 201},
            {"kind": "retract", "scope": scope, "request": {"id": two}, "reason": "no"},
        ):
            refused = web.client.post("/api/v1/operations", json=body)
            assert refused.status_code in (400, 422), refused.text
        assert (entries_added(web), len(web.store.audit.about(two))) == (enqueued, audited)
        sent = web.client.post("/api/v1/operations?wait=10", json={**forget, "reason": "GDPR"})
        assert sent.status_code == 200, sent.text
        assert entries_added(web) == enqueued + 1

    scope_id = web.store.scope_id(scope)
    [row] = web.store.audit.about(one)
    assert (row.requested_by, row.action, row.detail) == (
        "local",
        "record.forget",
        # The scope too: the same id in another scope is another record (issue 36).
        {"operation_id": op_id, "reason": "she asked us to, ticket 88", "scope_id": scope_id},
    )
    [api_row] = web.store.audit.about(two)
    assert (api_row.action, api_row.detail["reason"]) == ("record.forget", "GDPR")
    tombstone = web.client.get(f"/records/{one}").text
    assert 'class="forget-reason">she asked us to, ticket 88<' in tombstone
    assert "Asked for by local" in tombstone
