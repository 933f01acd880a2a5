"""Every statement a page or an API call sends is bounded (ENGRAM_WEB_STATEMENT_TIMEOUT),
on the real PostgreSQL: a table held under an ACCESS EXCLUSIVE lock by another
connection makes the endpoints that read it wait, and past the bound they answer a
typed 503 with Retry-After, change nothing, and leave the server answering."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pytest
from starlette.testclient import TestClient

from engram.store import Store
from engram.store.vectors.embeddings import statement_bound
from engram.web import WebConfig
from engram.worker.embedded.runtime import connect_redis
from tests.redis_fixtures import FAST
from tests.web_fixtures import BASE_URL, TOKEN, make_app, sign_in

TIMEOUT_S = 0.2
# How long the lock is held at most: a request that is not bounded waits this long and
# then succeeds, so a missing bound fails the test instead of hanging it.
RELEASE_AFTER_S = 10.0


@dataclass
class Bounded:
    client: TestClient
    store: Store


@pytest.fixture
def bounded(store: Store, dsn: str, redis_url: str) -> Iterator[Bounded]:
    """The app on a store whose statements are bounded at 200 ms (``store``: migrated)."""
    config = WebConfig(
        token=TOKEN,
        partitions=FAST.partitions,
        lease_ttl_ms=FAST.lease_ttl_ms,
        statement_timeout_s=TIMEOUT_S,
    )
    with Store.connect(
        dsn,
        migrate=False,
        statement_timeout_s=config.statement_timeout_s,
        admin_statement_timeout_s=config.admin_statement_timeout_s,
    ) as bounded_store:
        redis_client = connect_redis(redis_url)
        app = make_app(bounded_store, redis_client, config=config)
        with TestClient(app, base_url=BASE_URL, follow_redirects=False) as client:
            sign_in(client, "local")
            yield Bounded(client, bounded_store)
        redis_client.close()


@contextmanager
def locked(dsn: str, table: str) -> Iterator[None]:
    """``table`` under an ACCESS EXCLUSIVE lock from another connection, released on
    exit or after RELEASE_AFTER_S, whichever comes first."""
    with psycopg.connect(dsn) as conn:
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        release = threading.Timer(RELEASE_AFTER_S, conn.rollback)
        release.start()
        try:
            yield
        finally:
            release.cancel()
            release.join()
            conn.rollback()


def test_an_api_read_past_the_bound_is_a_typed_503_and_the_server_answers_after(
    bounded: Bounded, dsn: str
) -> None:
    with locked(dsn, "engram_receipts"):
        answer = bounded.client.get("/api/v1/receipts")
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "statement_timeout" and error["retry_after_s"] == 1
        assert "ENGRAM_WEB_STATEMENT_TIMEOUT" in error["message"]
        assert answer.headers["retry-after"] == "1"
        # Meanwhile what does not read that table answers at once.
        assert bounded.client.get("/healthz").status_code == 200
    assert bounded.client.get("/api/v1/receipts").status_code == 200


def test_a_page_past_the_bound_is_a_503_page(bounded: Bounded, dsn: str) -> None:
    with locked(dsn, "engram_receipts"):
        page = bounded.client.get("/receipts")
        assert page.status_code == 503
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["retry-after"] == "1"
        assert "<h1>503</h1>" in page.text and "statement_timeout" in page.text
        assert 'href="/receipts"' in page.text  # the dashboard's own layout, navigation
    assert bounded.client.get("/receipts").status_code == 200


def test_an_action_past_the_bound_changes_nothing(bounded: Bounded, dsn: str) -> None:
    """A generation's cancel that cannot read its generation in time: 503, the
    generation still pending, nothing audited. Afterwards the same cancel goes through
    (its purge of the generation's vectors under the longer, maintenance bound)."""
    store = bounded.store
    generation = store.embeddings.begin("timeout-test-model", 8)
    audited = len(store.audit.about(str(generation.id)))
    path = f"/api/v1/generations/{generation.id}/cancel"
    with locked(dsn, "engram_generations"):
        answer = bounded.client.post(path, json={"reason": "too slow"})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "statement_timeout"
    after = store.embeddings.get(generation.id)
    assert after is not None and after.status == "pending"
    assert len(store.audit.about(str(generation.id))) == audited
    answer = bounded.client.post(path, json={"reason": "now"})
    assert answer.status_code == 200, answer.text
    cancelled = store.embeddings.get(generation.id)
    assert cancelled is not None and cancelled.status == "cancelled"


def test_every_connection_is_bounded_and_maintenance_has_its_own_bound(bounded: Bounded) -> None:
    with bounded.store.pool.connection() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("200ms",)
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(1)")
        with statement_bound(conn, 30):
            conn.execute("SELECT pg_sleep(0.3)")  # past the pages' bound, within its own
        # ... and back to the connection's own after it.
        assert conn.execute("SHOW statement_timeout").fetchone() == ("200ms",)
    assert (
        bounded.store.embeddings.admin_timeout_s == WebConfig(token=TOKEN).admin_statement_timeout_s
    )


def test_the_bound_is_configured_as_the_other_durations() -> None:
    token = {"ENGRAM_DASHBOARD_TOKEN": TOKEN}
    assert WebConfig.from_env(token).statement_timeout_s == 5.0
    assert WebConfig.from_env(token).admin_statement_timeout_s == 300.0
    config = WebConfig.from_env(
        {**token, "ENGRAM_WEB_STATEMENT_TIMEOUT": "2s", "ENGRAM_WEB_ADMIN_STATEMENT_TIMEOUT": "1h"}
    )
    assert (config.statement_timeout_s, config.admin_statement_timeout_s) == (2.0, 3600.0)
    assert config.retry_after_s == 2
    off = WebConfig.from_env({**token, "ENGRAM_WEB_STATEMENT_TIMEOUT": "off"})
    assert off.statement_timeout_s is None
