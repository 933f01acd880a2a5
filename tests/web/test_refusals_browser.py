"""Refusals and results as a person sees them, in a real headless Chromium at 1280 and
390 px (issue 29, item 7): a reembed refused keeps the model and the why typed and
names the models there are; a bulk confirmation refused because the letters changed
shows what matches now with the why kept, and once confirmed says what it did, with
links. Screenshots of each go to the test artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from playwright.sync_api import expect

from engram.store import Operation, Store
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import encode_entry
from tests.web_fixtures import Browser, Served

WIDTHS = {"laptop": 1280, "phone": 390}


def dead_letter(client: redis.Redis, user: str) -> str:
    """A dead letter of a valid forget; its operation's id."""
    op = Operation.build("forget", {"user_id": user}, {"id": "mem_x"})
    fields = {
        "partition": 0, "entry": "5-0", "operation_id": op.operation_id, "reason": "failed",
        "error": json.dumps({"code": "embedder_unavailable", "message": "onnxruntime missing"}),
        "deliveries": 1, "at_ms": 1, "op": encode_entry(op)["op"],
    }  # fmt: skip
    client.xadd(keys.DEAD_LETTERS, fields)  # type: ignore[arg-type]
    return op.operation_id


@pytest.mark.parametrize("size", list(WIDTHS))
def test_refusals_keep_what_was_typed_and_results_say_what_was_done(
    serve_web: Callable[..., Served],
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
    size: str,
) -> None:
    width = WIDTHS[size]
    client = connect_redis(redis_url)
    client.delete(keys.DEAD_LETTERS)
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page
    page.set_viewport_size({"width": width, "height": 900})

    page.goto(served.url + "/generations")
    page.get_by_label("towards the model").fill("MiniLM-L12")
    page.get_by_label("why").fill("a better model for French")
    page.get_by_role("button", name="Start").click()
    expect(page.locator("#reembed-refused")).to_contain_text("unregistered_model")
    expect(page.locator("#reembed-refused")).to_contain_text("wordllama[:DIMS], minilm")
    expect(page.get_by_label("towards the model")).to_have_value("MiniLM-L12")
    expect(page.get_by_label("why")).to_have_value("a better model for French")
    browser.shot(f"reembed-refused-{width}")

    first = dead_letter(client, "a")
    page.goto(served.url + "/dead-letters/bulk?action=retry&reason=failed")
    expect(page.locator(".bulk-count")).to_have_text("1")
    second = dead_letter(client, "b")  # another letter matches once the dry run is shown
    page.get_by_label("Why").fill("the embedder is installed now")
    page.get_by_role("button", name="Retry these 1").click()
    expect(page.locator("#bulk-refused")).to_contain_text("selection_changed")
    expect(page.locator(".bulk-count")).to_have_text("2")
    expect(page.get_by_label("Why")).to_have_value("the embedder is installed now")
    browser.shot(f"bulk-refused-{width}")

    page.get_by_role("button", name="Retry these 2").click()
    expect(page.locator("#bulk h2")).to_have_text("Retried 2 dead letters")
    for operation_id in (first, second):  # an operation id is its scope's: the link names it
        expect(page.locator(f'a[href^="/operations/{operation_id}?user_id="]')).to_be_visible()
    expect(page.get_by_role("link", name="the audit trail")).to_be_visible()
    browser.shot(f"bulk-done-{width}")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    client.close()
