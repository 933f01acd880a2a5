"""In a real headless Chromium, served by ``engram web``: filter the dead letters,
discard all matching after the dry run, and find the reason in the audit trail."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import expect

from engram.store import Operation, Store
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import encode_entry
from tests.web_fixtures import Browser, Served


def test_discard_all_matching_after_the_dry_run(
    serve_web: Callable[..., Served],
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
) -> None:
    client = connect_redis(redis_url)
    client.delete(keys.DEAD_LETTERS)
    ids = {}
    for user, reason in (("a", "failed"), ("b", "failed"), ("c", "deliveries")):
        op = Operation.build("forget", {"user_id": user}, {"id": "mem_x"})
        ids[user] = client.xadd(keys.DEAD_LETTERS, {  # type: ignore[union-attr]
            "partition": 0, "entry": "5-0", "operation_id": op.operation_id, "reason": reason,
            "error": '{"code": "dead_lettered", "message": "no"}', "deliveries": 1,
            "at_ms": 1, "op": encode_entry(op)["op"],
        }).decode()  # fmt: skip
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page
    page.goto(served.url + "/dead-letters")
    expect(page.locator("#dead-letter-list tr")).to_have_count(4)
    page.get_by_label("reason").select_option("failed")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#dead-letter-list tr")).to_have_count(3)
    page.get_by_role("link", name="Discard all matching…").click()
    expect(page.locator(".bulk-count")).to_have_text("2")
    expect(page.locator("#bulk")).to_contain_text(ids["a"])
    assert client.xlen(keys.DEAD_LETTERS) == 3  # the dry run changed nothing
    browser.shot("bulk-dry-run")
    page.get_by_label("Why").fill("replayed by hand after the outage")
    page.get_by_role("button", name="Discard these 2").click()
    expect(page.locator("h1")).to_have_text("Dead letters")
    expect(page.locator("#bulk h2")).to_have_text("Discarded 2 dead letters")  # not "None."
    expect(page.locator("#bulk")).to_contain_text("replayed by hand after the outage")
    browser.shot("bulk-done")
    page.get_by_role("link", name="the dead letters this filter matches now").click()
    expect(page.locator("#dead-letter-list")).to_contain_text("None.")
    assert [i.decode() for i, _ in client.xrange(keys.DEAD_LETTERS)] == [ids["c"]]  # type: ignore[union-attr]
    page.get_by_role("link", name="Audit").first.click()
    expect(page.locator("#audit")).to_contain_text("replayed by hand after the outage")
    expect(page.locator("#audit")).to_contain_text(ids["b"])
    browser.shot("bulk-audit")
    assert [m for m in browser.console if "Refused to" in m or "pageerror" in m] == []
    client.close()
