"""Fixtures for the dashboard and API tests: the app on the suite's real PostgreSQL
and valkey (Starlette's TestClient, or ``engram web`` served by a real uvicorn in a
subprocess), and a headless Chromium driven by Playwright."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from starlette.testclient import TestClient

from engram.store import HashingEmbedder, Operation, Store, WriteResult
from engram.web import Services, WebConfig, create_app
from engram.web.auth import SESSION_COOKIE, Authenticator
from engram.web.services import ReembedStarter
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from tests.redis_fixtures import FAST, REPO

EMBEDDER = HashingEmbedder(64)  # the workers' (tests.redis_fixtures), so recall matches
BASE_URL = "http://127.0.0.1:8700"
TOKEN = "s3cret-dashboard-token-for-tests"
# What a program sends as the operator.
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}
ARTIFACTS = Path(os.environ.get("ENGRAM_TEST_ARTIFACTS") or REPO / "test-artifacts")
SCREENSHOTS = REPO / "docs" / "screenshots"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Web:
    """The app on the suite's servers, and ways to put data in."""

    store: Store
    redis: redis.Redis
    producer: Producer
    client: TestClient
    starts: list[tuple[str, str]] = field(default_factory=list)  # reembeds asked for

    def remember(self, scope: dict[str, str], text: str, **request: Any) -> str:
        """A record written directly (no worker needed); its id."""
        [result] = self.store.execute(
            [Operation.build("remember", scope, {"text": text, **request})], EMBEDDER
        )
        assert isinstance(result, WriteResult), result
        return result.records[0].id

    def scope_id(self, scope: dict[str, str]) -> int:
        found = self.store.scope_id(scope)
        assert found is not None
        return found

    def csrf(self, path: str = "/generations") -> str:
        """The CSRF token a page of this client's session carries."""
        html = self.client.get(path).text
        marker = 'name="csrf" value="'
        start = html.index(marker) + len(marker)
        return html[start : html.index('"', start)]


def sign_in(client: TestClient, name: str = "grace", token: str = TOKEN) -> Any:
    """Sign ``client`` in through the login form, as a person does: its answer."""
    page = client.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None, page.text
    return client.post(
        "/login", data={"csrf": csrf.group(1), "name": name, "token": token, "next": "/"}
    )


def make_app(
    store: Store,
    client: redis.Redis,
    *,
    config: WebConfig | None = None,
    start_reembed: ReembedStarter | None = None,
) -> Any:
    """The app, by default as ``engram web`` serves it: the operator signs in (``TOKEN``)."""
    return create_app(
        config
        or WebConfig(token=TOKEN, partitions=FAST.partitions, lease_ttl_ms=FAST.lease_ttl_ms),
        Services(
            store=store,
            redis=client,
            producer=Producer(client, partitions=FAST.partitions),
            embedder=EMBEDDER,
            start_reembed=start_reembed,
        ),
    )


@pytest.fixture
def web(store: Store, redis_url: str) -> Iterator[Web]:
    """The app (loopback, its operator token ``TOKEN``), its client signed in as the
    operator ``local``, with a reembed starter that records what it is asked."""
    client = connect_redis(redis_url)
    starts: list[tuple[str, str]] = []

    def start_reembed(model: str, requested_by: str) -> str:
        starts.append((model, requested_by))
        return f"reembed-{len(starts)}"

    app = make_app(store, client, start_reembed=start_reembed)
    with TestClient(app, base_url=BASE_URL, follow_redirects=False) as test_client:
        assert sign_in(test_client, "local").status_code == 303
        yield Web(store, client, Producer(client, partitions=FAST.partitions), test_client, starts)
    client.close()


# -- engram web, served for real -------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test process dies, however it dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_engram_web(
    log_dir: Path,
    *,
    database_url: str,
    redis_url: str,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Served:
    """``engram web`` in a subprocess (a real uvicorn), once it answers its probe, its
    operator token ``TOKEN`` (``OPERATOR`` are the headers that send it), on ``port``
    (a free one by default). It gets SIGTERM if this process dies; ``stop_engram_web``
    stops it by pid."""
    port = port or free_port()
    log_path = log_dir / f"web-{port}.log"
    full_env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "ENGRAM_EMBEDDER": "hashing:64",
        "ENGRAM_PARTITIONS": str(FAST.partitions),
        "ENGRAM_LEASE_TTL_MS": str(FAST.lease_ttl_ms),
        "ENGRAM_LEASE_MARGIN_MS": str(FAST.lease_margin_ms),
        "PYTHONPATH": str(REPO),
        # The operator's token, so that no home's is made in the checkout.
        "ENGRAM_DASHBOARD_TOKEN": TOKEN,
        **(env or {}),
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "engram", "web", "--host", host, "--port", str(port)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            preexec_fn=_die_with_parent,
        )
    served = Served(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise AssertionError(f"engram web exited ({process.returncode}):\n{served.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(served.url + "/healthz", timeout=1).status_code == 200:
                return served
        if time.monotonic() > deadline:
            stop_engram_web(served)
            raise AssertionError(f"engram web did not answer:\n{served.log()}")
        time.sleep(0.1)


def stop_engram_web(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait()


@pytest.fixture
def serve_web(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start ``engram web`` (see ``start_engram_web``); every one is stopped at the end."""
    started: list[Served] = []

    def start(**kwargs: Any) -> Served:
        served = start_engram_web(tmp_path, **kwargs)
        started.append(served)
        return served

    yield start
    for served in started:
        stop_engram_web(served)


# -- the browser -------------------------------------------------------------------------


def chromium_path() -> str:
    """Debian's chromium, else Playwright's own (installed if the machine can), else a
    failure that says what to install."""
    if os.path.exists("/usr/bin/chromium"):
        return "/usr/bin/chromium"
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    from playwright.sync_api import sync_playwright

    def bundled() -> str | None:
        with sync_playwright() as p:
            path = p.chromium.executable_path
        return path if path and os.path.exists(path) else None

    path = bundled()
    if path is None:
        subprocess.run(
            [sys.executable, "-m", "playwright", "install", "chromium"], check=False, timeout=600
        )
        path = bundled()
    if path is None:
        pytest.fail(
            "the browser tests need Chromium: apt-get install chromium, or "
            "python -m playwright install chromium"
        )
    return path


# How long an ``expect`` in a browser test waits for the page to show what it asserts.
EXPECT_TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def playwright_driver() -> Iterator[Any]:
    """Playwright's driver, for one test module: its sync API keeps an event loop
    running in this thread while it lives, and a later module's ``asyncio.run`` or
    ``anyio.run`` (the MCP client, the LangGraph store's async methods) would then fail
    with "Cannot run the event loop while another loop is running"."""
    from playwright.sync_api import expect, sync_playwright

    # What a page shows after a worker or a job acted, and its poll brought it: on a
    # machine running the whole suite on every core, 5 s (the default) is not enough.
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as p:
        yield p


@dataclass
class Browser:
    context: Any
    page: Any
    console: list[str]
    dialogs: list[str]

    def shot(self, name: str) -> Path:
        """A screenshot, saved with the test artifacts; with ENGRAM_UPDATE_SCREENSHOTS=1,
        in docs/screenshots/ (the docs' pictures, taken again only when asked)."""
        folder = SCREENSHOTS if os.environ.get("ENGRAM_UPDATE_SCREENSHOTS") == "1" else ARTIFACTS
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="module")
def chromium(playwright_driver: Any) -> Iterator[Any]:
    """One headless Chromium for a test module (as long as its Playwright driver lives):
    each test gets a context of its own in it (``browser``)."""
    launched = playwright_driver.chromium.launch(
        executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS
    )
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture
def browser(chromium: Any, request: pytest.FixtureRequest) -> Iterator[Browser]:
    """A fresh browser context (a profile of its own: no cookie, storage or cache of
    another test) in the module's Chromium, signed in as the operator ``local`` of every
    dashboard served on 127.0.0.1 with ``TOKEN`` (a cookie's host has no port); its
    console and any dialog are recorded (a script injected by memory text would open
    one). Parametrize indirectly with ``{"javascript": False}`` for a browser that runs
    no script at all, ``{"signed_in": False}`` for one that has not signed in."""
    options = getattr(request, "param", {})
    assert chromium.is_connected(), "the module's Chromium is gone (an earlier test crashed it)"
    context = chromium.new_context(
        viewport={"width": 1360, "height": 900},
        java_script_enabled=options.get("javascript", True),
    )
    if options.get("signed_in", True):
        session = Authenticator(WebConfig(token=TOKEN)).new_session("local")
        context.add_cookies(
            [{"name": SESSION_COOKIE, "value": session, "domain": "127.0.0.1", "path": "/"}]
        )
    page = context.new_page()
    console: list[str] = []
    dialogs: list[str] = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    page.on("pageerror", lambda exc: console.append(f"pageerror: {exc}"))

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    try:
        yield Browser(context, page, console, dialogs)
    finally:
        context.close()
