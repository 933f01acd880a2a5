"""The dashboard's Redis lists at scale: the dead letters and the failed jobs pages
(and the overview that counts them) with 200,000 of each, against the bare Redis
reads of a page in the same run.

    python -m bench.bench_lists [--letters 200000] [--failed-jobs 200000] [--requests 200]

Loads ``--letters`` dead letters (one XADD each) and ``--failed-jobs`` failed RQ jobs
(each a job hash in JSON, its failure result on its results stream, and its entry in
the queue's failed registry: what RQ leaves behind a failed job), then requests each
page ``--requests`` times through the app's own ASGI stack (no socket), first pages
and pages nine tenths in (by cursor), and times the bare reads each page stands on:
XREVRANGE COUNT 50 on the dead-letter stream, ZREVRANGE of 50 on the failed registry.
Prints a markdown table (p50 / p95 ms, the ratio of the medians) and whether every
page met the 500 ms p95 target.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.bench_web import (
    BENCH_TOKEN,
    LOADED_QUEUE,
    _get,
    load_failed_jobs,
    load_letters,
    rendered,
    timed,
)
from bench.common import MachineCpu, discard, fresh_database, percentile, scratch_postgres
from engram.jobs import queues as rq_queues
from engram.store import Store
from engram.web import Services, WebConfig, create_app
from engram.worker import Producer, keys
from engram.worker.embedded.valkey import EmbeddedValkey

TARGET_P95_MS = 500.0
QUEUE = LOADED_QUEUE


@dataclass
class Row:
    page: str
    web_ms: list[float]
    base: str
    base_ms: list[float]

    @property
    def ok(self) -> bool:
        return percentile(self.web_ms, 95) < TARGET_P95_MS


def pages(
    store: Store, client: redis.Redis, letters: int, failed: int
) -> list[tuple[str, str, str, Callable[[], Any]]]:
    registry = rq_queues.queue(client, QUEUE).failed_job_registry.key
    newest: Any = client.xrevrange(keys.DEAD_LETTERS, count=letters * 9 // 10)
    deep_letter = newest[-1][0].decode()
    deep_job: Any = client.zrevrange(registry, failed * 9 // 10, failed * 9 // 10, True)
    [(job_member, job_score)] = deep_job
    letter_cursor = store.cursors.encode("dead_letters", (deep_letter,))
    job_cursor = store.cursors.encode(
        f"jobs:{QUEUE}:failed", (repr(float(job_score)), job_member.decode())
    )
    dead_first = ("XREVRANGE + - COUNT 50", lambda: client.xrevrange(keys.DEAD_LETTERS, count=50))
    dead_deep = (
        "XREVRANGE (cursor) COUNT 50",
        lambda: client.xrevrange(keys.DEAD_LETTERS, max=deep_letter, count=50),
    )
    jobs_first = ("ZREVRANGE 0 49", lambda: client.zrevrange(registry, 0, 49))
    jobs_deep = (
        "ZREVRANGEBYSCORE (cursor) LIMIT 50",
        lambda: client.zrevrangebyscore(registry, job_score, "-inf", start=0, num=50),
    )

    def counts() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        pipe.xlen(keys.DEAD_LETTERS)
        pipe.zcard(registry)
        return pipe.execute()

    return [
        (f"dead letters ({letters:,}), first page", "/dead-letters", *dead_first),
        (
            "dead letters, 90% in (cursor)",
            f"/dead-letters?cursor={letter_cursor}",
            *dead_deep,
        ),
        (
            f"jobs: failed ({failed:,}), first page",
            f"/jobs?queue={QUEUE}&state=failed",
            *jobs_first,
        ),
        (
            "jobs: failed, 90% in (cursor)",
            f"/jobs?queue={QUEUE}&state=failed&cursor={job_cursor}",
            *jobs_deep,
        ),
        (
            "overview (counts both, latest 5 of each)",
            "/",
            "XLEN + ZCARD, pipelined",
            counts,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--letters", type=int, default=200_000)
    parser.add_argument("--failed-jobs", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    home = Path(tempfile.mkdtemp(prefix="engram-bench-lists-"))
    postgres = scratch_postgres()
    valkey = EmbeddedValkey(home / "valkey").start()
    try:
        store = Store.connect(fresh_database(postgres, "bench_lists"))
        client = redis.Redis.from_url(valkey.url)
        started = time.perf_counter()
        load_letters(client, args.letters)
        load_failed_jobs(client, args.failed_jobs)
        loaded_s = time.perf_counter() - started
        memory = client.info("memory")["used_memory_human"]
        print(f"loaded {args.letters:,} dead letters, {args.failed_jobs:,} failed jobs")
        print(f"in {loaded_s:.0f} s (valkey holds {memory})")
        app = create_app(
            WebConfig(token=BENCH_TOKEN),
            Services(store=store, redis=client, producer=Producer(client)),
        )
        # The jobs read back as engram's (JSON), with their error: real rows, not "unreadable".
        _, body = asyncio.run(_get(app, f"/jobs?queue={QUEUE}&state=failed"))
        assert body.count(b"ValueError: x") == 50 and b"unreadable" not in body
        cpu = MachineCpu()
        rows = [
            Row(name, rendered(app, path, args.requests), base, timed(read, args.requests))
            for name, path, base, read in pages(store, client, args.letters, args.failed_jobs)
        ]
        report(rows, args, cpu.shares())
    finally:
        valkey.stop()
        discard(postgres)
        shutil.rmtree(home, ignore_errors=True)


def report(rows: list[Row], args: argparse.Namespace, shares: Any) -> None:
    print()
    print(
        f"{args.requests} requests per page"
        + (f"; CPU busy {shares.busy:.0%}, stolen {shares.stolen:.0%}" if shares else "")
    )
    print()
    print("| page | dashboard p50 / p95 ms | bare Redis read | its p50 / p95 ms | ratio (p50) |")
    print("|---|---:|---|---:|---:|")
    for r in rows:
        web50, base50 = statistics.median(r.web_ms), statistics.median(r.base_ms)
        print(
            f"| {r.page} | {web50:.1f} / {percentile(r.web_ms, 95):.1f}"
            f"{'' if r.ok else ' **over**'} | {r.base} "
            f"| {base50:.2f} / {percentile(r.base_ms, 95):.2f} | {web50 / base50:.0f}x |"
        )
    worst = max(rows, key=lambda r: percentile(r.web_ms, 95))
    print()
    print(
        f"target (every page under {TARGET_P95_MS:.0f} ms p95): "
        f"{'met' if all(r.ok for r in rows) else 'NOT met'}; slowest p95: {worst.page}, "
        f"{percentile(worst.web_ms, 95):.1f} ms"
    )


if __name__ == "__main__":
    main()
