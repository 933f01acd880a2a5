"""In a real headless Chromium, served by ``engram web``: a filter set in a list's form is
carried by the URL, shows only the matching rows, and survives a reload; the jobs list
hides the scheduled maintenance ticks until asked."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from engram.jobs.keys import MAINTENANCE_QUEUE
from engram.store import Operation, Store
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from tests.web.test_filters import T0, add_letter, seed_failed_jobs
from tests.web_fixtures import EMBEDDER, Browser, Served


@pytest.fixture
def served(serve_web: Callable[..., Served], fresh_dsn: str, redis_url: str) -> Served:
    """``engram web`` on this test's database and the suite's valkey."""
    return serve_web(database_url=fresh_dsn, redis_url=redis_url)


def test_receipts_filtered_by_scope_field_and_who_asked(
    served: Served, fresh_store: Store, browser: Browser
) -> None:
    for op_id, scope, by in [
        ("op-ada-agent", {"user_id": "ada", "agent_id": "x"}, "grace"),
        ("op-ada", {"user_id": "ada"}, "alan"),
        ("op-bob", {"user_id": "bob"}, "grace"),
    ]:
        op = Operation.build("remember", scope, {"text": "t"}, op_id, requested_by=by)
        fresh_store.execute([op], EMBEDDER)
    page = browser.page
    page.goto(served.url + "/receipts")
    rows = page.locator("#receipt-list")
    expect(rows).to_contain_text("op-bob")
    page.get_by_label("user_id", exact=True).fill("ada")
    page.get_by_label("user_id", exact=True).press("Enter")
    expect(page).to_have_url(re.compile(r"user_id=ada"))
    expect(rows).not_to_contain_text("op-bob")
    expect(rows).to_contain_text("op-ada-agent")
    page.get_by_label("asked by begins").fill("gra")
    page.get_by_label("asked by begins").press("Enter")
    expect(page).to_have_url(re.compile(r"requested_by_prefix=gra"))
    expect(rows).not_to_contain_text("op-ada<")
    expect(page.locator("#receipt-list tr")).to_have_count(2)  # the header and op-ada-agent
    page.reload()
    expect(page.get_by_label("user_id", exact=True)).to_have_value("ada")
    expect(page.get_by_label("asked by begins")).to_have_value("gra")
    expect(page.locator("#receipt-list tr")).to_have_count(2)
    expect(rows).to_contain_text("op-ada-agent")
    browser.shot("filters-receipts")
    assert [m for m in browser.console if "Refused to" in m or "pageerror" in m] == []


def test_dead_letters_filtered_by_kind_and_error_code(
    served: Served, redis_url: str, browser: Browser
) -> None:
    client = connect_redis(redis_url)
    client.delete(keys.DEAD_LETTERS)
    forget = add_letter(client, "failed", "dead_lettered", "forget", 0, T0)
    wanted = add_letter(client, "failed", "dead_lettered", "remember", 1, T0 + 1)
    other = add_letter(client, "failed", "store_unavailable", "remember", 1, T0 + 2)
    page = browser.page
    page.goto(served.url + "/dead-letters")
    expect(page.locator("#dead-letter-list tr")).to_have_count(4)
    page.get_by_label("kind").select_option("remember")
    page.get_by_label("error code").fill("dead_lettered")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(
        re.compile(r"kind=remember.*code=dead_lettered|code=dead_lettered.*kind=remember")
    )
    listed = page.locator("#dead-letter-list")
    expect(page.locator("#dead-letter-list tr")).to_have_count(2)
    expect(listed).to_contain_text(wanted)
    expect(listed).not_to_contain_text(forget)
    expect(listed).not_to_contain_text(other)
    page.reload()
    expect(page.get_by_label("error code")).to_have_value("dead_lettered")
    expect(page.get_by_label("kind")).to_have_value("remember")
    expect(page.locator("#dead-letter-list tr")).to_have_count(2)
    page.get_by_role("link", name="Discard all matching…").click()
    expect(page.locator(".bulk-count")).to_have_text("1")
    expect(page.locator(".bulk-filter")).to_contain_text("kind remember")
    # Exactly that code (issue 42, item 1): the dry run says how the code is matched.
    expect(page.locator(".bulk-filter")).to_contain_text("error code exactly dead_lettered")
    assert client.xlen(keys.DEAD_LETTERS) == 3
    browser.shot("filters-dead-letters")
    client.close()


def test_jobs_hide_the_maintenance_ticks_until_asked(
    served: Served, redis_url: str, browser: Browser
) -> None:
    client = connect_redis(redis_url)
    seed_failed_jobs(client)
    page = browser.page
    page.goto(f"{served.url}/jobs?queue={MAINTENANCE_QUEUE}&state=failed")
    jobs = page.locator("#jobs")
    expect(jobs).to_contain_text("3 maintenance ticks hidden on this page")
    expect(jobs).to_contain_text("prune-history-0123456789abcdef")
    expect(jobs).not_to_contain_text("index-large-scopes-9")
    page.get_by_label("show maintenance ticks").check()
    expect(page).to_have_url(re.compile(r"ticks=show"))
    expect(jobs).to_contain_text("index-large-scopes-9")
    expect(jobs).not_to_contain_text("hidden on this page")
    page.get_by_label("function").select_option("engram.jobs.prune.prune_job")
    expect(page).to_have_url(re.compile(r"function=engram.jobs.prune.prune_job"))
    expect(jobs).to_contain_text("prune-history-481234")
    expect(jobs).not_to_contain_text("index-large-scopes-9")
    page.reload()
    expect(page.get_by_label("show maintenance ticks")).to_be_checked()
    expect(page.get_by_label("function")).to_have_value("engram.jobs.prune.prune_job")
    expect(jobs).to_contain_text("prune-history-481234")
    expect(jobs).to_contain_text("prune-history-0123456789abcdef")
    page.get_by_label("show maintenance ticks").uncheck()
    expect(jobs).to_contain_text("1 maintenance tick hidden on this page")
    expect(jobs).not_to_contain_text("prune-history-481234")
    browser.shot("filters-jobs")
    assert [m for m in browser.console if "Refused to" in m or "pageerror" in m] == []
    client.close()


def test_scopes_narrow_as_you_type_and_leaving_the_field_does_not_reload_them(
    served: Served, fresh_store: Store, browser: Browser
) -> None:
    for user in ["ada", "ada-lovelace", "bob"]:
        op = Operation.build("remember", {"user_id": user}, {"text": "t"}, f"op-{user}")
        fresh_store.execute([op], EMBEDDER)
    page = browser.page
    page.goto(served.url + "/scopes")
    listed = page.locator("#scope-list")
    expect(listed).to_contain_text("user_id=bob")
    reloads: list[str] = []
    page.on("request", lambda r: reloads.append(r.url) if "/scopes?" in r.url else None)
    page.get_by_label("user_id").fill("ada")
    expect(listed).not_to_contain_text("user_id=bob")
    expect(listed).to_contain_text("user_id=ada-lovelace")
    expect(page).to_have_url(re.compile(r"user_id=ada"))
    assert len(reloads) == 1, reloads
    # A list swapped again as the field loses focus (a click on a row blurs it) can
    # swallow the click: the mouse goes down on one row and up on its replacement.
    # Such a reload would be sent at once, so before the next request below.
    page.get_by_label("user_id").blur()
    # The match select narrows as it changes, without the Find button.
    page.get_by_label("match").select_option("true")
    expect(listed).not_to_contain_text("user_id=ada-lovelace")
    expect(listed).to_contain_text("user_id=ada")
    expect(page).to_have_url(re.compile(r"exact=true"))
    assert len(reloads) == 2 and "exact=true" in reloads[1], reloads
    page.get_by_role("link", name="user_id=ada", exact=True).click()
    expect(page.locator("h1")).to_have_text("user_id=ada")
