"""The suite's own fixtures keep what they promise while sharing servers for speed: a
test's database is migrated and its own (a copy of the session's template, which no
test writes into) and dropped once the test has ended, an empty one is empty, the
session's servers skip the flushes no test needs, a test's browser context shares
nothing with another test's, though the module's tests share one Chromium, and the
plain RQ worker of ``tests.rq_jobs`` stops at once.

The pairs below run in either order (``--reverse-order``): each asserts that it finds
nothing, then leaves something behind that its twin would find."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
import redis
from rq import Queue

from engram.store import Operation, Store, migrations
from engram.store.server import EmbeddedPostgres
from engram.web.auth import SESSION_COOKIE
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey
from tests.conftest import NOT_DURABLE, TEMPLATE
from tests.redis_fixtures import wait_until
from tests.rq_jobs import PlainWorker
from tests.web_fixtures import EMBEDDER, Browser


@pytest.mark.parametrize("twin", ["first", "second"])
def test_a_fresh_store_is_migrated_and_holds_nothing_of_another_test(
    fresh_store: Store, fresh_dsn: str, twin: str
) -> None:
    with psycopg.connect(fresh_dsn) as conn:
        assert migrations.current_version(conn) == migrations.code_version()
    assert fresh_store.receipts() == []
    scope = {"user_id": "twin"}
    fresh_store.execute(
        [Operation.build("remember", scope, {"text": f"{twin} was here"})], EMBEDDER
    )
    assert len(fresh_store.receipts()) == 1


_ENDED_HERE: list[str] = []  # the databases of this module's twins below, as they ended


@pytest.mark.parametrize("twin", ["first", "second"])
def test_the_database_of_an_ended_test_is_dropped_as_the_next_is_made(
    postgres: EmbeddedPostgres, fresh_dsn: str, twin: str
) -> None:
    """The cluster keeps only the databases in use: pg_basebackup copies it whole."""
    with psycopg.connect(postgres.dsn()) as conn:
        names = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
    mine = psycopg.conninfo.conninfo_to_dict(fresh_dsn)["dbname"]
    assert mine in names
    assert [db for db in _ENDED_HERE if db in names] == []
    _ENDED_HERE.append(mine)


def test_an_empty_database_has_no_schema_nor_extension(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn) as conn:
        assert migrations.current_version(conn) == 0
        assert (
            conn.execute("SELECT extname FROM pg_extension WHERE extname = 'vector'").fetchall()
            == []
        )


def test_the_template_takes_no_connection(postgres: EmbeddedPostgres) -> None:
    """A connection to the template would make every copy wait, then fail."""
    with pytest.raises(psycopg.OperationalError, match="not currently accepting connections"):
        psycopg.connect(postgres.dsn(TEMPLATE)).close()


def test_the_session_servers_skip_the_flushes(
    postgres: EmbeddedPostgres, valkey: EmbeddedValkey
) -> None:
    with psycopg.connect(postgres.dsn()) as conn:
        for name, value in NOT_DURABLE.items():
            assert conn.execute(f"SHOW {name}").fetchone() == (value,)
    client = redis.Redis.from_url(valkey.url, decode_responses=True)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "no"}
    finally:
        client.close()


_CHROMIUM: list[Any] = []  # the Chromium each browser test of this module was given


@pytest.mark.parametrize("twin", ["first", "second"])
def test_a_browser_context_keeps_nothing_of_another_test(
    browser: Browser, chromium: Any, twin: str
) -> None:
    _CHROMIUM.append(chromium)
    assert all(c is chromium for c in _CHROMIUM)  # one Chromium for the module
    url = "http://127.0.0.1:9/"  # cookies need only a URL, not a server
    # Only the operator's session every context starts with, nothing of another test.
    assert [c["name"] for c in browser.context.cookies(url)] == [SESSION_COOKIE]
    browser.context.add_cookies([{"name": "twin", "value": twin, "url": url}])
    assert [c["value"] for c in browser.context.cookies(url) if c["name"] == "twin"] == [twin]


def test_a_plain_rq_worker_stops_without_waiting_out_its_command_channel(redis_url: str) -> None:
    """``tests.rq_jobs.work``'s worker: RQ's own read of 60 s held a burst's end for a
    minute when its thread had read its own unsubscribe (as in test_runner_stop)."""
    client = connect_redis(redis_url)
    worker = PlainWorker([Queue("plain", connection=client)], connection=client)
    worker.subscribe()
    wait_until(lambda: worker.pubsub.subscribed, timeout=10, what="the subscription")
    worker.pubsub.unsubscribe()  # the thread reads it, and waits to be subscribed again
    wait_until(lambda: not worker.pubsub.subscribed, timeout=10, what="the unsubscribe")
    time.sleep(0.2)  # into its next read
    started = time.monotonic()
    worker.unsubscribe()  # what RQ's teardown calls
    took = time.monotonic() - started
    client.close()
    assert not worker.pubsub_thread.is_alive()
    assert took < 10, f"the stop waited {took:.1f} s"
