"""A re-embedding that fails shows it while it retries: its errors and why, on the
progress of ``engram reembed``, on the overview and on /generations; and a failed
one's generation never reads "pending" beside its "reembed failed" badge (issue 29,
item 5). A real ``engram jobs`` process, the real servers."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from playwright.sync_api import expect
from starlette.testclient import TestClient

from engram.jobs import reembed
from engram.jobs.progress import Progress, generation_status, progress_of
from engram.jobs.settings import Reembed
from engram.store import HashingEmbedder, Store
from engram.store.values import Generation
from engram.store.vectors.registry import EmbedderRegistry, parse_plugins
from engram.worker.embedded.runtime import connect_redis
from tests.embedder_faults import BREAKS_WITH, FAULTY_PLUGINS
from tests.jobs_fixtures import JobsProcess
from tests.redis_fixtures import FAST, REPO, wait_until
from tests.web_fixtures import ARTIFACTS, BASE_URL, Browser, Served, make_app, sign_in

CAUSE = f"RuntimeError: {BREAKS_WITH}"


@pytest.fixture
def breaking(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],
) -> dict[str, str]:
    """20 records, and an ``engram jobs`` whose ``breaks`` embedder goes away after 10
    texts; a failed slice is retried once, after 10 minutes (the test sees it waiting)."""
    mem = fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64))
    for i in range(20):
        mem.remember(f"Ada's secret note number {i}.")
    env = {
        "DATABASE_URL": fresh_dsn,
        "REDIS_URL": redis_url,
        "ENGRAM_PARTITIONS": str(FAST.partitions),
        "ENGRAM_EMBEDDERS": FAULTY_PLUGINS,
        "ENGRAM_REEMBED_BATCH_SIZE": "5",
        "ENGRAM_REEMBED_RETRY": "600s",
    }
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={**env, "ENGRAM_TEST_EMBED_BREAK_AFTER": "10"},
    )
    return env


@contextlib.contextmanager
def reembed_cli(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``engram reembed --model breaks`` following its progress, its output in ``log``
    (not a terminal: a line at a time); stopped by pid at the end."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engram", "reembed", "--model", "breaks"],
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _breaking_generation(store: Store) -> Generation | None:
    return next((g for g in store.embeddings.all() if g.model_id == "breaks-24"), None)


def _progress(store: Store) -> Progress | None:
    generation = _breaking_generation(store)
    return Progress.from_dict(generation.progress) if generation else None


def test_a_retrying_reembed_shows_its_errors_in_the_cli_and_on_the_overview(
    fresh_store: Store, redis_url: str, breaking: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "reembed.out"
    with reembed_cli(breaking, log) as cli:
        retrying = wait_until(
            lambda: (p := _progress(fresh_store)) is not None and p.retrying and p,
            timeout=180,
            what="the failed slice to wait for its retry",
        )
        assert retrying.state in ("running", "waiting") and retrying.errors >= 1
        assert retrying.message == f"{CAUSE}; retrying in 600 s (0 more retries after that)"
        # The command says so, not "pass 1 waiting" for as long as the retry waits.
        line = wait_until(
            lambda: next((x for x in log.read_text().splitlines() if "retrying" in x), None),
            timeout=60,
            what="engram reembed to print the retry",
        )
        assert re.search(r"pass \d retrying · \d+ errors? · ", line), line
        assert CAUSE in line and "retrying in 600 s" in line
        assert "secret note" not in log.read_text()

        client = connect_redis(redis_url)
        with TestClient(make_app(fresh_store, client), base_url=BASE_URL) as http:
            sign_in(http, "local")
            overview = http.get("/").text
            assert "reembed retrying: " in overview
            assert f"{retrying.errors} error" in overview
            assert "retrying in 600 s" in overview and CAUSE in overview
            generations = http.get("/generations").text
            assert "reembed retrying</span>" in generations
            api = http.get("/api/v1/generations").json()
        client.close()
        [mine] = [g for g in api["items"] if g["model_id"] == "breaks-24"]
        assert mine["progress"]["retrying"] is True

        generation = _breaking_generation(fresh_store)
        assert generation is not None
        reembed.cancel(fresh_store, generation.id, requested_by="test", why=None)
        assert cli.wait(60) == 1  # the command ends with the cancel


def test_a_failed_reembed_reads_failed_in_its_status_and_its_badge(
    fresh_store: Store, redis_url: str, breaking: dict[str, str], tmp_path: Path
) -> None:
    """Once the retry is spent (here: none), the generation is still pending in the
    store; the pages call it failed, as its badge does."""
    breaking = {**breaking, "ENGRAM_REEMBED_RETRY": "off"}
    log = tmp_path / "reembed.out"
    with reembed_cli(breaking, log) as cli:
        assert cli.wait(300) == 1
    assert f"engram: reembed failed: {CAUSE}" in log.read_text()
    generation = _breaking_generation(fresh_store)
    assert generation is not None and generation.status == "pending"
    view = progress_of(generation.progress)
    assert view is not None and view.state == "failed" and not view.retrying
    assert generation_status(generation.status, view) == "failed"

    client = connect_redis(redis_url)
    with TestClient(make_app(fresh_store, client), base_url=BASE_URL) as http:
        sign_in(http, "local")
        page = http.get("/generations").text
        row = page[page.index(f'id="generation-{generation.id}"') :]
        row = row[: row.index("</tr>")]
        assert '<span class="badge failed"' in row and ">failed</span>" in row
        assert "pending" not in row
        overview = http.get("/").text
        assert "reembed failed" in overview and CAUSE in overview
        assert 'badge pending">pending' not in overview
    client.close()


# The docs' pictures are taken again only when asked: a test run leaves the checkout as
# it found it.
SCREENSHOTS = (
    REPO / "docs" / "screenshots"
    if os.environ.get("ENGRAM_UPDATE_SCREENSHOTS") == "1"
    else ARTIFACTS / "screenshots"
)


def test_a_person_sees_a_retrying_reembed_on_the_overview_and_generations(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    breaking: dict[str, str],
    serve_web: Callable[..., Served],
    browser: Browser,
) -> None:
    """In a real Chromium, served by ``engram web``: the overview card says the reembed
    is retrying, how many errors and why, where it said "reembed waiting: 0/54, ETA
    unknown"; its generation's row says ``reembed retrying`` with the cause."""
    client = connect_redis(redis_url)
    registry = EmbedderRegistry(parse_plugins(FAULTY_PLUGINS))
    started = reembed.start(
        fresh_store,
        client,
        registry,
        "breaks",
        requested_by="test",
        settings=replace(Reembed(), batch_size=5, retry_s=(600,)),
    )
    wait_until(
        lambda: (p := _progress(fresh_store)) is not None and p.retrying,
        timeout=180,
        what="the failed slice to wait for its retry",
    )
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(served.url + "/")
        card = page.locator(".reembed-progress")
        expect(card).to_contain_text("reembed retrying: 10 / 20")
        expect(card).to_contain_text("ETA unknown (retrying)")
        expect(card).to_contain_text("error")
        expect(page.locator(".reembed-trouble")).to_contain_text(CAUSE)
        expect(page.locator(".reembed-trouble")).to_contain_text("retrying in 600 s")
        page.locator(".card", has=card).screenshot(
            path=str(SCREENSHOTS / f"overview-reembed-retrying-{width}.png")
        )
        page.goto(served.url + "/generations")
        row = page.locator(f"#progress-{started.generation_id}")
        expect(row).to_contain_text("reembed retrying")
        expect(row).to_contain_text(CAUSE)
        page.screenshot(
            path=str(SCREENSHOTS / f"generations-reembed-retrying-{width}.png"), full_page=True
        )
    assert [m for m in browser.console if "Refused to" in m or "pageerror" in m] == []
    reembed.cancel(fresh_store, started.generation_id, requested_by="test", why=None)
    client.close()
