"""Starting a reembed from the API and the dashboard with the real starter: a model
that cannot load is refused with a typed 422 and nothing is created."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from engram.jobs import keys, queues, reembed
from engram.store import Store
from engram.store.vectors.registry import EmbedderRegistry, parse_plugins
from engram.web import Services, WebConfig, create_app
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from tests.embedder_faults import FAULTY_PLUGINS
from tests.redis_fixtures import FAST
from tests.web_fixtures import BASE_URL, EMBEDDER, TOKEN, sign_in


@pytest.fixture
def client(store: Store, redis_url: str) -> Iterator[tuple[TestClient, redis.Redis]]:
    conn = connect_redis(redis_url)
    registry = EmbedderRegistry(parse_plugins(FAULTY_PLUGINS))

    def start_reembed(model: str, requested_by: str) -> str:
        return reembed.start(store, conn, registry, model, requested_by=requested_by).job_id

    app = create_app(
        WebConfig(token=TOKEN, partitions=FAST.partitions, lease_ttl_ms=FAST.lease_ttl_ms),
        Services(
            store=store,
            redis=conn,
            producer=Producer(conn, partitions=FAST.partitions),
            embedder=EMBEDDER,
            start_reembed=start_reembed,
            embedders=registry,
        ),
    )
    with TestClient(app, base_url=BASE_URL, follow_redirects=False) as test_client:
        sign_in(test_client, "local")
        yield test_client, conn
    conn.close()


def test_a_model_that_cannot_load_is_refused_by_the_api_and_the_form(
    client: tuple[TestClient, redis.Redis], store: Store
) -> None:
    http, conn = client
    before = [(g.id, g.status) for g in store.embeddings.all()]
    refused = http.post("/api/v1/reembed", json={"model": "unloadable"})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "embedder_cannot_load"
    assert "unloadable.onnx is missing" in error["message"]

    html = http.get("/generations").text
    marker = 'name="csrf" value="'
    csrf = html[html.index(marker) + len(marker) :].split('"', 1)[0]
    form = http.post(
        "/generations/reembed", data={"csrf": csrf, "model": "nofactory", "confirm": "yes"}
    )
    assert form.status_code == 422 and "no GPU here" in form.text
    assert form.text.startswith("<!doctype html>")

    assert [(g.id, g.status) for g in store.embeddings.all()] == before
    assert queues.queue(conn, keys.REEMBED_QUEUE).count == 0
    assert [e.action for e in store.audit.page().items] == []
    started = http.post("/api/v1/reembed", json={"model": "hashing:8"})
    assert started.status_code == 202 and started.json()["job_id"].startswith("reembed-")
