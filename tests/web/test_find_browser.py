"""In a real headless Chromium, served by ``engram web``: type in the Find box, see hits
of two scopes, click one and land on its record page; find by an id's beginning; then
recall on a scope page shows each hit's rank, match kind and an explained relevance."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import expect

from engram.store import Store
from tests.web.test_layout import LONG_ID, PAST_THEIR_CARD, SIDEWAYS
from tests.web_fixtures import EMBEDDER, Browser, Served


def test_find_a_record_then_read_a_recall(
    serve_web: Callable[..., Served],
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
) -> None:
    ada = fresh_store.session({"user_id": "ada"}, embedder=EMBEDDER)
    bob = fresh_store.session({"user_id": "bob"}, embedder=EMBEDDER)
    ada.remember("Ada plays the xylophone on Sundays.", id="fb-ada-1")
    bob.remember("Bob tunes a xylophone for Ada.", id="fb-bob-1")
    for i in range(5):
        ada.remember(f"note {i} about tea" if i % 2 else f"note {i} about nothing")
    ada.remember("green tea")
    ada.remember("A xylophone with a long id.", id=LONG_ID)
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page

    page.goto(served.url + "/")
    page.get_by_role("link", name="Find", exact=True).click()
    expect(page.locator("h1")).to_have_text("Find a record")
    expect(page.get_by_text("Searches every scope")).to_be_visible()
    page.get_by_label("id or words").fill("xylophone")
    found = page.locator("#found-by-text")
    expect(found.locator("tr")).to_have_count(4)  # as you type
    expect(found.locator("mark").first).to_have_text("xylophone")
    expect(found).to_contain_text("user_id=ada")
    expect(found).to_contain_text("user_id=bob")
    assert page.url.endswith("/find?q=xylophone"), "the query is kept in the URL"
    browser.shot("find-by-text")
    for width, script in ((1280, PAST_THEIR_CARD), (390, SIDEWAYS)):
        page.set_viewport_size({"width": width, "height": 900})
        assert page.evaluate(script) == [], f"the Find page's layout at {width} px"
    page.set_viewport_size({"width": 1360, "height": 900})
    found.get_by_role("link", name="fb-bob-1").click()
    expect(page.locator("h1")).to_have_text("fb-bob-1")
    expect(page.locator("body")).to_contain_text("Bob tunes a xylophone for Ada.")

    page.go_back()
    page.get_by_label("id or words").fill("fb-ada")
    page.get_by_label("id or words").press("Enter")
    by_id = page.locator("#found-by-id")
    expect(by_id.locator("tr")).to_have_count(2)
    by_id.get_by_role("link", name="fb-ada-1").click()
    expect(page.locator("h1")).to_have_text("fb-ada-1")

    # The record's scope: recall in it, each hit with its rank, kind and relevance.
    page.get_by_role("link", name="user_id=ada").first.click()
    page.get_by_label("what the agent would ask").fill("green tea")
    page.get_by_role("button", name="Recall").click()
    first = page.locator("#recall tr").nth(1)
    expect(first).to_contain_text("green tea")
    expect(first.locator("td").nth(0)).to_have_text("1")
    expect(first.locator("td").nth(1)).to_have_text("1.0000")
    expect(first.locator(".badge").first).to_have_text("hybrid")
    expect(first.locator(".ranks")).to_have_text("vector #1 · text #1")
    explanation = page.locator("#recall-score")
    expect(explanation.locator("p")).not_to_be_visible()
    explanation.locator("summary").click()
    expect(explanation).to_contain_text("1.00 holds every telling word of the query")
    rows = page.locator("#recall tr").count()

    # The default cut-off (0.15) already left out the notes about nothing; one above
    # the notes about tea (each holding half of the query's words) leaves those out.
    page.get_by_label("cut-off (relevance, optional)").fill("0.9")
    page.get_by_role("button", name="Recall").click()
    expect(page.locator("#recall-cut")).to_contain_text("below the cut-off of 0.90 left out")
    assert page.locator("#recall tr").count() < rows
    browser.shot("recall-explained")
    problems = [m for m in browser.console if "Refused to" in m or "pageerror" in m]
    assert problems == [] and browser.dialogs == []
