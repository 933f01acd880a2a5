"""A pause of the jobs, with a real ``engram jobs`` process: a job taken once the jobs
are paused goes back to the front of its queue, not run; the worker then says in its
hash that it holds the pause, and from then on no job starts until they are resumed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from rq import Worker

from engram.jobs import keys as jobs_keys
from engram.jobs import prune, queues, runner
from engram.store import Store
from engram.worker.admin import pause
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import JobsProcess, jobs_processes  # noqa: F401
from tests.redis_fixtures import wait_until


def prune_job(client: redis.Redis) -> str:
    return prune.enqueue(client, "dead-letters", older_than_s=3600)


def acknowledged(client: redis.Redis, held: pause.Pause) -> bool:
    """Every live jobs worker holds the pause (the product's own word for it)."""
    reports = runner.pause_reports(client)
    return bool(reports) and not pause.jobs_not_yet_seen(held, reports)


def test_no_job_starts_once_the_pause_is_acknowledged(
    store: Store,
    dsn: str,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],  # noqa: F811
) -> None:
    client = connect_redis(redis_url)
    jobs_processes(database_url=dsn, redis_url=redis_url)
    [rq_worker] = wait_until(
        lambda: Worker.all(connection=client), timeout=30, what="the jobs worker"
    )

    def idle() -> bool:
        rq_worker.refresh()
        queued = sum(len(queues.queue(client, q)) for q in jobs_keys.QUEUES)
        return rq_worker.get_state() == "idle" and queued == 0

    wait_until(idle, timeout=30, what="the jobs worker idle")
    # Idle, it is blocked reading the queues: a job enqueued now reaches it at once,
    # though the jobs are paused. It must not run it.
    held = pause.Pause.now("tester", "upgrade")
    pause.pause_jobs(client, held)
    during = prune_job(client)

    def settled() -> str | None:
        if acknowledged(client, held):
            return "acknowledged"
        status = queues.status(client, during)
        return (
            str(getattr(status, "value", status))
            if status in ("started", "finished", "failed")
            else None
        )

    state = wait_until(settled, timeout=30, what="the pause acknowledged (or the job run)")
    assert state == "acknowledged" and queues.status(client, during) == "queued"
    # Every job queued meanwhile waits: ours, and any the jobs' own schedule queued since
    # the worker went idle (its ledger repair, at its tick).
    waiting = queues.queue(client, jobs_keys.MAINTENANCE_QUEUE).job_ids
    assert during in waiting
    assert [queues.status(client, j) for j in waiting] == ["queued"] * len(waiting)
    # Acknowledged: a job enqueued now waits too, while the worker looks again and
    # again (each look is a beat of its own).
    after = prune_job(client)
    beats: list[Any] = []

    def beats_seen() -> bool:
        rq_worker.refresh()
        if rq_worker.last_heartbeat not in beats:
            beats.append(rq_worker.last_heartbeat)
        return len(beats) >= 4

    wait_until(beats_seen, timeout=30, what="the worker's beats")
    assert [queues.status(client, j) for j in (during, after)] == ["queued", "queued"]
    assert acknowledged(client, held)
    pause.resume_jobs(client)
    wait_until(
        lambda: [queues.status(client, j) for j in (during, after)] == ["finished"] * 2,
        timeout=30,
        what="both jobs run once resumed",
    )
    assert [r["paused"] for r in runner.pause_reports(client)] == [None]
    client.close()
