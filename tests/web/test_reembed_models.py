"""A reembed asked for from the web names a registered model, never a module path: the
API and the dashboard's form refuse ``package.module:callable`` before anything imports
or calls it, start no job, and create no generation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from starlette.testclient import TestClient

from engram.store import HashingEmbedder, Store
from engram.store.errors import UnregisteredModelError
from engram.store.vectors.registry import EmbedderRegistry
from engram.web import WebConfig
from engram.web_cli import build
from engram.worker.settings import Settings
from tests.web_fixtures import BASE_URL, TOKEN, sign_in

CALLED: list[str] = []
# What a request may not name; the first would start a real reembed if it were called.
MODULE_PATHS = [
    "tests.web.test_reembed_models:side_effect",
    "os:getpid",
    "builtins:print",
    "os:abort",  # last: called, it ends this process (and the test run)
]


def side_effect() -> HashingEmbedder:
    """An embedder factory anyone could name: it notes that it ran."""
    CALLED.append("side_effect")
    return HashingEmbedder(8)


@pytest.fixture
def client(
    fresh_dsn: str, fresh_store: Store, redis_url: str, tmp_path: Path
) -> Iterator[TestClient]:
    settings = Settings.from_env(
        {"ENGRAM_HOME": str(tmp_path), "DATABASE_URL": fresh_dsn, "REDIS_URL": redis_url}
    )
    with (
        build(settings, WebConfig(token=TOKEN), embedder=False) as app,
        TestClient(app, base_url=BASE_URL, follow_redirects=False) as web,
    ):
        sign_in(web, "local")
        yield web


def generations(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM engram_generations").fetchone()
    assert row is not None
    return int(row[0])


def csrf(client: TestClient) -> str:
    html = client.get("/generations").text
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


@pytest.mark.parametrize("model", MODULE_PATHS)
def test_a_module_path_is_refused_by_the_api_and_the_form(
    client: TestClient, fresh_dsn: str, model: str, capfd: pytest.CaptureFixture[str]
) -> None:
    before = generations(fresh_dsn)
    answer = client.post("/api/v1/reembed", json={"model": model})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "unregistered_model" and "registered" in error["message"]
    form = client.post("/generations/reembed", data={"model": model, "csrf": csrf(client)})
    assert form.status_code == 422 and "registered" in form.text
    assert generations(fresh_dsn) == before
    assert CALLED == []
    assert capfd.readouterr().out == ""  # builtins:print printed nothing
    assert client.get("/healthz").status_code == 200  # still here


def test_registered_names_still_start_a_reembed(client: TestClient, fresh_dsn: str) -> None:
    started = client.post("/api/v1/reembed", json={"model": "hashing:32"})
    assert started.status_code == 202, started.text
    assert generations(fresh_dsn) == 1


def test_the_registry_tells_names_from_module_paths() -> None:
    registry = EmbedderRegistry({"mine": "tests.web.test_reembed_models:side_effect"})
    for name in ("wordllama", "wordllama:64", "minilm", "hashing", "hashing:32", "mine", " minilm"):
        assert registry.check_registered(name) == name.strip()
    # A name in any case is that name (what an operator types from the docs: MiniLM).
    for name, meant in (("MiniLM", "minilm"), ("Hashing:32", "hashing:32"), ("MINE", "mine")):
        assert registry.check_registered(name) == meant
    for bad in [*MODULE_PATHS, "minilm:8", "mine:8", "os", "", "a.b:1", "hashing:x", "Os:GetPid"]:
        with pytest.raises(UnregisteredModelError) as refused:
            registry.check_registered(bad)
        # The refusal names what there is to ask for.
        assert "wordllama[:DIMS], minilm, hashing[:DIMS], mine" in refused.value.message
    assert CALLED == []
