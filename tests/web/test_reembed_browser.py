"""In a real headless Chromium, served by ``engram web``: cancel a pending reembed from
the generations page, through its confirmation with a why, and find it in the audit."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import expect

from engram.jobs import reembed
from engram.store import HashingEmbedder, Store
from engram.store.vectors.registry import EmbedderRegistry
from engram.worker.embedded.runtime import connect_redis
from tests.web_fixtures import Browser, Served


def test_cancel_a_pending_reembed_after_its_confirmation(
    serve_web: Callable[..., Served],
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
) -> None:
    client = connect_redis(redis_url)
    fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64)).remember("A note.")
    started = reembed.start(fresh_store, client, EmbedderRegistry(), "hashing:32", requested_by="t")
    gen = started.generation_id
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page
    page.goto(served.url + "/generations")
    expect(page.locator(f"#generation-{gen}")).to_contain_text("pending")
    page.get_by_role("link", name="Cancel…").click()
    expect(page.locator("h1")).to_contain_text("Cancel the reembed to hashing-32")
    assert fresh_store.embeddings.get(gen).status == "pending"  # type: ignore[union-attr]
    browser.shot("reembed-cancel-confirm")
    page.get_by_label("Why").fill("started by mistake")
    page.get_by_role("button", name="Cancel this reembed").click()
    expect(page.locator("h1")).to_have_text("Embedding generations")
    expect(page.locator(f"#generation-{gen}")).to_contain_text("cancelled")
    expect(page.locator(f"#progress-{gen}")).to_contain_text("started by mistake")
    expect(page.get_by_role("link", name="Cancel…")).to_have_count(0)
    assert fresh_store.embeddings.get(gen).status == "cancelled"  # type: ignore[union-attr]
    page.get_by_role("link", name="Audit").first.click()
    expect(page.locator("#audit")).to_contain_text("reembed.cancel")
    expect(page.locator("#audit")).to_contain_text("started by mistake")
    browser.shot("reembed-cancelled-audit")
    assert [m for m in browser.console if "Refused to" in m or "pageerror" in m] == []
    client.close()
