"""A record's history is paged: the record page shows 20 revisions with a real link to
the older ones, the API pages with ``cursor`` (and stays whole up to 200 revisions), and
the forget confirmation counts the revisions in SQL."""

from __future__ import annotations

import re

import pytest

from engram.store import Operation, WriteResult
from engram.web.views.records import HISTORY_SHOWN
from tests.web_fixtures import EMBEDDER, Web

REVISIONS = 45


@pytest.fixture
def record_id(web: Web) -> str:
    scope = {"user_id": "paging"}
    record_id = web.remember(scope, "note 0")
    for i in range(1, REVISIONS):
        [result] = web.store.execute(
            [Operation.build("revise", scope, {"id": record_id, "text": f"note {i}"})],
            EMBEDDER,
        )
        assert isinstance(result, WriteResult), result
    return record_id


def shown(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'id="revision-(\d+)"', html)]


def older_link(html: str) -> str | None:
    found = re.search(r'id="older-revisions" href="([^"]+)"', html)
    return found[1].replace("&amp;", "&") if found else None


def test_the_record_page_shows_a_page_of_revisions_and_links_to_the_older(
    web: Web, record_id: str
) -> None:
    seen: list[int] = []
    url: str | None = f"/records/{record_id}"
    pages = 0
    while url is not None:
        response = web.client.get(url)
        assert response.status_code == 200
        revisions = shown(response.text)
        assert 0 < len(revisions) <= HISTORY_SHOWN
        assert f"{REVISIONS} stored revision(s)" in response.text
        seen += revisions
        url = older_link(response.text)
        pages += 1
    assert seen == list(range(REVISIONS, 0, -1)) and pages == 3
    # Each revision on a later page still shows what it changed from the one before it.
    second = web.client.get(older_link(web.client.get(f"/records/{record_id}").text) or "").text
    last_on_second = REVISIONS - 2 * HISTORY_SHOWN + 1
    assert "<del>" in second.split(f'id="revision-{last_on_second}"')[1]


def test_a_cursor_of_another_record_or_a_forged_one_is_refused(web: Web, record_id: str) -> None:
    other = web.remember({"user_id": "paging"}, "another")
    cursor = older_link(web.client.get(f"/records/{record_id}").text)
    assert cursor is not None
    assert web.client.get(f"/records/{other}?{cursor.split('?')[1]}").status_code == 400
    assert web.client.get(f"/records/{record_id}?cursor=forged.sig").status_code == 400


def test_the_api_pages_the_history_oldest_first(web: Web, record_id: str) -> None:
    whole = web.client.get(f"/api/v1/history/{record_id}").json()
    assert [r["revision"] for r in whole["revisions"]] == list(range(1, REVISIONS + 1))
    assert whole["next"] is None  # up to 200 revisions: whole, as before paging
    seen: list[int] = []
    page = web.client.get(f"/api/v1/history/{record_id}?limit=20").json()
    while True:
        seen += [r["revision"] for r in page["revisions"]]
        if page["next"] is None:
            break
        page = web.client.get(f"/api/v1/history/{record_id}?limit=20&cursor={page['next']}").json()
    assert seen == list(range(1, REVISIONS + 1))
    assert web.client.get(f"/api/v1/history/{record_id}?limit=0").status_code == 400
    assert web.client.get("/api/v1/history/mem_nope").status_code == 404


def test_the_forget_confirmation_counts_every_revision(web: Web, record_id: str) -> None:
    page = web.client.get(f"/forget/{record_id}").text
    assert re.search(rf"\b{REVISIONS}\b", page), page
    holder = web.store.browse.holder(record_id)
    assert holder is not None and web.store.browse.revision_count(holder.id, record_id) == REVISIONS
