"""A reembed under way while the jobs are paused waits for them: its progress, on the
overview and on /generations, says so (who paused them, since when, why)."""

from __future__ import annotations

from engram.worker.admin import pause
from tests.web_fixtures import Web


def test_a_reembed_waiting_on_paused_jobs_says_why(web: Web) -> None:
    pending = web.store.embeddings.begin("paused-model", 16)
    web.store.embeddings.set_progress(
        pending.id, {"state": "running", "pass": 1, "done": 0, "total": 54}
    )
    try:
        pause.pause_jobs(web.redis, pause.Pause.now("ada", "upgrade"))
        for path in ("/", "/generations"):
            html = web.client.get(path).text
            assert '<span class="badge waiting">waiting</span> jobs are paused by ada since' in html
            assert "(upgrade): no slice of it runs until they are resumed." in html, path
        pause.resume_jobs(web.redis)
        assert "jobs are paused" not in web.client.get("/").text
    finally:
        pause.resume_jobs(web.redis)
        web.store.embeddings.set_progress(pending.id, {"state": "failed"})
    # Over, it waits for nothing: paused jobs are not its reason any more.
    pause.pause_jobs(web.redis, pause.Pause.now("ada"))
    assert "jobs are paused by" not in web.client.get("/generations").text
    pause.resume_jobs(web.redis)
