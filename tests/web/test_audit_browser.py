"""In a real headless Chromium, served by ``engram web``: the audit trail filtered by
action and who asked, its details read as values; the dead letters searched by record
id and scope field; both usable at 1280 px and on a phone (390 px), no page scrolling
sideways."""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import expect

from engram.store import Operation, Store
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import encode_entry
from tests.web_fixtures import Browser, Served

SIDEWAYS = "document.scrollingElement.scrollWidth > document.scrollingElement.clientWidth"


def test_the_audit_trail_filtered_and_readable(
    serve_web: Callable[..., Served], fresh_store: Store, fresh_dsn: str, redis_url: str,
    browser: Browser,
) -> None:  # fmt: skip
    fresh_store.audit.record("grace", "jobs.pause", "jobs", {"reason": "disk full"})
    fresh_store.audit.record("grace", "jobs.resume", "jobs", {"was_paused": True})
    fresh_store.audit.record("alan", "partition.pause", "2", {})
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(served.url + "/audit")
    rows = page.locator("#audit")
    expect(rows).to_contain_text("was_paused: true")  # not Python's True
    expect(rows).to_contain_text('reason: "disk full"')
    page.get_by_label("asked by (exact)").fill("grace")
    page.get_by_label("asked by (exact)").press("Enter")
    expect(page).to_have_url(re.compile(r"by=grace"))
    expect(rows).not_to_contain_text("partition.pause")
    page.locator("select[name=action]").select_option("jobs.resume")
    expect(page).to_have_url(re.compile(r"action=jobs.resume"))
    expect(rows).not_to_contain_text("disk full")
    expect(rows).to_contain_text("was_paused: true")
    page.reload()
    expect(page.get_by_label("asked by (exact)")).to_have_value("grace")
    browser.shot("audit-1280")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(rows).to_contain_text("was_paused: true")
    assert page.evaluate(SIDEWAYS) is False
    browser.shot("audit-390")
    assert [m for m in browser.console if "Refused to" in m or "pageerror" in m] == []


def test_dead_letters_searched_by_record_and_scope(
    serve_web: Callable[..., Served], fresh_store: Store, fresh_dsn: str, redis_url: str,
    browser: Browser,
) -> None:  # fmt: skip
    client = connect_redis(redis_url)
    for user, record in (("ada", "mem-ada-1"), ("ada", "mem-shared"), ("bob", "mem-shared")):
        op = Operation.build("forget", {"user_id": user}, {"id": record}, f"op-{user}-{record}")
        client.xadd(keys.DEAD_LETTERS, {
            "partition": 0, "entry": "5-0", "operation_id": op.operation_id,
            "reason": "failed", "error": '{"code": "conflict", "message": "no"}',
            "deliveries": 1, "at_ms": 1764800000000, "op": encode_entry(op)["op"],
        })  # fmt: skip
    client.close()
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(served.url + "/dead-letters")
    rows = page.locator("#dead-letter-list")
    expect(rows).to_contain_text("op-bob-mem-shared")
    page.get_by_label("record id").fill("mem-shared")
    page.get_by_label("record id").press("Enter")
    expect(page).to_have_url(re.compile(r"record_id=mem-shared"))
    expect(rows).not_to_contain_text("op-ada-mem-ada-1")
    page.get_by_label("user_id").fill("ada")
    page.get_by_label("user_id").press("Enter")
    expect(rows).to_contain_text("op-ada-mem-shared")
    expect(rows).not_to_contain_text("op-bob-mem-shared")
    browser.shot("dead-letters-search-1280")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(page.get_by_label("record id")).to_have_value("mem-shared")
    assert page.evaluate(SIDEWAYS) is False
    browser.shot("dead-letters-search-390")
    assert [m for m in browser.console if "Refused to" in m or "pageerror" in m] == []
