"""An operation's page follows its latest delivery: once its dead letter is retried, the
first delivery's failure is not the operation's outcome, and the page waits (and polls)
until the retry commits. In a real headless Chromium too, with a real worker."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

import redis
from playwright.sync_api import expect

from engram.store import Operation, Store
from engram.worker import keys
from engram.worker.admin import deadletters, pause
from engram.worker.consuming.membership import live_workers
from engram.worker.consuming.replies import send_reply
from engram.worker.embedded.runtime import connect_redis
from engram.worker.errors import DeadLetteredError
from engram.worker.protocol import encode_entry, encode_reply, partition_of
from tests.redis_fixtures import FAST, InProcessWorker, WorkerProcess, wait_until
from tests.web_fixtures import EMBEDDER, Browser, Served, Web


def dead_lettered(client: redis.Redis, op: Operation) -> str:
    """A letter, and the failure reply its delivery left, as a worker writes both."""
    pipe = client.pipeline(transaction=False)
    deadletters.add(
        pipe,
        partition=partition_of(op.scope, FAST.partitions),
        entry_id="5-0",
        operation_id=op.operation_id,
        raw=encode_entry(op)["op"],
        reason=deadletters.FAILED,
        error=DeadLetteredError("the embedder was down"),
        deliveries=1,
    )
    send_reply(pipe, op.key, encode_reply(DeadLetteredError("no"), "5-0"), 60)
    dead_id: bytes = pipe.execute()[0]
    return dead_id.decode()


def test_a_failed_reply_left_by_the_first_delivery_is_not_the_outcome_of_a_retry(
    web: Web,
    scope: dict[str, str],
    start_worker: Callable[..., InProcessWorker],
) -> None:
    op = Operation.build("remember", scope, {"text": "Committed on its retry."}, "op:retry:1")
    dead_id = dead_lettered(web.redis, op)
    # An operation id is its scope's: a failed delivery's reply is found with its scope.
    of_scope = f"?{urlencode(scope)}"
    assert (
        web.client.get(f"/api/v1/operations/{op.operation_id}{of_scope}").json()["state"]
        == "failed"
    )
    assert deadletters.retry(web.redis, dead_id) is not None
    # A retry that could not take the reply with it (on a Redis Cluster the reply is in
    # another slot): the entry in the backlog says a delivery is still to come.
    send_reply(web.redis, op.key, encode_reply(DeadLetteredError("no"), "5-0"), 60)
    assert (
        web.client.get(f"/api/v1/operations/{op.operation_id}{of_scope}").json()["state"]
        == "waiting"
    )
    page = web.client.get(f"/operations/{op.operation_id}{of_scope}")
    assert "Enqueued again" in page.text and 'hx-trigger="every 1s"' in page.text
    with start_worker(web.store):
        wait_until(
            lambda: (
                web.client.get(f"/api/v1/operations/{op.operation_id}{of_scope}").json()["state"]
                == "committed"
            ),
            what="the retry committed",
        )
    assert "badge committed" in web.client.get(f"/operations/{op.operation_id}{of_scope}").text


def test_a_discarded_letters_operation_says_it_was_discarded_by_whom_when_and_why(
    web: Web, scope: dict[str, str]
) -> None:
    """Issue 42, item 10: once its dead letter was discarded, the operation's page still
    said "failed — it was not applied" and linked to a letter that is gone."""
    op = Operation.build("remember", scope, {"text": "Never applied."}, "op:discarded:1")
    dead_id = dead_lettered(web.redis, op)
    before = web.client.get(f"/operations/{op.operation_id}").text
    assert "badge failed" in before and 'id="discarded"' not in before
    csrf = web.csrf(f"/dead-letters/{dead_id}/discard")
    gone = web.client.post(
        f"/dead-letters/{dead_id}/discard", data={"csrf": csrf, "why": "a duplicate of op 7"}
    )
    assert gone.status_code == 303
    page = web.client.get(f"/operations/{op.operation_id}").text
    said = page.split('id="discarded">', 1)[1].split("</p>", 1)[0]
    assert "<b>discarded</b> by local" in said and "a duplicate of op 7" in said
    assert "ago" in said and "It will not be applied." in said
    assert "It was not applied:" not in page and 'hx-trigger="every 1s"' not in page
    assert f'href="/audit?target={dead_id}"' in page
    # Discarded, then sent again by its producer and applied: the receipt wins.
    web.store.execute([op], EMBEDDER)
    assert "badge committed" in web.client.get(f"/operations/{op.operation_id}").text


def test_the_page_a_retry_redirects_to_ends_on_committed(
    serve_web: Callable[..., Served],
    worker_processes: Callable[..., WorkerProcess],
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
) -> None:
    client = connect_redis(redis_url)
    client.delete(keys.DEAD_LETTERS)
    scope = {"user_id": "retried-in-chromium"}
    number = partition_of(scope, FAST.partitions)
    op = Operation.build("remember", scope, {"text": "It committed on its retry."}, "op:retry:2")
    dead_id = dead_lettered(client, op)
    # Its partition paused, and the worker seen to hold the pause: the retry waits in
    # the stream until the page has shown it waiting.
    pause.pause_partition(client, number, pause.Pause.now("tester", "hold the retry"))
    worker_processes(database_url=fresh_dsn, redis_url=redis_url)

    def pause_seen() -> bool:
        workers = live_workers(client, FAST.lease_ttl_ms)
        return bool(workers) and not pause.not_yet_seen(number, workers)

    try:
        wait_until(pause_seen, timeout=30, what="the worker holding the pause")
        served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
        page = browser.page
        shown: list[str] = []
        mine = f"/operations/{op.operation_id}"
        page.on("response", lambda r: shown.append(r.text()) if mine in r.url else None)
        page.goto(f"{served.url}/dead-letters/{dead_id}")
        page.get_by_role("button", name=f"Retry on partition {number}").click()
        expect(page.locator("h1")).to_contain_text(op.operation_id)
        expect(page.locator("#operation .badge")).to_have_text("waiting")
        browser.shot("operation-retried-waiting")
        pause.resume_partition(client, number)
        expect(page.locator("#operation .badge")).to_have_text("committed", timeout=30_000)
        browser.shot("operation-retried-committed")
    finally:
        pause.resume_partition(client, number)
        client.close()
    # Every answer the page had, the redirect's and each poll's: none said failed.
    assert shown and not [html for html in shown if "badge failed" in html]
    assert fresh_store.browse.receipt(op.operation_id) is not None
