"""The Find page and GET /api/v1/find: a record of any scope by id, its beginning or
its text, each hit a link to its record page; a forgotten record found by id only,
and never by what it said; bad input a 400; the text search the signed-in operator's."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import redis
from starlette.testclient import TestClient

from engram.store import Store
from engram.web import WebConfig
from tests.web_fixtures import BASE_URL, EMBEDDER, TOKEN, Web, make_app

ADA = {"user_id": "find-web-ada"}
BOB = {"user_id": "find-web-bob"}


def hits(html: str, section: str) -> list[str]:
    """The record ids a section of the page links to, in order."""
    part = html.split(f'id="found-by-{section}"', 1)[1].split("</div>", 1)[0]
    return re.findall(r'<a class="mono" href="/records/[^"]+">([^<]+)</a>', part)


def test_an_id_or_its_beginning_finds_records_of_every_scope_linked_to_their_pages(
    web: Web,
) -> None:
    web.remember(ADA, "Ada keeps bees.", id="wf-ada/1")
    web.remember(BOB, "Bob keeps goats.", id="wf-bob-1")
    web.remember(BOB, "Bob kept a parrot.", id="wf-bob-2")

    page = web.client.get("/find")
    assert page.status_code == 200 and "Searches every scope" in page.text
    assert '<a href="/find" class="here">Find</a>' in page.text, "in the nav"

    found = web.client.get("/find?q=wf-")
    assert found.status_code == 200
    assert hits(found.text, "id") == ["wf-ada/1", "wf-bob-1", "wf-bob-2"]
    link = f'href="/records/wf-ada%2F1?{urlencode(ADA)}"'  # a record id is its scope's
    assert link in found.text and "Ada keeps bees." in found.text
    assert 'href="/scopes/' in found.text and "user_id=find-web-bob" in found.text
    assert 'value="wf-"' in found.text, "the query stays in the box (and the URL)"
    assert hits(web.client.get("/find?q=wf-bob-2").text, "id") == ["wf-bob-2"]
    record_page = web.client.get("/records/wf-ada%2F1")
    assert record_page.status_code == 200 and "Ada keeps bees." in record_page.text

    partial = web.client.get("/find?q=wf-bob", headers={"HX-Request": "true"})
    assert partial.text.lstrip().startswith('<div id="found">')
    assert hits(partial.text, "id") == ["wf-bob-1", "wf-bob-2"]


def test_like_metacharacters_in_an_id_prefix_are_literal(web: Web) -> None:
    for rid in ("wm%1", "wmA1", "wm_2", "wmB2"):
        web.remember(ADA, f"Record {rid}.", id=rid)
    assert hits(web.client.get("/find?q=" + quote("wm%")).text, "id") == ["wm%1"]
    assert hits(web.client.get("/find?q=wm_").text, "id") == ["wm_2"]
    api = web.client.get("/api/v1/find", params={"q": "wm%", "by": "id"}).json()
    assert [h["record_id"] for h in api["by_id"]["hits"]] == ["wm%1"]


def test_text_finds_records_of_every_scope_and_never_a_forgotten_record_s_text(
    web: Web,
) -> None:
    first = web.remember(ADA, "Ada plays the xylophone on Sundays.")
    second = web.remember(BOB, "Bob tunes a xylophone for Ada.")
    gone = web.remember(ADA, "Ada's xylophone locker code is KQ-58213.", id="wg-gone")
    web.store.session(ADA, embedder=EMBEDDER).forget(gone)

    found = web.client.get("/find?q=xylophone")
    assert sorted(hits(found.text, "text")) == sorted([first, second])
    assert "<mark>xylophone</mark>" in found.text
    assert "KQ-58213" not in found.text and "locker" not in found.text

    for q in ("KQ-58213", "locker code", "wg-gone"):
        page = web.client.get("/find", params={"q": q})
        assert "KQ" not in page.text.replace(q, "") and "locker" not in page.text.replace(q, "")
        api = web.client.get("/api/v1/find", params={"q": q}).json()
        assert "KQ-58213" not in str(api).replace(q, "") and api["by_text"]["hits"] == []
    by_id = web.client.get("/find?q=wg-gone").text
    assert hits(by_id, "id") == ["wg-gone"] and '<span class="badge forgotten">' in by_id
    assert web.client.get("/records/wg-gone").status_code == 200  # its tombstone

    api = web.client.get("/api/v1/find", params={"q": "xylophone", "by": "text"}).json()
    assert api["by_id"] is None and not api["by_text"]["more"]
    assert {(h["scope"]["user_id"], h["status"]) for h in api["by_text"]["hits"]} == {
        ("find-web-ada", "active"),
        ("find-web-bob", "active"),
    }
    assert any("Bob tunes a xylophone" in h["snippet"] for h in api["by_text"]["hits"])


def test_memory_text_in_a_snippet_is_escaped(web: Web) -> None:
    text = "The <script>alert('zanzibarx')</script> & <b>bold</b> zanzibarx."
    web.remember(ADA, text, id="wx-markup")
    for q in ("zanzibarx", "wx-markup"):
        html = web.client.get("/find", params={"q": q}).text
        assert "<script>alert" not in html and "<b>bold</b>" not in html
        assert "alert(&#39;zanzibarx&#39;)" in html and " &amp; " in html
    assert "&lt;script&gt;" in web.client.get("/find?q=wx-markup").text


@pytest.mark.parametrize(
    "query",
    ["q=%20%20", "q=%00", "q=" + "w" * 501, "q=a&q=b", "q=a&colour=red", "q=a&by=id"],
)
def test_bad_input_is_a_400_and_nothing_else(web: Web, query: str) -> None:
    response = web.client.get(f"/find?{query}")
    assert response.status_code == 400 and "<h1>400</h1>" in response.text
    assert 'id="found"' not in response.text


@pytest.mark.parametrize("query", ["", "q=", "q=%20", "q=%00", "q=" + "w" * 501, "q=a&by=all"])
def test_the_api_refuses_bad_input_with_a_400(web: Web, query: str) -> None:
    response = web.client.get(f"/api/v1/find?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"


def test_a_long_query_finds_no_id_without_failing(web: Web) -> None:
    long = "word " * 60
    answer = web.client.get("/api/v1/find", params={"q": long}).json()
    assert answer["by_id"] == {"hits": [], "more": False}


def test_the_text_search_is_the_signed_in_operator_s(store: Store, redis_client: Any) -> None:
    session = store.session({"user_id": "find-web-guarded"}, embedder=EMBEDDER)
    session.remember("Grace keeps the quasarkey in the drawer.")
    client = guarded(store, redis_client)
    page = client.get("/find?q=quasarkey")
    assert page.status_code == 303 and page.headers["location"] == "/login?next=/find"
    api = client.get("/api/v1/find?q=quasarkey")
    assert api.status_code == 401 and "drawer" not in api.text
    bearer = client.get("/api/v1/find?q=quasarkey", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200 and "drawer" in str(bearer.json()["by_text"])

    login = client.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    client.post("/login", data={"csrf": csrf, "name": "grace", "token": TOKEN, "next": "/"})
    signed = client.get("/find?q=quasarkey")
    assert signed.status_code == 200 and "<mark>quasarkey</mark>" in signed.text


def guarded(store: Store, client: redis.Redis) -> TestClient:
    config = WebConfig(host="0.0.0.0", token=TOKEN, partitions=4)
    app = make_app(store, client, config=config)
    return TestClient(app, base_url=BASE_URL, follow_redirects=False)
