"""Recall an operator can read, on the scope page and in POST /api/v1/recall: each hit's
rank, match kind and where each search ranked it, a relevance from 0 to 1 whose meaning
the page explains, and an optional cut-off that leaves out the hits below it."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from engram.store.limits import DEFAULT_MIN_RELEVANCE
from engram.web import Services, WebConfig, create_app
from tests.redis_fixtures import FAST
from tests.web_fixtures import BASE_URL, TOKEN, Web, sign_in

SCOPE = {"user_id": "recall-web"}


def seed(web: Web) -> int:
    if web.store.scope_id(SCOPE) is None:
        for i in range(6):
            web.remember(SCOPE, f"note {i} about tea" if i % 2 else f"note {i} about nothing")
        web.remember(SCOPE, "green tea")
    return web.scope_id(SCOPE)


def rows(html: str) -> list[tuple[int, float, str, str]]:
    """(rank, relevance, match, where each search ranked it) of each hit shown."""
    return [
        (int(rank), float(relevance), match, ranks)
        for rank, relevance, match, ranks in re.findall(
            r'<tr><td class="num" data-label="rank">(\d+)</td>'
            r'<td class="num" data-label="relevance">([\d.]+)</td>'
            r'<td data-label="match"><span class="badge (\w+)">\w+</span>\s*'
            r'<br><span class="[^"]*ranks">([^<]*)</span>',
            html,
        )
    ]


def recall(web: Web, **form: str) -> str:
    sid = seed(web)
    response = web.client.post(
        f"/scopes/{sid}/recall",
        data={"csrf": web.csrf(), "text": "green tea", "top_k": "7", **form},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200, response.text
    return response.text


def test_hits_show_their_rank_match_kind_and_an_explained_relevance(web: Web) -> None:
    html = recall(web, min_relevance="0")
    shown = rows(html)
    assert [r[0] for r in shown] == list(range(1, len(shown) + 1)) and len(shown) == 7
    assert shown[0] == (1, 1.0, "hybrid", "vector #1 · text #1")
    assert [r[1] for r in shown] == sorted((r[1] for r in shown), reverse=True)
    for _, relevance, match, ranks in shown:
        assert 0 <= relevance <= 1
        assert ("vector #" in ranks) == (match in ("vector", "hybrid"))
        assert ("text #" in ranks) == (match in ("lexical", "hybrid"))
    assert any(match == "vector" for _, _, match, _ in shown), "a hit by meaning alone"
    assert '<details class="small" id="recall-score">' in html
    assert "<b>1.00</b> holds every telling word" in html
    assert "its cosine similarity" in html


def test_a_cut_off_leaves_out_the_hits_below_it(web: Web) -> None:
    every = rows(recall(web, min_relevance="0"))
    html = recall(web, min_relevance="0.6")
    kept = rows(html)
    assert kept == [r for r in every if r[1] >= 0.6] and 0 < len(kept) < len(every)
    assert f"{len(every) - len(kept)} hit(s) below the cut-off of 0.60 left out" in html
    assert rows(recall(web, min_relevance="1")) == every[:1]
    # No cut-off given: recall's default, which leaves out the notes about nothing.
    html = recall(web, min_relevance="")
    default = rows(html)
    assert default == [r for r in every if r[1] >= DEFAULT_MIN_RELEVANCE]
    assert 0 < len(default) < len(every)
    left_out = f"{len(every) - len(default)} hit(s) below the cut-off of"
    assert f"{left_out} {DEFAULT_MIN_RELEVANCE:.2f} left out" in html


@pytest.mark.parametrize("bad", ["abc", "1.5", "-0.1", "nan", "inf", "0,5"])
def test_a_bad_cut_off_is_a_400_and_nothing_else(web: Web, bad: str) -> None:
    sid = seed(web)
    response = web.client.post(
        f"/scopes/{sid}/recall", data={"csrf": web.csrf(), "text": "tea", "min_relevance": bad}
    )
    assert response.status_code == 400 and "cut-off must be a number from 0 to 1" in response.text
    assert "note 1 about tea" not in response.text


def test_the_api_gives_each_hit_its_rank_relevance_and_list_ranks(web: Web) -> None:
    seed(web)
    body = {"scope": SCOPE, "text": "green tea", "top_k": 7}
    hits = web.client.post("/api/v1/recall", json=body).json()["hits"]
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    first = hits[0]
    assert (first["match"], first["vector_rank"], first["lexical_rank"]) == ("hybrid", 1, 1)
    # Every word of the query held (LEXICAL_WEIGHT) and the query's own vector (1).
    assert first["relevance"] == 1.0 and first["score"] == pytest.approx(3.0)
    assert all(h["relevance"] == pytest.approx(min(h["score"], 1)) for h in hits)
    assert all(h["relevance"] >= DEFAULT_MIN_RELEVANCE for h in hits)
    every = web.client.post("/api/v1/recall", json={**body, "min_relevance": 0}).json()["hits"]
    assert hits == [h for h in every if h["relevance"] >= DEFAULT_MIN_RELEVANCE]
    cut = web.client.post("/api/v1/recall", json={**body, "min_relevance": 0.6}).json()["hits"]
    assert [h["record"]["id"] for h in cut] == [
        h["record"]["id"] for h in hits if h["relevance"] >= 0.6
    ]
    for bad in (1.5, -1, "0.5", True):
        refused = web.client.post("/api/v1/recall", json={**body, "min_relevance": bad})
        assert refused.status_code == 422, bad


def test_a_dashboard_run_without_an_embedder_recalls_by_text_only_and_says_so(web: Web) -> None:
    """The store would follow its active generation when given no embedder
    (``Store.recall``); a dashboard started without one asks for words alone, on
    purpose, and its page says so."""
    sid = seed(web)
    app = create_app(
        WebConfig(token=TOKEN, partitions=FAST.partitions, lease_ttl_ms=FAST.lease_ttl_ms),
        Services(store=web.store, redis=web.redis, producer=web.producer, embedder=None),
    )
    with TestClient(app, base_url=BASE_URL, follow_redirects=False) as client:
        sign_in(client, "local")
        body = {"scope": SCOPE, "text": "green tea", "top_k": 7}
        hits = client.post("/api/v1/recall", json=body).json()["hits"]
        html = client.get(f"/scopes/{sid}").text
        marker = 'name="csrf" value="'
        csrf = html[html.index(marker) + len(marker) :].split('"', 1)[0]
        page = client.post(
            f"/scopes/{sid}/recall",
            data={"csrf": csrf, "text": "green tea", "top_k": "7"},
            headers={"HX-Request": "true"},
        ).text
    assert hits and all((h["match"], h["vector_rank"]) == ("lexical", None) for h in hits)
    assert "by text only: the dashboard runs without an embedder" in page
    assert {r[2] for r in rows(page)} == {"lexical"}
