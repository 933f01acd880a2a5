"""MCP benchmark: recall through MCP (stdio and streamable HTTP) against the same recall
called on the store directly, and a remember through MCP to its receipt against the
``Producer`` sending the same remember and waiting for the same receipt, in one run.

    python -m bench.bench_mcp [--records 1000] [--queries 200] [--writes 100]

Starts a scratch PostgreSQL, a valkey, one ``engram worker``, ``engram mcp`` (stdio,
driven by the SDK's ``ClientSession``) and ``engram web`` (``/mcp`` with a scoped
token); loads ``--records`` records into one scope, then times each call one at a
time (p50 / p95 ms). The difference is what the door costs: JSON-RPC, the process
hop, schema checks, the token's verification and read log over HTTP.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench.common import discard, fresh_database, percentile, scratch_postgres, sentences
from engram.store import HashingEmbedder, Operation, Store
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


async def through(
    session: ClientSession, queries: list[str], texts: list[str], tag: str
) -> tuple[list[float], list[float]]:
    """Recall each query, then remember each text (each to its receipt), timed."""
    recalls: list[float] = []
    writes: list[float] = []
    for query in queries:
        started = time.perf_counter()
        result = await session.call_tool("recall", {"query": query})
        recalls.append(ms_since(started))
        assert isinstance(result, types.CallToolResult) and not result.is_error
    for i, text in enumerate(texts):
        started = time.perf_counter()
        arguments = {"text": text, "operation_id": f"bench:{tag}:{i}"}
        result = await session.call_tool("remember", arguments)
        writes.append(ms_since(started))
        assert isinstance(result, types.CallToolResult) and not result.is_error
        assert result.structured_content["state"] == "committed", result.structured_content
    return recalls, writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--writes", type=int, default=100)
    args = parser.parse_args()

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

        direct_recall: list[float] = []
        for query in queries:
            started = time.perf_counter()
            store.recall(SCOPE, query, embedder=embedder, top_k=5)
            direct_recall.append(ms_since(started))
        producer_writes: list[float] = []
        producer = Producer(connect_redis(valkey.url))
        writes_at = args.records
        for i, text in enumerate(texts[writes_at : writes_at + args.writes]):
            started = time.perf_counter()
            producer.remember(SCOPE, text, operation_id=f"bench:producer:{i}").wait(30)
            producer_writes.append(ms_since(started))
        producer.close()

        async def over_stdio() -> tuple[list[float], list[float]]:
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "engram", "mcp", "--scope", '{"user_id": "bench-mcp"}'],
                env={k: v for k, v in env.items() if isinstance(v, str)},
                cwd=REPO,
            )
            with open(home / "stdio.log", "w") as errlog:
                async with (
                    stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    start = writes_at + args.writes
                    return await through(
                        session, queries, texts[start : start + args.writes], "stdio"
                    )

        async def over_http() -> tuple[list[float], list[float]]:
            auth = {"Authorization": f"Bearer {secret}"}
            async with (
                httpx2.AsyncClient(headers=auth, timeout=30) as http,
                streamable_http_client(url + "/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                start = writes_at + 2 * args.writes
                return await through(session, queries, texts[start : start + args.writes], "http")

        stdio_recall, stdio_writes = anyio.run(over_stdio)
        http_recall, http_writes = anyio.run(over_http)
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


if __name__ == "__main__":
    main()
