"""The dashboard and the API on the real jobs, as ``engram web`` builds them: a reembed
started through the API runs on an RQ jobs worker, its progress and its job show in
the API, the audit says who asked, and recall follows the new active generation."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from engram.web_cli import build
from store import HashingEmbedder, Store
from tests.jobs_fixtures import context, run_burst
from tests.web_fixtures import BASE_URL
from web import WebConfig
from worker.settings import Settings


def test_a_reembed_started_through_the_api_runs_on_the_jobs_and_recall_follows_it(
    fresh_store: Store, fresh_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    scope = {"user_id": "web-jobs"}
    mem = fresh_store.session(scope, embedder=HashingEmbedder(64))
    for i in range(40):
        mem.remember(f"Ada keeps note number {i} about green tea.")
    settings = Settings.from_env(
        {
            "ENGRAM_HOME": str(tmp_path / "home"),
            "DATABASE_URL": fresh_dsn,
            "REDIS_URL": redis_url,
            "ENGRAM_EMBEDDER": "hashing:64",
            "ENGRAM_PARTITIONS": "4",
        }
    )
    with build(settings, WebConfig(partitions=4)) as app, TestClient(app, base_url=BASE_URL) as web:
        refused = web.post("/api/v1/reembed", json={"model": "no-such-model"})
        assert refused.status_code == 422, refused.text
        started = web.post("/api/v1/reembed", json={"model": "hashing:32"})
        assert started.status_code == 202, started.text
        job_id = started.json()["job_id"]
        pending = web.get("/api/v1/generations").json()["items"][0]
        assert pending["status"] == "pending" and pending["progress"]["job_id"] == job_id
        assert pending["progress"]["requested_by"] == "local"

        run_burst(context(fresh_store, redis_url), redis_url)

        newest = web.get("/api/v1/generations").json()["items"][0]
        assert (newest["status"], newest["model_id"], newest["vectors"]) == (
            "active",
            "hashing-32",
            40,
        )
        assert newest["progress"]["state"] == "activated"
        assert newest["progress"]["done"] == newest["progress"]["total"] == 40
        job = web.get(f"/api/v1/jobs/{job_id}").json()
        assert job["state"] == "finished", job
        [entry] = [e for e in fresh_store.audit.page().items if e.action == "reembed.start"]
        assert (entry.target, entry.requested_by) == (job_id, "local")

        hits = web.post(
            "/api/v1/recall", json={"scope": scope, "text": "note number 7", "top_k": 3}
        ).json()
        # The dashboard was started with hashing:64; it now embeds with the active model.
        assert hits["vector_search"] is True
        assert any(h["match"] in ("vector", "hybrid") for h in hits["hits"])


@pytest.mark.parametrize("page", ["/generations", "/jobs"])
def test_the_pages_offer_the_jobs_once_they_are_there(
    fresh_dsn: str, fresh_store: Store, redis_url: str, tmp_path: Path, page: str
) -> None:
    settings = Settings.from_env(
        {"ENGRAM_HOME": str(tmp_path), "DATABASE_URL": fresh_dsn, "REDIS_URL": redis_url}
    )
    with (
        build(settings, WebConfig(), embedder=False) as app,
        TestClient(app, base_url=BASE_URL) as web,
    ):
        text = web.get(page).text
    assert "not available" not in text
    if page == "/jobs":
        assert "engram-reembed" in text and "engram-redaction" in text
