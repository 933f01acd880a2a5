"""The dashboard's layout in a real headless Chromium: at 1280 px nothing in a page is
cut or pushed past its card, and at 390 px (a phone) no page scrolls sideways: long
ids and digests wrap, and a table too wide for the screen scrolls inside its own box.
Screenshots at both widths go to the test artifacts (the README shows them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from engram.jobs import redaction
from engram.store import Operation, Store
from engram.worker import Producer, keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import encode_entry
from tests.web_fixtures import Browser, Served

LONG_ID = "mem_" + "customer-preferences-and-travel-history-" * 2 + "v2"
LONG_USER = "user-" + "9f8e7d6c5b4a" * 4

# Elements whose box lies past the right edge of the card (or page) holding them: what
# a reader cannot see without scrolling, or at all.
PAST_THEIR_CARD = """
() => {
  const out = [];
  const cells = 'main td, main th, main dd, main h1, main .mono';
  for (const el of document.querySelectorAll(cells)) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    const card = el.closest('.card') || document.querySelector('main');
    const right = Math.round(card.getBoundingClientRect().right);
    const what = `${el.tagName.toLowerCase()} "${el.textContent.trim().slice(0, 40)}"`;
    const end = Math.round(r.right);
    if (end > right + 1) out.push(`${what} ends at ${end}, its card at ${right}`);
  }
  return out;
}
"""

# At a phone's width: does the page itself scroll sideways, does every id and digest
# outside a table wrap, and does every table wider than its card sit in a box that
# scrolls?
SIDEWAYS = """
() => {
  const out = [];
  const width = window.innerWidth;
  const past = (e) => e.getBoundingClientRect().right > width + 1;
  const text = (e) => e.textContent.trim().slice(0, 40);
  const doc = document.documentElement;
  if (doc.scrollWidth > width + 1) {
    const all = [...document.querySelectorAll('body *')];
    const wide = all.filter(e => past(e) && !e.closest('table'));
    const names = wide.slice(-3).map(e => e.tagName.toLowerCase() + '.' + e.className);
    out.push(`the page is ${doc.scrollWidth} px wide at ${width} (${names.join(', ')})`);
  }
  for (const m of document.querySelectorAll('main .mono')) {
    if (!m.closest('table') && past(m)) out.push(`"${text(m)}" does not wrap`);
  }
  for (const t of document.querySelectorAll('main table')) {
    const card = t.closest('.card') || t.parentElement;
    if (t.getBoundingClientRect().width <= card.clientWidth + 1) continue;
    let box = t.parentElement, scrolls = false;
    while (box && box !== document.body) {
      if (['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) { scrolls = true; break; }
      box = box.parentElement;
    }
    if (!scrolls) out.push(`a table "${text(t)}" is wider than its card and does not scroll`);
  }
  return out;
}
"""


@dataclass
class Pages:
    url: str
    scope_id: int
    record_id: str
    operation_id: str


@pytest.fixture
def pages(
    serve_web: Callable[..., Served],
    start_worker: Any,
    jobs_processes: Any,
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
) -> Iterator[Pages]:
    """Every list holds something wide: a long scope, a long record id with two
    revisions, a live worker, dead letters from every partition, a finished job."""
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
    client = connect_redis(redis_url)
    producer = Producer(client, partitions=4)
    scope = {"user_id": LONG_USER, "agent_id": "travel-planner-assistant", "run_id": "run-2026"}
    with start_worker(fresh_store, on_forget=redaction.hand_over):
        producer.remember(scope, "Prefers aisle seats on long flights.", id=LONG_ID).wait(10)
        sent = producer.revise(scope, LONG_ID, text="Prefers window seats.", expected_revision=1)
        sent.wait(10)
        producer.remember(scope, "Travels to Lisbon every spring.").wait(10)
        producer.forget(scope, LONG_ID).wait(10)
        producer.remember(scope, "Keeps a Lisbon travel journal.", id=LONG_ID + "-2").wait(10)
        for partition in range(4):
            op = Operation.build("remember", scope, {"text": "x"})
            client.xadd(keys.DEAD_LETTERS, {
                "partition": partition, "entry": "1764800000000-0",
                "operation_id": op.operation_id, "reason": "deliveries",
                "error": '{"code": "dead_lettered", "message": "delivered 5 times"}',
                "deliveries": 5, "at_ms": 1764800000000, "op": encode_entry(op)["op"],
            })  # fmt: skip
        [scope_row] = fresh_store.browse.scopes().items
        yield Pages(served.url, scope_row.id, LONG_ID + "-2", sent.operation_id)
    client.close()


def _open(browser: Browser, url: str) -> None:
    browser.page.goto(url)
    browser.page.wait_for_load_state("networkidle")


def _check(browser: Browser, url: str, script: str) -> list[str]:
    _open(browser, url)
    return [f"{url}: {problem}" for problem in browser.page.evaluate(script)]


def _urls(p: Pages) -> list[str]:
    return [
        p.url + path
        for path in (
            "/",
            "/scopes",
            f"/scopes/{p.scope_id}",
            f"/records/{p.record_id}",
            f"/records/{LONG_ID}",
            "/receipts",
            f"/receipts/{p.operation_id}",
            "/dead-letters",
            "/jobs",
            "/generations",
            "/audit",
        )
    ]


def test_nothing_is_cut_at_1280_px(pages: Pages, browser: Browser) -> None:
    browser.page.set_viewport_size({"width": 1280, "height": 900})
    problems = [x for url in _urls(pages) for x in _check(browser, url, PAST_THEIR_CARD)]
    assert problems == [], "\n".join(problems)
    _open(browser, pages.url + "/")
    browser.shot("layout-1280-overview")
    _open(browser, pages.url + "/dead-letters")
    browser.shot("layout-1280-dead-letters")


def test_no_page_scrolls_sideways_at_390_px(pages: Pages, browser: Browser) -> None:
    browser.page.set_viewport_size({"width": 390, "height": 844})
    problems = [x for url in _urls(pages) for x in _check(browser, url, SIDEWAYS)]
    assert problems == [], "\n".join(problems)
    _open(browser, f"{pages.url}/records/{pages.record_id}")
    browser.shot("layout-390-record")
