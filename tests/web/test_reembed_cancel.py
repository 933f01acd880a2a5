"""Cancelling a pending reembed from the API, the dashboard (asked first, with a why)
and ``engram reembed --cancel``; a generation that is not pending is refused (409) and
unchanged; only a signed-in operator may; a superseded reembed shows as superseded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from engram.cli import main
from engram.following import follow
from engram.jobs import reembed
from engram.store import HashingEmbedder, Store
from engram.store.vectors.registry import EmbedderRegistry
from engram.web import Services, WebConfig, create_app
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from tests.redis_fixtures import FAST
from tests.web_fixtures import BASE_URL, EMBEDDER, TOKEN, sign_in


def app(store: Store, conn: redis.Redis, **config: Any) -> Any:
    registry = EmbedderRegistry()

    def start_reembed(model: str, requested_by: str) -> str:
        return reembed.start(store, conn, registry, model, requested_by=requested_by).job_id

    return create_app(
        WebConfig(
            **{
                "token": TOKEN,
                "partitions": FAST.partitions,
                "lease_ttl_ms": FAST.lease_ttl_ms,
                **config,
            }
        ),
        Services(
            store=store,
            redis=conn,
            producer=Producer(conn, partitions=FAST.partitions),
            embedder=EMBEDDER,
            start_reembed=start_reembed,
            embedders=registry,
        ),
    )


@pytest.fixture
def http(fresh_store: Store, redis_url: str) -> Iterator[TestClient]:
    conn = connect_redis(redis_url)
    mem = fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64))
    for i in range(5):
        mem.remember(f"Ada note {i}.")
    with TestClient(
        app(fresh_store, conn), base_url=BASE_URL, follow_redirects=False
    ) as test_client:
        sign_in(test_client, "local")
        yield test_client
    conn.close()


def pending_id(store: Store) -> int:
    [pending] = [g.id for g in store.embeddings.all() if g.status == "pending"]
    return pending


def snapshot(store: Store) -> Any:
    gens = [(g.id, g.status, g.progress) for g in store.embeddings.all()]
    vectors = [store.embeddings.vector_count(g.id) for g in store.embeddings.all()]
    return gens, vectors, len(store.audit.page().items)


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]


def test_the_api_cancels_a_pending_reembed_and_refuses_any_other(
    http: TestClient, fresh_store: Store
) -> None:
    assert http.post("/api/v1/reembed", json={"model": "hashing:32"}).status_code == 202
    gen = pending_id(fresh_store)
    active = fresh_store.embeddings.active()
    assert active is not None
    before = snapshot(fresh_store)

    refused = http.post(f"/api/v1/generations/{active.id}/cancel", json={"reason": "oops"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "generation_not_pending"
    assert "only a pending generation can be cancelled" in refused.json()["error"]["message"]
    assert http.post("/api/v1/generations/999/cancel").status_code == 404
    too_long = http.post(f"/api/v1/generations/{gen}/cancel", json={"reason": "x" * 201})
    assert too_long.status_code == 400
    assert http.post(f"/api/v1/generations/{gen}/cancel", json={"why": "x"}).status_code == 422
    assert snapshot(fresh_store) == before, "refusals change nothing"

    done = http.post(f"/api/v1/generations/{gen}/cancel", json={"reason": "wrong model"})
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["id"], body["status"], body["vectors"]) == (gen, "cancelled", 0)
    assert body["progress"]["state"] == "cancelled"
    assert re.fullmatch(r"by \S+: wrong model", body["progress"]["message"])
    entry = fresh_store.audit.page().items[0]
    assert (entry.action, entry.target, entry.detail["reason"]) == (
        "reembed.cancel",
        str(gen),
        "wrong model",
    )
    again = http.post(f"/api/v1/generations/{gen}/cancel")
    assert again.status_code == 409
    assert fresh_store.embeddings.active() == active


def test_the_dashboard_asks_first_then_cancels_with_a_why(
    http: TestClient, fresh_store: Store
) -> None:
    page = http.get("/generations").text
    started = http.post(
        "/generations/reembed",
        data={"csrf": csrf_of(page), "model": "hashing:16", "confirm": "yes"},
    )
    assert started.status_code == 303
    gen = pending_id(fresh_store)
    page = http.get("/generations").text
    assert f'href="/generations/{gen}/cancel">Cancel…</a>' in page
    assert page.count("Cancel…") == 1, "only the pending generation offers it"

    confirm = http.get(f"/generations/{gen}/cancel")
    assert confirm.status_code == 200
    assert "Cancel the reembed to" in confirm.text and "hashing-16" in confirm.text
    assert "its vectors are deleted" in confirm.text
    before = snapshot(fresh_store)
    assert http.post(f"/generations/{gen}/cancel", data={"why": "no"}).status_code == 403
    assert snapshot(fresh_store) == before

    done = http.post(
        f"/generations/{gen}/cancel", data={"csrf": csrf_of(confirm.text), "why": "not today"}
    )
    assert (done.status_code, done.headers["location"]) == (303, "/generations")
    listed = http.get("/generations").text
    assert '<span class="badge cancelled">cancelled</span>' in listed
    assert "reembed cancelled" in listed and ": not today" in listed
    assert "Cancel…" not in listed
    assert fresh_store.embeddings.vector_count(gen) == 0
    active = fresh_store.embeddings.active()
    assert active is not None
    refused = http.get(f"/generations/{active.id}/cancel")
    assert refused.status_code == 409 and "generation_not_pending" in refused.text


def test_only_a_signed_in_operator_may_cancel(fresh_store: Store, redis_url: str) -> None:
    conn = connect_redis(redis_url)
    fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64)).remember("A note.")
    gen = reembed.start(fresh_store, conn, EmbedderRegistry(), "hashing:8", requested_by="t")
    guarded = app(fresh_store, conn, host="0.0.0.0", token=TOKEN)
    with TestClient(guarded, base_url=BASE_URL, follow_redirects=False) as client:
        before = snapshot(fresh_store)
        assert client.post(f"/api/v1/generations/{gen.generation_id}/cancel").status_code == 401
        assert client.post(f"/generations/{gen.generation_id}/cancel").status_code == 401
        assert snapshot(fresh_store) == before
        done = client.post(
            f"/api/v1/generations/{gen.generation_id}/cancel",
            json={"reason": "by token"},
            headers={"Authorization": f"Bearer {TOKEN}", "X-Engram-Operator": "grace"},
        )
        assert done.status_code == 200, done.text
    entry = fresh_store.audit.page().items[0]
    assert (entry.action, entry.detail["reason"]) == ("reembed.cancel", "by token")
    conn.close()


def test_a_superseded_reembed_shows_as_superseded(
    http: TestClient, fresh_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    first = http.post("/api/v1/reembed", json={"model": "hashing:32"})
    assert first.status_code == 202
    older = pending_id(fresh_store)
    assert http.post("/api/v1/reembed", json={"model": "hashing:16"}).status_code == 202
    newer = pending_id(fresh_store)
    items = {g["id"]: g for g in http.get("/api/v1/generations").json()["items"]}
    assert items[older]["status"] == "retired"
    assert items[older]["progress"]["state"] == "superseded"
    assert items[older]["progress"]["superseded_by"] == newer
    html = http.get("/generations", headers={"HX-Request": "true"}).text
    row = html[html.index(f'id="progress-{older}"') :].split("</tr>", 1)[0]
    assert "reembed superseded" in row and f"#{newer}</a>" in row
    assert "finished" not in row and "ETA" not in row
    assert follow(fresh_store, older, poll_s=0.01) == 1
    assert f"engram: reembed superseded by generation {newer}" in capsys.readouterr().err


@pytest.mark.usefixtures("fresh_store")
def test_engram_reembed_cancel(
    http: TestClient,
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    assert http.post("/api/v1/reembed", json={"model": "hashing:32"}).status_code == 202
    gen = pending_id(fresh_store)
    active = fresh_store.embeddings.active()
    assert active is not None
    capsys.readouterr()
    before = snapshot(fresh_store)
    assert main(["reembed", "--cancel", str(active.id), "--reason", "x"]) == 1
    assert "generation_not_pending" in capsys.readouterr().err
    assert main(["reembed", "--cancel", str(gen), "--reason", "y" * 201]) == 2
    # A start takes a why now (audited): one too long is refused before anything starts.
    assert main(["reembed", "--model", "hashing:8", "--reason", "z" * 201]) == 2
    assert snapshot(fresh_store) == before

    assert main(["reembed", "--cancel", str(gen), "--reason", "from the shell", "--by", "cli"]) == 0
    assert f'"cancelled": {gen}' in capsys.readouterr().out
    assert fresh_store.embeddings.get(gen).status == "cancelled"  # type: ignore[union-attr]
    entry = fresh_store.audit.page().items[0]
    assert (entry.action, entry.requested_by, entry.detail["reason"]) == (
        "reembed.cancel",
        "cli",
        "from the shell",
    )
    assert follow(fresh_store, gen, poll_s=0.01) == 1
    assert "engram: reembed cancelled by cli: from the shell" in capsys.readouterr().err


def test_starting_a_reembed_asks_first_and_says_what_it_replaces(
    http: TestClient, fresh_store: Store
) -> None:
    """Issue 42, item 3: one click on Start retired what recall ran on. Start answers a
    confirmation naming the active generation (retired once the new one is complete)
    and a pending one of another model (retired at once); nothing starts until it is
    confirmed, with the why typed kept."""
    active = fresh_store.embeddings.active()
    assert active is not None
    before = [(g.id, g.status) for g in fresh_store.embeddings.all()]
    page = http.get("/generations").text
    asked = http.post(
        "/generations/reembed",
        data={"csrf": csrf_of(page), "model": "hashing:16", "why": "smaller vectors"},
    )
    assert asked.status_code == 200, asked.text
    replaces = asked.text.split('id="reembed-replaces">', 1)[1].split("</dd>", 1)[0]
    assert f"generation #{active.id}" in replaces and active.model_id in replaces
    assert "5 vectors" in replaces and "<b>retired</b> when the new generation" in replaces
    assert 'name="confirm" value="yes"' in asked.text
    assert 'name="why" maxlength="200"' in asked.text and 'value="smaller vectors"' in asked.text
    # Asking changed nothing: no generation, no audit row.
    assert [(g.id, g.status) for g in fresh_store.embeddings.all()] == before
    assert [e for e in fresh_store.audit.page().items if e.action == "reembed.start"] == []

    started = http.post(
        "/generations/reembed",
        data={"csrf": csrf_of(page), "model": "hashing:16", "why": "smaller", "confirm": "yes"},
    )
    assert started.status_code == 303
    pending = pending_id(fresh_store)
    # Another model while that one is pending: it would be retired at once, and says so.
    asked = http.post("/generations/reembed", data={"csrf": csrf_of(page), "model": "hashing:24"})
    supersedes = asked.text.split('id="reembed-supersedes">', 1)[1].split("</dd>", 1)[0]
    assert f"generation #{pending}" in supersedes and "<b>retired at once</b>" in supersedes
    assert pending_id(fresh_store) == pending
    # An unregistered model is refused before anything is asked.
    refused = http.post("/generations/reembed", data={"csrf": csrf_of(page), "model": "x:y"})
    assert refused.status_code == 422 and 'id="confirm-reembed"' not in refused.text
