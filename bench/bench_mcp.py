"""MCP benchmark: recall through MCP (stdio and streamable HTTP) against the same recall
called on the store directly, and a remember through MCP to its receipt against the
``Producer`` sending the same remember and waiting for the same receipt, in one run.

    python -m bench.bench_mcp [--records 1000] [--queries 200] [--writes 100]

Starts a scratch PostgreSQL, a valkey, one ``engram worker``, ``engram mcp`` (stdio,
driven by the SDK's ``ClientSession``) and ``engram web`` (``/mcp`` with a scoped
token); loads ``--records`` records into one scope, then times each call one at a
time (p50 / p95 ms), interleaved: each query is recalled directly, over stdio and
over HTTP in turn (the order rotating), so a busy moment of the machine falls on all
three alike. The difference is what the door costs: JSON-RPC, the process hop, schema
checks, the token's verification, its rate limit and its read log over HTTP; the
last table times those parts alone, the same number of times, to say where it goes.

Per-request INFO logs (httpx, httpx2, the SDK's) are off: WARNING and above only.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench.common import discard, fresh_database, percentile, scratch_postgres, sentences
from engram.store import HashingEmbedder, Operation, Store
from engram.web.ratelimit import Limiter, RateLimits
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey

REPO = Path(__file__).resolve().parent.parent
SCOPE = {"user_id": "bench-mcp"}
EMBEDDER = "hashing:64"


def ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Loggers that say every request at INFO: the bench prints its tables, not them.
QUIET = ("httpx", "httpx2", "mcp", "mcp_types", "engram")


async def interleaved(
    direct: Callable[[str], object],
    sessions: list[ClientSession],
    queries: list[str],
) -> list[list[float]]:
    """Each query recalled directly and through each session in turn, the order
    rotating per query; the times per door, in that order."""
    doors: list[Callable[[str], Awaitable[object]]] = [_direct(direct)]
    doors += [_recall(session) for session in sessions]
    times: list[list[float]] = [[] for _ in doors]
    for i, query in enumerate(queries):
        for k in range(len(doors)):
            door = (i + k) % len(doors)
            started = time.perf_counter()
            await doors[door](query)
            times[door].append(ms_since(started))
    return times


def _direct(direct: Callable[[str], object]) -> Callable[[str], Awaitable[object]]:
    async def call(query: str) -> object:
        return direct(query)

    return call


def _recall(session: ClientSession) -> Callable[[str], Awaitable[object]]:
    async def call(query: str) -> object:
        result = await session.call_tool("recall", {"query": query})
        assert isinstance(result, types.CallToolResult) and not result.is_error
        return result

    return call


async def writes_interleaved(
    producer: Producer, sessions: list[ClientSession], texts: list[str]
) -> list[list[float]]:
    """Each text remembered (to its receipt) by the Producer and through each session
    in turn, rotating; a text each time, and its own operation id."""
    times: list[list[float]] = [[] for _ in range(1 + len(sessions))]
    texts_left = iter(texts)
    for i in range(len(texts) // (1 + len(sessions))):
        for k in range(1 + len(sessions)):
            door = (i + k) % (1 + len(sessions))
            text = next(texts_left)
            started = time.perf_counter()
            if door == 0:
                producer.remember(SCOPE, text, operation_id=f"bench:producer:{i}").wait(30)
            else:
                arguments = {"text": text, "operation_id": f"bench:{door}:{i}"}
                result = await sessions[door - 1].call_tool("remember", arguments)
                assert isinstance(result, types.CallToolResult) and not result.is_error
                assert result.structured_content["state"] == "committed"
            times[door].append(ms_since(started))
    return times


def parts(store: Store, secret: str, redis_url: str, n: int) -> dict[str, list[float]]:
    """What an HTTP recall does besides the recall, each timed alone ``n`` times: the
    token's verification (a query), its rate limit (a script in valkey), its read log
    (an insert of the ids returned)."""
    grant = store.tokens.verify(secret)
    assert grant is not None
    client = connect_redis(redis_url)
    limited = Limiter(client, RateLimits(reads_per_minute=10**9, writes_per_minute=10**9))
    hits = store.recall(SCOPE, "anything", text_only=True, top_k=5)
    returned = [(h.record.id, h.record.revision) for h in hits]
    timed: dict[str, list[float]] = {"verify": [], "rate limit": [], "read log": []}
    for _ in range(n):
        started = time.perf_counter()
        store.tokens.verify(secret)
        timed["verify"].append(ms_since(started))
        started = time.perf_counter()
        limited.take(grant, "recall")
        timed["rate limit"].append(ms_since(started))
        started = time.perf_counter()
        store.tokens.log_reads(grant, "recall", returned)
        timed["read log"].append(ms_since(started))
    client.close()
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--writes", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)

    home = Path(tempfile.mkdtemp(prefix="engram-bench-mcp-"))
    server = scratch_postgres()
    valkey = EmbeddedValkey(home / "valkey").start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        dsn = fresh_database(server, "bench_mcp")
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "DATABASE_URL": dsn,
            "REDIS_URL": valkey.url,
            "ENGRAM_HOME": str(home),
            "ENGRAM_EMBEDDER": EMBEDDER,
        }
        store = Store.connect(dsn)
        embedder = HashingEmbedder(64)
        texts = sentences(args.records + 4 * args.writes, seed=7)
        store.execute(
            [Operation.build("remember", SCOPE, {"text": t}) for t in texts[: args.records]],
            embedder,
        )
        queries = [t.split(" ", 4)[-1] for t in sentences(args.queries, seed=8)]
        log = open(home / "processes.log", "wb")  # noqa: SIM115
        base = [sys.executable, "-m", "engram"]
        processes.append(subprocess.Popen([*base, "worker"], env=env, stdout=log, stderr=log))
        port = free_port()
        processes.append(
            subprocess.Popen(
                [*base, "web", "--port", str(port)],
                env={**env, "ENGRAM_EMBEDDER": EMBEDDER},
                stdout=log,
                stderr=log,
            )
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("engram web did not start")
            time.sleep(0.2)
        secret, _ = store.tokens.create("bench", SCOPE, by="bench")

        producer = Producer(connect_redis(valkey.url))
        writes_at = args.records

        async def measure() -> tuple[list[list[float]], list[list[float]]]:
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "engram", "mcp", "--scope", '{"user_id": "bench-mcp"}'],
                env={k: v for k, v in env.items() if isinstance(v, str)},
                cwd=REPO,
            )
            auth = {"Authorization": f"Bearer {secret}"}
            with open(home / "stdio.log", "w") as errlog:
                async with (
                    stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as stdio,
                    httpx2.AsyncClient(headers=auth, timeout=30) as http_client,
                    streamable_http_client(url + "/mcp", http_client=http_client) as (
                        http_read,
                        http_write,
                    ),
                    ClientSession(http_read, http_write) as http,
                ):
                    await stdio.initialize()
                    await http.initialize()
                    for warm in queries[:5]:  # imports, pools, the first plans
                        await stdio.call_tool("recall", {"query": warm})
                        await http.call_tool("recall", {"query": warm})
                    recalls = await interleaved(
                        lambda q: store.recall(SCOPE, q, embedder=embedder, top_k=5),
                        [stdio, http],
                        queries,
                    )
                    texts_for = texts[writes_at : writes_at + 3 * args.writes]
                    writes = await writes_interleaved(producer, [stdio, http], texts_for)
                    return recalls, writes

        (direct_recall, stdio_recall, http_recall), writes = anyio.run(measure)
        producer_writes, stdio_writes, http_writes = writes
        producer.close()
        breakdown = parts(store, secret, valkey.url, len(queries))
        store.close()
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        valkey.stop()
        discard(server)
        shutil.rmtree(home, ignore_errors=True)

    def row(name: str, samples: list[float], baseline: list[float]) -> str:
        p50, p95 = percentile(samples, 50), percentile(samples, 95)
        ratio = p50 / percentile(baseline, 50)
        return f"| {name} | {p50:.1f} / {p95:.1f} | {ratio:.2f}x |"

    print(f"\n{args.records} records in the scope, {args.queries} recalls, {args.writes} writes")
    print("| call | p50 / p95 ms | p50 against the direct call |")
    print("|---|---:|---:|")
    print(row("recall, the store directly", direct_recall, direct_recall))
    print(row("recall through MCP, stdio", stdio_recall, direct_recall))
    print(row("recall through MCP, HTTP (token)", http_recall, direct_recall))
    print(row("remember to its receipt, Producer", producer_writes, producer_writes))
    print(row("remember to its receipt, MCP stdio", stdio_writes, producer_writes))
    print(row("remember to its receipt, MCP HTTP (token)", http_writes, producer_writes))
    added = percentile(http_recall, 50) - percentile(direct_recall, 50)
    print(f"\nMCP HTTP adds {added:.1f} ms to a recall at p50. Its parts, each alone:")
    print("| part of an HTTP recall | p50 / p95 ms |")
    print("|---|---:|")
    for name, samples in breakdown.items():
        print(f"| {name} | {percentile(samples, 50):.2f} / {percentile(samples, 95):.2f} |")


if __name__ == "__main__":
    main()
