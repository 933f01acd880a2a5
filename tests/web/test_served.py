"""``engram web`` served by a real uvicorn: behind a trusted TLS proxy its cookies are
Secure and it sends HSTS (and believes no one else's X-Forwarded-Proto); requests
waiting for their operation hold no thread, so ``/healthz`` still answers."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from engram.store import Store
from engram.worker import keys
from tests.redis_fixtures import FAST
from tests.web_fixtures import OPERATOR, TOKEN, Served

HTTPS = {"X-Forwarded-Proto": "https"}


def sign_in(served: Served) -> httpx.Response:
    """Sign in as a browser behind the proxy would; the answer that sets the session."""
    with httpx.Client(base_url=served.url, headers=HTTPS) as client:
        page = client.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None, page.text
        # The proxy speaks HTTPS to the browser, plain HTTP here: the browser would send
        # the (Secure) CSRF cookie, httpx over http:// would not, so it is sent by hand.
        nonce = page.headers["set-cookie"].split(";")[0]
        client.cookies.clear()
        return client.post(
            "/login",
            data={"name": "ada", "token": TOKEN, "csrf": csrf[1], "next": "/"},
            headers={"Cookie": nonce},
        )


def session_cookie(response: httpx.Response) -> str:
    [cookie] = [c for c in response.headers.get_list("set-cookie") if "engram_session=" in c]
    return cookie


def test_behind_a_trusted_proxy_cookies_are_secure_and_hsts_is_sent(
    serve_web: Callable[..., Served], fresh_dsn: str, fresh_store: Store, redis_url: str
) -> None:
    env = {"ENGRAM_DASHBOARD_TOKEN": TOKEN, "ENGRAM_DASHBOARD_TRUSTED_PROXIES": "127.0.0.1"}
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url, env=env)
    signed_in = sign_in(served)
    assert signed_in.status_code == 303, signed_in.text
    assert "secure" in session_cookie(signed_in).lower()
    assert signed_in.headers["strict-transport-security"].startswith("max-age=")
    plain = httpx.get(served.url + "/healthz")  # the proxy's own plain-HTTP probe
    assert "strict-transport-security" not in plain.headers


def test_an_untrusted_peer_cannot_claim_https(
    serve_web: Callable[..., Served], fresh_dsn: str, fresh_store: Store, redis_url: str
) -> None:
    for proxies in ("", "10.9.9.9"):  # none configured; another host's
        env = {"ENGRAM_DASHBOARD_TOKEN": TOKEN, "ENGRAM_DASHBOARD_TRUSTED_PROXIES": proxies}
        served = serve_web(database_url=fresh_dsn, redis_url=redis_url, env=env)
        signed_in = sign_in(served)
        assert signed_in.status_code == 303, signed_in.text
        assert "secure" not in session_cookie(signed_in).lower()
        assert "strict-transport-security" not in signed_in.headers


@pytest.fixture
def unworked(
    serve_web: Callable[..., Served], fresh_dsn: str, fresh_store: Store, redis_url: str
) -> Served:
    """``engram web`` on a store of its own, with no worker to answer its operations."""
    return serve_web(database_url=fresh_dsn, redis_url=redis_url)


@pytest.fixture
def enqueued(redis_url: str) -> Iterator[Callable[[], int]]:
    """How many entries the operation streams hold now."""
    client = redis.Redis.from_url(redis_url)
    streams = [keys.stream(p) for p in range(FAST.partitions)]
    yield lambda: sum(int(client.xlen(s)) for s in streams)
    client.close()


def test_requests_waiting_for_their_operation_do_not_starve_healthz(
    unworked: Served, enqueued: Callable[[], int]
) -> None:
    """No worker runs: every ``?wait`` waits its whole 20 s. More of them than the
    thread pool has threads (40) are in flight, and ``/healthz`` answers at once."""
    served = unworked
    waiting = 48
    before = enqueued()

    async def scenario() -> float:
        limits = httpx.Limits(max_connections=waiting + 4)
        async with httpx.AsyncClient(
            base_url=served.url, limits=limits, timeout=60, headers=OPERATOR
        ) as http:
            body = {"kind": "remember", "scope": {"user_id": "w"}, "request": {"text": "t"}}
            tasks = [
                asyncio.create_task(http.post("/api/v1/operations?wait=20", json=body))
                for _ in range(waiting)
            ]
            # Every request is on its stream, so each is now waiting (the old server
            # took at most 40 at a time, each holding a thread while it waited).
            deadline = time.monotonic() + 15
            while enqueued() - before < 40 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert enqueued() - before >= 40
            started = time.monotonic()
            health = await http.get("/healthz", timeout=10)
            took = time.monotonic() - started
            assert health.status_code == 200
            assert not any(t.done() for t in tasks)  # all still waiting
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return took

    # Its own thread, for its own event loop: a sync Playwright test run before this
    # one may leave a loop marked running on the main thread.
    with ThreadPoolExecutor(1) as pool:
        took = pool.submit(asyncio.run, scenario()).result()
    assert took < 5.0, took  # starved, it waited its whole 10 s and failed
    assert enqueued() - before == waiting


def test_a_stop_answers_the_requests_waiting_for_their_operation_and_exits(
    unworked: Served, enqueued: Callable[[], int]
) -> None:
    """No worker runs: requests wait (``?wait=30``, the most) when ``engram web`` is told
    to stop. Each is answered at once, 202 with its operation's id (it stays queued, as
    after a wait that ran out), and the server exits of itself: it does not wait the
    waits out, nor cancel them unanswered."""
    served = unworked
    waiting = 6
    before = enqueued()

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served.url, timeout=60, headers=OPERATOR) as http:
            body = {"kind": "remember", "scope": {"user_id": "s"}, "request": {"text": "t"}}
            tasks = [
                asyncio.create_task(http.post("/api/v1/operations?wait=30", json=body))
                for _ in range(waiting)
            ]
            while enqueued() - before < waiting:  # every one is now waiting
                assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
                await asyncio.sleep(0.05)
            served.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    with ThreadPoolExecutor(1) as pool:  # its own loop (see the test above)
        answers = pool.submit(asyncio.run, scenario()).result()

    # Its shutdown done, uvicorn ends by the signal it was sent (as a process should).
    assert served.process.wait(timeout=15) == -signal.SIGTERM, served.log()
    assert "Application shutdown complete" in served.log()
    assert [a.status_code for a in answers] == [202] * waiting, [a.text for a in answers]
    assert all(a.json()["state"] == "enqueued" for a in answers)
    assert enqueued() - before == waiting  # queued still, for the workers to apply
    assert "timeout graceful shutdown exceeded" not in served.log()
