"""In a real headless Chromium, served by ``engram web``, with a real stream worker and
a real jobs worker: after "Pause jobs" and "Pause partition", the overview says when
each pause is in effect (every live worker has seen it), not only that it was asked."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import expect
from rq import Worker

from engram.jobs import keys as jobs_keys
from engram.jobs import queues, runner
from engram.store import Store
from engram.worker import keys
from engram.worker.admin import pause
from engram.worker.consuming.membership import live_workers, now_ms
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import JobsProcess, jobs_processes  # noqa: F401
from tests.redis_fixtures import FAST, WorkerProcess, wait_until
from tests.web_fixtures import Browser, Served, Web


def test_the_overview_says_when_each_pause_is_in_effect(
    serve_web: Callable[..., Served],
    worker_processes: Callable[..., WorkerProcess],
    jobs_processes: Callable[..., JobsProcess],  # noqa: F811
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    browser: Browser,
) -> None:
    client = connect_redis(redis_url)
    worker_processes(database_url=fresh_dsn, redis_url=redis_url)
    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
    wait_until(
        lambda: live_workers(client, FAST.lease_ttl_ms), timeout=30, what="the stream worker"
    )
    wait_until(lambda: runner.pause_reports(client), timeout=30, what="the jobs worker")
    served = serve_web(database_url=fresh_dsn, redis_url=redis_url)
    page = browser.page
    try:
        page.goto(served.url + "/")
        page.get_by_role("button", name="Pause jobs").click()
        expect(page.locator("#paused")).to_contain_text("Jobs paused by local")
        # The overview polls: it goes on to say the pause is held by the one jobs worker.
        expect(page.locator("#seen-jobs")).to_contain_text(
            "In effect on the one jobs worker running: none starts a job", timeout=20_000
        )
        held = pause.jobs_paused(client)
        assert held is not None and not pause.jobs_not_yet_seen(held, runner.pause_reports(client))
        page.select_option("#pause-partition", "1")
        page.get_by_role("button", name="Pause partition").click()
        expect(page.locator("#paused")).to_contain_text("Partition #1 paused by local")
        expect(page.locator("#seen-partition-1")).to_contain_text(
            "In effect on the one worker running.", timeout=20_000
        )
        assert not pause.not_yet_seen(1, live_workers(client, FAST.lease_ttl_ms))
        browser.shot("overview-pauses-in-effect")
        page.set_viewport_size({"width": 390, "height": 844})
        browser.shot("overview-pauses-in-effect-390")
    finally:
        pause.resume_jobs(client)
        pause.resume_partition(client, 1)
        client.close()
    assert not [m for m in browser.console if "pageerror" in m]


def test_a_pause_not_yet_seen_names_the_workers_and_the_job_in_hand(web: Web) -> None:
    """A stream worker that has not reported the pause yet, and a jobs worker in the
    middle of a job: the overview (and GET /api/v1/paused) says whom it waits for, and
    what is still running."""
    web.redis.zadd(keys.WORKERS, {"w-slow": now_ms()})
    web.redis.hset(keys.worker("w-slow"), mapping={"host": "h", "pid": "1", "paused": ""})
    busy = Worker([queues.queue(web.redis, q) for q in jobs_keys.QUEUES], connection=web.redis)
    busy.register_birth()
    job = queues.queue(web.redis, jobs_keys.MAINTENANCE_QUEUE).enqueue_call("builtins.len")
    busy.prepare_execution(job)
    try:
        pause.pause_partition(web.redis, 2, pause.Pause.now("ada"))
        pause.pause_jobs(web.redis, pause.Pause.now("ada"))
        page = web.client.get("/").text
        assert "Waiting for 1 of 1 worker to see it" in page and "w-slow" in page
        assert "Waiting for 1 of 1 jobs worker to see it" in page
        assert f'still running: <a class="mono" href="/jobs/{job.id}">' in page
        listed = web.client.get("/api/v1/paused").json()
        [part] = listed["partitions"]
        assert (part["in_effect"], part["waiting_for"]) == (False, ["w-slow"])
        jobs = listed["jobs"]
        assert (jobs["in_effect"], jobs["waiting_for"]) == (False, [busy.name])
        assert jobs["running"] == [job.id]
        web.redis.hset(keys.worker("w-slow"), "paused", "2")
        assert web.client.get("/api/v1/paused").json()["partitions"][0]["in_effect"] is True
    finally:
        pause.resume_jobs(web.redis)
        pause.resume_partition(web.redis, 2)
        busy.register_death()
