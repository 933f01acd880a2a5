"""The dashboard in a real headless Chromium (Playwright), served by ``engram web`` on the
suite's PostgreSQL and valkey, with a stream worker committing what it enqueues.
Screenshots go to the test artifacts (``test-artifacts/``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import expect

from engram.jobs import redaction
from engram.store import Store
from engram.worker import Producer
from engram.worker.admin.metrics import BatchStats, record_batch
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import PLUGINS
from tests.redis_fixtures import wait_until
from tests.web_fixtures import EMBEDDER, TOKEN, Browser, Served

XSS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(2)>')


@dataclass
class Site:
    url: str
    store: Store
    producer: Producer


@pytest.fixture
def site(
    serve_web: Callable[..., Served],
    start_worker: Any,
    jobs_processes: Any,
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
) -> Iterator[Site]:
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)  # the forget listeners
    client = connect_redis(redis_url)
    with start_worker(fresh_store, on_forget=redaction.hand_over):
        yield Site(served.url, fresh_store, Producer(client, partitions=4))
    client.close()


def no_script_ran(browser: Browser) -> None:
    """Nothing the page did was refused by the CSP, failed, or opened a dialog."""
    assert browser.dialogs == []
    problems = [
        m
        for m in browser.console
        if m.startswith("pageerror")
        or "Content Security Policy" in m
        or "Refused to" in m
        or ("404" in m and "Failed to load resource" in m)
    ]
    assert problems == [], problems


def seed_people(site: Site) -> str:
    ada = {"user_id": "ada-lovelace", "agent_id": "tutor"}
    pending = [
        site.producer.remember(
            ada, "Ada lives in London.", metadata={"source": "signup form"}, id="mem_ada_home"
        ),
        site.producer.remember(ada, "Ada takes her tea with milk."),
        site.producer.remember(
            ada, "Ada has a cat named Babbage.", links=[{"relation": "about", "id": "mem_ada_home"}]
        ),
        site.producer.remember({"user_id": "bob"}, "Bob plays the cello."),
        site.producer.remember({"user_id": "carol"}, "Carol is allergic to peanuts."),
    ]
    for p in pending:
        p.wait(10)
    site.producer.revise(
        ada, "mem_ada_home", text="Ada lives in Paris.", importance=0.8,
        metadata={"source": "chat"}, expected_revision=1,
    ).wait(10)  # fmt: skip
    for i in range(40):
        site.producer.remember({"user_id": f"load-{i % 7}"}, f"Routine note number {i}.")
    return "mem_ada_home"


def chart_history(site: Site) -> None:
    """Give the overview's chart a quarter of an hour behind it, recorded as the workers
    record their batches (``record_batch``) but at past times: the screenshot shows a
    chart, not one bar."""
    now = time.time()
    pipe = site.producer.client.pipeline(transaction=False)
    for back in range(10, 900, 10):
        wave = 1 + math.sin(back / 90)
        stats = BatchStats(
            entries=0, committed=int(40 * wave + back % 17), replayed=int(3 * wave) % 4
        )
        if back % 130 == 0:
            stats.failed["revision_conflict"] += 2
        record_batch(pipe, stats, "screenshot", now_s=now - back)
    pipe.execute()


def test_find_a_scope_read_a_record_s_history_then_forget_it(site: Site, browser: Browser) -> None:
    record_id = seed_people(site)
    chart_history(site)
    page = browser.page
    page.goto(site.url + "/")
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator("svg.chart rect.committed").first).to_be_attached(timeout=15_000)
    expect(page.locator(".partitions .partition")).to_have_count(4)
    browser.shot("overview")

    # Find the scope by typing (htmx swaps the list in place), open it.
    page.get_by_role("link", name="Scopes", exact=True).click()
    page.get_by_label("user_id").fill("ada")
    expect(page.locator("#scope-list")).not_to_contain_text("bob")
    page.get_by_role("link", name="user_id=ada-lovelace, agent_id=tutor").click()
    expect(page.locator("h1")).to_have_text("user_id=ada-lovelace, agent_id=tutor")
    expect(page.locator("#records")).to_contain_text("Ada takes her tea with milk.")

    # Recall in it: hits with their score and match kind.
    page.get_by_label("what the agent would ask").fill("Does Ada live in Paris?")
    page.get_by_role("button", name="Recall").click()
    expect(page.locator("#recall tr").nth(1)).to_contain_text("Ada lives in Paris.")
    expect(page.locator("#recall .badge").first).to_have_text("hybrid")

    # The record: what changed between its revisions, and why it is remembered.
    page.get_by_role("link", name=record_id).first.click()
    expect(page.locator("h1")).to_have_text(record_id)
    latest = page.locator("#revision-2")
    expect(latest.locator(".diff del")).to_have_text("London.")
    expect(latest.locator(".diff ins")).to_have_text("Paris.")
    expect(latest.locator(".changes")).to_contain_text("importance")
    expect(latest.locator(".changes")).to_contain_text("metadata.source")
    expect(page.locator("#revision-1")).to_contain_text("Ada lives in London.")
    expect(page.get_by_text("about this ←")).to_be_visible()
    browser.shot("record-history")

    # Forget it: the confirmation, then the operation followed to its receipt.
    page.locator("#forget").click()
    expect(page.locator("h1")).to_contain_text("Forget")
    expect(page.get_by_text("This cannot be undone.")).to_be_visible()
    page.locator("#confirm-forget").click()
    expect(page.locator("#operation .badge").first).to_have_text("committed", timeout=15_000)
    # "pending", then "complete" once the jobs' listeners ran: the page polls until then.
    expect(page.locator("#redaction .badge")).to_have_text("complete", timeout=60_000)
    expect(page.locator("#operation")).to_contain_text("revisions deleted")
    browser.shot("forgotten")

    # Only a tombstone is left, in the record's place and in the scope's.
    page.locator("#operation").get_by_role("link", name=record_id).click()
    expect(page.locator("#tombstone")).to_contain_text("forgotten")
    expect(page.locator("body")).not_to_contain_text("Paris")
    page.get_by_role("link", name="user_id=ada-lovelace, agent_id=tutor").first.click()
    page.get_by_role("link", name="forgotten", exact=True).click()
    expect(page.locator("#records")).to_contain_text(record_id)
    no_script_ran(browser)


def test_markup_in_memory_text_is_shown_as_text(site: Site, browser: Browser) -> None:
    scope = {"user_id": XSS[1]}
    receipt = site.producer.remember(scope, XSS[0], metadata={"note": XSS[1]}).wait(10)
    site.producer.revise(scope, receipt.records[0].id, text=f"{XSS[1]} {XSS[0]}").wait(10)
    page = browser.page
    page.goto(site.url + "/scopes")
    page.get_by_role("link", name=f"user_id={XSS[1]}").click()
    expect(page.get_by_text(f"{XSS[1]} {XSS[0]}")).to_be_visible()
    page.get_by_role("link", name=receipt.records[0].id).click()
    expect(page.locator(".record-text")).to_have_text(f"{XSS[1]} {XSS[0]}")
    expect(page.locator("#revision-1 .diff")).to_have_text(XSS[0])
    page.wait_for_timeout(500)  # give anything injected a moment to run
    assert page.locator("img[src=x]").count() == 0
    assert page.evaluate("document.querySelectorAll('script:not([src])').length") == 0
    browser.shot("markup-as-text")
    no_script_ran(browser)


@pytest.mark.parametrize("browser", [{"signed_in": False}], indirect=True)
def test_off_loopback_a_page_without_the_token_is_refused(
    serve_web: Callable[..., Served],
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
) -> None:
    fresh_store.session({"user_id": "dora"}, embedder=EMBEDDER).remember("Dora's secret plan.")
    served = serve_web(
        database_url=fresh_dsn,
        redis_url=redis_url,
        host="0.0.0.0",
        env={"ENGRAM_DASHBOARD_TOKEN": TOKEN},
    )
    page = browser.page
    page.goto(served.url + "/scopes")
    expect(page.locator("h1")).to_have_text("Sign in")
    expect(page.locator("body")).not_to_contain_text("dora")
    assert page.request.get(served.url + "/api/v1/scopes").status == 401
    page.get_by_label("your name").fill("grace")
    page.get_by_label("dashboard token").fill("not-the-token-at-all")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("That is not this dashboard's token.")).to_be_visible()
    page.get_by_label("dashboard token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Scopes")
    expect(page.locator("header")).to_contain_text("signed in as grace")
    expect(page.locator("#scope-list")).to_contain_text("user_id=dora")
    no_script_ran(browser)


def test_a_reembed_s_progress_bar_moves_in_place(
    serve_web: Callable[..., Served],
    start_worker: Any,
    jobs_processes: Any,
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
) -> None:
    # A real reembed, started from the form, run by an ``engram jobs`` process whose
    # embedder takes 0.4 s a batch of 10: its progress moves for a few seconds.
    plugins = {"ENGRAM_EMBEDDERS": PLUGINS}
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url, env=plugins)
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={"ENGRAM_TEST_EMBED_DELAY_S": "0.4", "ENGRAM_REEMBED_BATCH_SIZE": "10"},
    )
    mem = fresh_store.session({"user_id": "erin"}, embedder=EMBEDDER)
    for i in range(120):
        mem.remember(f"Erin collects map number {i}.")
    page = browser.page
    page.goto(served.url + "/generations")
    page.get_by_label("towards the model").fill("slow")
    page.get_by_role("button", name="Start…").click()
    page.get_by_role("button", name="Start the reembed").click()
    pending = next(g for g in fresh_store.embeddings.all() if g.status == "pending")
    bar = page.locator(f"#progress-{pending.id} progress")
    page.evaluate("window.engramNotReloaded = true")

    def seen() -> int:
        value = bar.get_attribute("value", timeout=10_000)
        return int(value or 0)

    first = wait_until(lambda: 0 < seen() < 120 and seen(), timeout=30, what="some progress")
    wait_until(lambda: first < seen() < 120, timeout=30, what="the bar to move")
    expect(page.locator(f"#progress-{pending.id}")).to_contain_text("/ 120")
    assert page.evaluate("window.engramNotReloaded") is True  # swapped in place
    browser.shot("generations")
    expect(page.locator(f"#progress-{pending.id} .badge").first).to_have_text(
        "reembed activated", timeout=60_000
    )
    # Polling stops once nothing runs: the swapped region carries no trigger any more.
    expect(page.locator("#generations")).not_to_have_attribute("hx-trigger", "every 2s")
    active = fresh_store.embeddings.active()
    assert active is not None and active.model_id == "slow-hashing-32"
    no_script_ran(browser)


@pytest.mark.parametrize("browser", [{"javascript": False}], indirect=True)
def test_without_javascript_every_step_is_a_page_and_a_form(site: Site, browser: Browser) -> None:
    """Links are links and forms are forms: find, read and forget with no script at all."""
    site.producer.remember(
        {"user_id": "frank"}, "Frank's locker code is 4711.", id="mem_frank_locker"
    ).wait(10)
    site.producer.remember({"user_id": "grace"}, "Grace likes jazz.").wait(10)
    page = browser.page
    page.goto(site.url + "/scopes")
    page.get_by_label("user_id").fill("fra")
    page.get_by_role("button", name="Find").click()  # a GET form: a new page
    expect(page.locator("#scope-list")).not_to_contain_text("grace")
    page.get_by_role("link", name="user_id=frank").click()
    page.get_by_label("what the agent would ask").fill("locker code")
    page.get_by_role("button", name="Recall").click()  # a POST form: the scope's page again
    expect(page.locator("#recall")).to_contain_text("Frank's locker code is 4711.")
    page.get_by_role("link", name="mem_frank_locker").first.click()
    page.locator("#forget").click()
    page.locator("#confirm-forget").click()
    for _ in range(50):  # no polling without scripts: the person reloads
        if page.locator("#operation .badge.committed").count():
            break
        page.wait_for_timeout(200)
        page.reload()
    expect(page.locator("#operation .badge").first).to_have_text("committed")
    page.goto(site.url + "/records/mem_frank_locker")
    expect(page.locator("#tombstone")).to_be_visible()
    expect(page.locator("body")).not_to_contain_text("4711")
