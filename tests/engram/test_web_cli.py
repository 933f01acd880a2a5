"""``engram web``: a real uvicorn serving the dashboard against configured servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable

import httpx

from engram.store import Store
from tests.redis_fixtures import REPO
from tests.web_fixtures import OPERATOR, TOKEN, Served, free_port


def test_any_bind_but_loopback_without_a_token_refuses_to_start(dsn: str, redis_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": dsn, "REDIS_URL": redis_url, "PYTHONPATH": str(REPO)}
    env.pop("ENGRAM_DASHBOARD_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "engram", "web", "--host", "0.0.0.0", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "ENGRAM_DASHBOARD_TOKEN" in done.stderr and "0.0.0.0" in done.stderr
    short = subprocess.run(
        [sys.executable, "-m", "engram", "web", "--host", "0.0.0.0"],
        env={**env, "ENGRAM_DASHBOARD_TOKEN": "short"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert short.returncode == 2 and "at least 16" in short.stderr


def test_served_on_loopback_it_logs_ids_never_query_strings(
    serve_web: Callable[..., Served], store: Store, dsn: str, redis_url: str
) -> None:
    served = serve_web(database_url=dsn, redis_url=redis_url)
    page = httpx.get(served.url + "/scopes?user_id=someone-private%40example.com", headers=OPERATOR)
    assert page.status_code == 200 and "content-security-policy" in page.headers
    assert "server" not in page.headers  # no version banner
    httpx.get(served.url + "/api/v1/records/mem_1?token=leaked-text", headers=OPERATOR)
    served.process.send_signal(signal.SIGTERM)
    # uvicorn finishes the requests in hand, then ends by the signal it was sent.
    assert served.process.wait(timeout=20) in (0, -signal.SIGTERM)
    log = served.log()
    assert "Finished server process" in log and "color_message" not in log
    assert "engram dashboard: http://127.0.0.1:" in log
    assert "path=/scopes status=200" in log and "operator=api" in log
    assert "someone-private" not in log and "leaked-text" not in log
    assert '"GET /scopes' not in log  # uvicorn's own access log is off


def test_served_on_all_interfaces_every_call_needs_the_token(
    serve_web: Callable[..., Served], store: Store, dsn: str, redis_url: str
) -> None:
    served = serve_web(
        database_url=dsn,
        redis_url=redis_url,
        host="0.0.0.0",
        env={"ENGRAM_DASHBOARD_TOKEN": TOKEN},
    )
    assert "(loopback, no token)" not in served.log()
    page = httpx.get(served.url + "/receipts")
    assert page.status_code == 303 and page.headers["location"] == "/login?next=/receipts"
    assert httpx.get(served.url + "/api/v1/receipts").status_code == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(served.url + "/api/v1/receipts", headers=bearer).status_code == 200
    assert httpx.get(served.url + "/healthz").json()["status"] == "ok"


def test_the_dashboards_connections_send_at_once() -> None:
    """The listening socket says TCP, so asyncio (as uvicorn serves) sets TCP_NODELAY on
    each connection: a response's head and body leave at once, not the body after the
    client's delayed ACK (40 ms and more a keep-alive request, before)."""
    import asyncio
    import socket

    from engram.web.config import WebConfig
    from engram.web_cli import listen

    sock, config = listen(WebConfig(host="127.0.0.1", port=free_port(), token=TOKEN), chosen=True)
    assert sock.proto == socket.IPPROTO_TCP
    nodelay: list[int] = []

    async def serve() -> None:
        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            nodelay.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", config.port)
            for _ in range(100):
                if nodelay:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(serve())
    assert nodelay and nodelay[0] != 0
