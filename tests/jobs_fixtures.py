"""Fixtures for the jobs' tests: ``engram jobs`` subprocesses (stopped by pid), the
jobs run in this process, and embedders the tests plug in by ``ENGRAM_EMBEDDERS``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rq.job import Job

from engram.jobs import keys, queues, redaction, runner
from engram.jobs.context import JobContext
from engram.jobs.settings import JobsSettings
from engram.store import HashingEmbedder, Store
from engram.store.vectors.registry import EmbedderRegistry, parse_plugins
from engram.worker.consuming.worker import Worker
from engram.worker.embedded.runtime import connect_redis
from tests.redis_fixtures import FAST, InProcessWorker, WorkerProcess, spawn, stop_all

# The test embedders, by name, for every process of a test (workers and jobs).
PLUGINS = "slow=tests.jobs_fixtures:SlowHashing,leaky=tests.jobs_fixtures:LeakyEmbedder"


class SlowHashing(HashingEmbedder):
    """Feature hashing in 32 dimensions (its own model id), slowed by
    ``ENGRAM_TEST_EMBED_DELAY_S`` per call; each call appends ``pid start end texts``
    to ``ENGRAM_TEST_EMBED_MARK`` (when set), so a test sees who embedded what, when."""

    def __init__(self) -> None:
        super().__init__(32, model_id="slow-hashing-32")
        self.delay_s = float(os.environ.get("ENGRAM_TEST_EMBED_DELAY_S", "0"))
        self.mark = os.environ.get("ENGRAM_TEST_EMBED_MARK")

    def embed(self, texts: Any) -> Any:
        started = time.time()
        time.sleep(self.delay_s)
        vectors = super().embed(texts)
        if self.mark:
            with open(self.mark, "a") as f:
                f.write(f"{os.getpid()} {started:.6f} {time.time():.6f} {len(texts)}\n")
        return vectors


class LeakyEmbedder(HashingEmbedder):
    """An embedder that fails, quoting the text it was given (as careless code does)."""

    def __init__(self) -> None:
        super().__init__(16, model_id="leaky-16")

    def embed(self, texts: Any) -> Any:
        raise ValueError(f"cannot embed {texts[0]!r}")


def marks(path: Path) -> list[tuple[int, float, float, int]]:
    """The lines ``SlowHashing`` wrote: (pid, start, end, texts)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        pid, start, end, n = line.split()
        rows.append((int(pid), float(start), float(end), int(n)))
    return rows


def registry() -> EmbedderRegistry:
    return EmbedderRegistry(parse_plugins(PLUGINS))


def settings(**env: str) -> JobsSettings:
    """The jobs' settings for a test: short pauses, no retention schedules."""
    return JobsSettings.from_env(
        {
            "ENGRAM_RETAIN_HISTORY": "off",
            "ENGRAM_RETAIN_DEAD_LETTERS": "off",
            "ENGRAM_REDACTION_RETRY": "1s,1s",
            "ENGRAM_REEMBED_RETRY": "1s",
            "ENGRAM_REEMBED_LEASE_TTL": "2s",
            "ENGRAM_REEMBED_RESUME_AFTER": "1s",
            "ENGRAM_JOBS_TICK": "0.2s",
            "ENGRAM_REDACTION_WAIT": "30s",
            **env,
        }
    )


def context(store: Store, redis_url: str, **env: str) -> JobContext:
    return JobContext(
        store=store,
        client=connect_redis(redis_url),
        registry=registry(),
        settings=settings(**env),
        streams=FAST,
    )


def run_burst(ctx: JobContext, redis_url: str) -> None:
    """Run the queued jobs in this process until none is left (RQ burst mode)."""
    ctx.stopping.clear()
    runner.run(ctx, runner.rq_connection(redis_url), burst=True)


# An ``engram jobs`` subprocess: the same handle as a worker's.
JobsProcess = WorkerProcess


@pytest.fixture
def stream_worker(fresh_store: Store, redis_url: str) -> Iterator[Worker]:
    """A stream worker, in this process, that hands its forgets to the jobs."""
    worker = Worker(
        connect_redis(redis_url),
        fresh_store,
        HashingEmbedder(64),
        config=FAST,
        on_forget=redaction.hand_over,
    )
    with InProcessWorker(worker) as running:
        yield running


@pytest.fixture
def jobs_processes(tmp_path: Path) -> Iterator[Callable[..., JobsProcess]]:
    """Start ``engram jobs`` subprocesses; every one is stopped (by pid) at the end."""
    started: list[JobsProcess] = []

    def start(
        *, database_url: str, redis_url: str, env: dict[str, str] | None = None
    ) -> JobsProcess:
        full_env = {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "ENGRAM_EMBEDDERS": PLUGINS,
            "ENGRAM_PARTITIONS": str(FAST.partitions),
            "ENGRAM_DB_POOL_SIZE": "4",
            "ENGRAM_RETAIN_HISTORY": "off",
            "ENGRAM_RETAIN_DEAD_LETTERS": "off",
            "ENGRAM_REEMBED_LEASE_TTL": "2s",
            "ENGRAM_REEMBED_RETRY": "1s",
            "ENGRAM_REDACTION_RETRY": "1s,1s",
            "ENGRAM_JOBS_TICK": "0.2s",
            **(env or {}),
        }
        proc = spawn("jobs", full_env, tmp_path / f"jobs-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    stop_all(started)


# -- forget listeners the tests plug in (ENGRAM_FORGET_LISTENERS=package.module:callable) --


def record_event(event: Any) -> None:
    """Append the event (JSON) to ``ENGRAM_TEST_LISTENER_LOG``."""
    import json

    from engram.jobs import events

    with open(os.environ["ENGRAM_TEST_LISTENER_LOG"], "a") as f:
        f.write(json.dumps(events.to_dict(event)) + "\n")


def failing_listener(event: Any) -> None:
    """Fails while the file ``ENGRAM_TEST_FAIL_FLAG`` exists."""
    if os.path.exists(os.environ["ENGRAM_TEST_FAIL_FLAG"]):
        raise RuntimeError("the listener's service is down")


def jobs_of(client: Any, function: Callable[..., Any]) -> list[Job]:
    """Every job of ``function`` in engram's queues and their registries, as RQ holds it
    (arguments, retries left, status, result), read as JSON like the jobs worker."""
    name = f"{function.__module__}.{function.__qualname__}"
    ids: list[str] = []
    for queue_name in keys.QUEUES:
        queue = queues.queue(client, queue_name)
        ids += queue.get_job_ids()
        for registry in (
            queue.started_job_registry, queue.finished_job_registry,
            queue.failed_job_registry, queue.scheduled_job_registry,
            queue.deferred_job_registry, queue.canceled_job_registry,
        ):  # fmt: skip
            ids += registry.get_job_ids()
    found = queues.read_many(client, list(dict.fromkeys(ids)))
    return [j for j in found if isinstance(j, Job) and j.func_name == name]
