"""What an operator needs to see on a phone (390 px) and a laptop (1280 px), in a real
headless Chromium (issue 29, item 6): every dead letter's and failed job's error and
its Retry / Discard buttons lie on the screen (not past its edge, not inside a box that
scrolls sideways), nothing in a page scrolls sideways, the find box fits its card, and
no identifier (a letter's, an operation's, a job's id, an error code, partitions) is
broken mid-word. Screenshots of each page at both widths go to the test artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from rq import Queue

from engram.jobs.keys import MAINTENANCE_QUEUE
from engram.jobs.queues import SERIALIZER
from engram.store import Operation, Store
from engram.worker import Producer, keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import encode_entry
from tests.rq_jobs import enqueue_failing, work
from tests.web_fixtures import Browser, Served

WIDTHS = {"phone": (390, 844), "laptop": (1280, 900)}
ERROR = (
    "the embedder could not be loaded: EmbedderUnavailableError: onnxruntime is not "
    "installed where the worker runs (pip install 'engram[minilm]')"
)

SPOOF = "Pay the invoice to account \u202e4321-gnp.exe"

# Where each element that must be seen is hidden: past the viewport's edges, or clipped
# by a box between it and the page (a card that scrolls sideways).
UNSEEN = """
(selector) => {
  const out = [];
  const width = window.innerWidth;
  for (const el of document.querySelectorAll(selector)) {
    const r = el.getBoundingClientRect();
    const what = `${selector} "${el.textContent.trim().slice(0, 30)}"`;
    if (r.width === 0 || r.height === 0) { out.push(`${what} is not shown`); continue; }
    if (r.left < -1 || r.right > width + 1) {
      out.push(`${what} spans ${Math.round(r.left)}..${Math.round(r.right)}, the screen ${width}`);
      continue;
    }
    for (let box = el.parentElement; box && box !== document.body; box = box.parentElement) {
      if (getComputedStyle(box).overflowX === 'visible') continue;
      const b = box.getBoundingClientRect();
      if (r.left < b.left - 1 || r.right > b.right + 1) {
        out.push(`${what} is clipped by ${box.tagName.toLowerCase()}.${box.className}`);
        break;
      }
    }
  }
  return out;
}
"""

# Anything that scrolls sideways: the page, or a box inside it.
SCROLLS = """
() => {
  const out = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth + 1) out.push(`the page is ${doc.scrollWidth} px wide`);
  for (const el of document.querySelectorAll('main *')) {
    const x = getComputedStyle(el).overflowX;
    if ((x === 'auto' || x === 'scroll') && el.scrollWidth > el.clientWidth + 1) {
      out.push(`${el.tagName.toLowerCase()}.${el.className} scrolls sideways ` +
               `(${el.scrollWidth} in ${el.clientWidth})`);
    }
  }
  return out;
}
"""

# Identifiers broken where no word ends: a line break inside one must follow a space,
# a hyphen, a slash, a comma or a dot (where a browser breaks words), never a letter.
BROKEN_IDS = """
() => {
  const out = [];
  const allowed = /[\\s\\-\\/,.·]/;
  for (const el of document.querySelectorAll('main .mono, main code')) {
    const text = el.textContent;
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let prevTop = null, prevChar = '';
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i); range.setEnd(node, i + 1);
        const rect = range.getClientRects()[0];
        const ch = node.data[i];
        if (!rect || !rect.width) { prevChar = ch; continue; }
        if (prevTop !== null && rect.top > prevTop + 4 &&
            !allowed.test(prevChar) && !allowed.test(ch)) {
          out.push(`"${text.trim().slice(0, 40)}" breaks between "${prevChar}" and "${ch}"`);
          break;
        }
        prevTop = rect.top; prevChar = ch;
      }
    }
  }
  return out;
}
"""


@dataclass
class Lists:
    url: str
    job_ids: list[str]
    spoofed: str  # a record whose text holds U+202E


@pytest.fixture
def lists(
    serve_web: Callable[..., Served],
    start_worker: Any,
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
) -> Iterator[Lists]:
    """Dead letters with a long error, failed jobs, a live worker, a record to find."""
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    client = connect_redis(redis_url)
    producer = Producer(client, partitions=4)
    scope = {"user_id": "ada-lovelace", "agent_id": "travel-planner-assistant"}
    queue = Queue(MAINTENANCE_QUEUE, connection=client, serializer=SERIALIZER)
    job_ids = [enqueue_failing(queue, f"mem_{i}").id for i in range(3)]
    work(fresh_store, redis_url, client, queue)
    with start_worker(fresh_store):
        producer.remember(scope, "Prefers aisle seats on long flights to Lisbon.").wait(10)
        producer.remember(scope, SPOOF, id="mem_invoice").wait(10)
        for partition in range(4):
            op = Operation.build("remember", scope, {"text": "x"})
            client.xadd(keys.DEAD_LETTERS, {
                "partition": partition, "entry": "1764800000000-0",
                "operation_id": op.operation_id, "reason": "failed",
                "error": json.dumps({"code": "embedder_unavailable", "message": ERROR}),
                "deliveries": 5, "at_ms": 1764800000000, "op": encode_entry(op)["op"],
            })  # fmt: skip
        yield Lists(served.url, job_ids, "mem_invoice")
    client.close()


def _open(browser: Browser, url: str) -> None:
    browser.page.goto(url)
    browser.page.wait_for_load_state("networkidle")


def _problems(browser: Browser, what: str, *needed: str) -> list[str]:
    found = [f"{what}: {p}" for p in browser.page.evaluate(SCROLLS)]
    found += [f"{what}: {p}" for p in browser.page.evaluate(BROKEN_IDS)]
    for selector in needed:
        assert browser.page.locator(selector).count() > 0, f"{what}: no {selector}"
        found += [f"{what}: {p}" for p in browser.page.evaluate(UNSEEN, selector)]
    return found


@pytest.mark.parametrize("size", list(WIDTHS))
def test_each_row_shows_its_error_and_its_buttons(
    lists: Lists, browser: Browser, size: str
) -> None:
    width, height = WIDTHS[size]
    browser.page.set_viewport_size({"width": width, "height": height})
    problems: list[str] = []
    _open(browser, lists.url + "/dead-letters")
    rows = "#dead-letter-list tbody tr"
    assert browser.page.locator(rows).count() == 4
    problems += _problems(
        browser,
        "dead letters",
        f"{rows} .error",
        f"{rows} .actions button",  # Retry
        f"{rows} .actions a.button",  # Discard…
    )
    browser.shot(f"dead-letters-{width}")
    _open(browser, f"{lists.url}/jobs?queue={MAINTENANCE_QUEUE}&state=failed")
    rows = "#jobs tbody tr.job"
    assert browser.page.locator(rows).count() == len(lists.job_ids)
    problems += _problems(browser, "jobs", f"{rows} .error", f"{rows} .actions button")
    browser.shot(f"jobs-{width}")
    _open(browser, lists.url + "/find?q=aisle")
    problems += _problems(browser, "find", "form[role=search] input", "form[role=search] button")
    browser.shot(f"find-{width}")
    _open(browser, lists.url + "/")
    problems += _problems(browser, "overview")
    browser.shot(f"overview-{width}")
    assert problems == [], "\n".join(problems)


def test_a_right_to_left_override_shows_as_a_marker_in_isolated_text(
    lists: Lists, browser: Browser
) -> None:
    """What a person sees: the text in its order, the override named, not obeyed."""
    browser.page.set_viewport_size({"width": 390, "height": 844})
    _open(browser, f"{lists.url}/records/{lists.spoofed}")
    text = browser.page.locator("pre.record-text bdi.memory")
    assert text.inner_text() == "Pay the invoice to account \u27e8RLO\u27e94321-gnp.exe"
    assert text.evaluate("e => getComputedStyle(e).unicodeBidi") == "isolate"
    browser.shot("record-bidi-390")
