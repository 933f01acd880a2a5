"""``engram web``: a real uvicorn serving the dashboard against configured servers."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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


def test_on_a_home_it_makes_the_operators_token_and_says_how_to_sign_in(
    serve_web: Callable[..., Served], store: Store, dsn: str, redis_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    served = serve_web(
        database_url=dsn,
        redis_url=redis_url,
        env={"ENGRAM_HOME": str(home), "ENGRAM_DASHBOARD_TOKEN": ""},
    )
    token = (home / "dashboard.token").read_text().strip()
    assert stat.S_IMODE((home / "dashboard.token").stat().st_mode) == 0o600
    assert httpx.get(served.url + "/api/v1/scopes").status_code == 401
    mine = {"Authorization": f"Bearer {token}"}
    assert httpx.get(served.url + "/api/v1/scopes", headers=mine).status_code == 200
    # Its output is a file: how to get a link, never one.
    assert f"engram signin --url {served.url}/" in served.log()
    assert "login?code=" not in served.log() and token not in served.log()
    printed = subprocess.run(
        [sys.executable, "-m", "engram", "signin", "--url", served.url + "/"],
        env={**os.environ, "ENGRAM_HOME": str(home), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    link = printed.stdout.strip()
    with httpx.Client(follow_redirects=False) as browser:
        assert browser.get(link).status_code == 303
        assert "signed in as <b>local</b>" in browser.get(served.url + "/").text
    assert httpx.get(link).status_code == 401  # once


def test_served_open_on_purpose_it_is_the_operators_until_a_scoped_token_is_live(
    serve_web: Callable[..., Served], store: Store, dsn: str, redis_url: str
) -> None:
    served = serve_web(
        database_url=dsn,
        redis_url=redis_url,
        env={"ENGRAM_DASHBOARD_TOKEN": "", "ENGRAM_DASHBOARD_OPEN": "on"},
    )
    assert "WARNING" in served.log() and "served OPEN" in served.log()
    assert httpx.get(served.url + "/api/v1/scopes").status_code == 200
    store.tokens.create("demo-agent", {"user_id": "demo"}, by="test")
    refused = httpx.get(served.url + "/api/v1/scopes")
    assert refused.status_code == 401 and "ENGRAM_DASHBOARD_OPEN" in refused.text
    store.tokens.revoke("demo-agent", by="test")
    assert httpx.get(served.url + "/api/v1/scopes").status_code == 200
    # Open is for loopback only, and not with a token.
    both = subprocess.run(
        [sys.executable, "-m", "engram", "web", "--port", "1"],
        env={
            **os.environ,
            "DATABASE_URL": dsn,
            "REDIS_URL": redis_url,
            "ENGRAM_DASHBOARD_TOKEN": TOKEN,
            "ENGRAM_DASHBOARD_OPEN": "on",
            "PYTHONPATH": str(REPO),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert both.returncode == 2 and "one or the other" in both.stderr
