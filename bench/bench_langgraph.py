"""LangGraph store benchmark: a put, a get and a search on ``EngramStore`` against
LangGraph's own ``InMemoryStore`` and, when ``langgraph-checkpoint-postgres`` is
installed, its ``PostgresStore`` (on the same scratch PostgreSQL), interleaved.

    python -m bench.bench_langgraph [--items 200] [--rounds 100]

Every store gets the same embedder (engram's hashing one, 64 dimensions) for its
search index, so a search with a query is a vector search on all three (hybrid,
with full text, on engram's). ``--items`` items are put first; then each round puts
a new key, gets it and searches, on each store in turn, the order rotating, so a
busy moment of the machine falls on all alike. A put on ``EngramStore`` is a
remember or a revise sent through the streams and waited for (its receipt): the
row ``Producer, a remember to its receipt`` is that round trip alone, what a put
costs at the least.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from bench.common import discard, fresh_database, percentile, scratch_postgres, sentences
from engram.langgraph import EngramStore
from engram.langgraph import items as lg_items
from engram.store import HashingEmbedder, Store
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey

REPO = Path(__file__).resolve().parent.parent
SCOPE = {"user_id": "bench-langgraph"}
DIMS = 64
NAMESPACE = ("memories", "ada")


def ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def embed_with(embedder: HashingEmbedder) -> Callable[[Sequence[str]], list[list[float]]]:
    def embed(texts: Sequence[str]) -> list[list[float]]:
        return [list(map(float, v)) for v in embedder.embed(list(texts))]

    return embed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    home = Path(tempfile.mkdtemp(prefix="engram-bench-langgraph-"))
    server = scratch_postgres()
    valkey = EmbeddedValkey(home / "valkey").start()
    worker: subprocess.Popen[bytes] | None = None
    closers: list[Callable[[], Any]] = []
    try:
        dsn = fresh_database(server, "bench_langgraph")
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "DATABASE_URL": dsn,
            "REDIS_URL": valkey.url,
            "ENGRAM_HOME": str(home),
            "ENGRAM_EMBEDDER": f"hashing:{DIMS}",
        }
        store = Store.connect(dsn)
        closers.append(store.close)
        with open(home / "worker.log", "wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "engram", "worker"], env=env, stdout=log, stderr=log
            )
        embedder = HashingEmbedder(DIMS)
        producer = Producer(connect_redis(valkey.url))
        closers.append(producer.close)
        stores: dict[str, BaseStore] = {
            "EngramStore": EngramStore(store, producer, SCOPE, embedder=embedder),
            "InMemoryStore": InMemoryStore(index={"dims": DIMS, "embed": embed_with(embedder)}),
        }
        try:
            from langgraph.store.postgres import PostgresStore
        except ImportError:
            print("(langgraph-checkpoint-postgres is not installed: no PostgresStore row)")
        else:
            pg_dsn = fresh_database(server, "bench_langgraph_pg")
            opened = PostgresStore.from_conn_string(
                pg_dsn, index={"dims": DIMS, "embed": embed_with(embedder)}
            )
            postgres = opened.__enter__()
            closers.append(lambda: opened.__exit__(None, None, None))
            postgres.setup()
            stores["PostgresStore"] = postgres

        texts = sentences(args.items + args.rounds, seed=11)
        queries = [t.split(" ", 4)[-1] for t in sentences(args.rounds, seed=12)]
        for each in stores.values():
            for i, text in enumerate(texts[: args.items]):
                each.put(NAMESPACE, f"item-{i}", {"text": text, "i": i})

        names = list(stores)
        times: dict[tuple[str, str], list[float]] = {}
        floor: list[float] = []
        # Where an EngramStore search goes: engram's recall with the search's filters
        # (the namespace prefix, the item kind), and without them.
        where = lg_items.prefix_filter(NAMESPACE)
        recall_filtered: list[float] = []
        recall_plain: list[float] = []
        for r in range(args.rounds):
            text = texts[args.items + r]
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                each = stores[name]
                key = f"new-{r}"
                started = time.perf_counter()
                each.put(NAMESPACE, key, {"text": text, "i": r})
                times.setdefault((name, "put"), []).append(ms_since(started))
                started = time.perf_counter()
                assert each.get(NAMESPACE, key) is not None
                times.setdefault((name, "get"), []).append(ms_since(started))
                started = time.perf_counter()
                each.search(NAMESPACE, query=queries[r], limit=10)
                times.setdefault((name, "search"), []).append(ms_since(started))
            started = time.perf_counter()
            producer.remember(SCOPE, text, operation_id=f"bench:floor:{r}").wait(30)
            floor.append(ms_since(started))
            started = time.perf_counter()
            store.recall(
                SCOPE,
                queries[r],
                embedder=embedder,
                top_k=10,
                kind=lg_items.INDEXED,
                metadata=where,
            )
            recall_filtered.append(ms_since(started))
            started = time.perf_counter()
            store.recall(SCOPE, queries[r], embedder=embedder, top_k=10)
            recall_plain.append(ms_since(started))
    finally:
        for close in reversed(closers):
            close()
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
        valkey.stop()
        discard(server)
        shutil.rmtree(home, ignore_errors=True)

    print(f"\n{args.items} items in the namespace, {args.rounds} rounds")
    print("| store | put p50 / p95 ms | get p50 / p95 ms | search p50 / p95 ms |")
    print("|---|---:|---:|---:|")
    for name in names:
        cells = [
            f"{percentile(times[(name, op)], 50):.2f} / {percentile(times[(name, op)], 95):.2f}"
            for op in ("put", "get", "search")
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(
        f"| Producer, a remember to its receipt | {percentile(floor, 50):.2f} /"
        f" {percentile(floor, 95):.2f} | | |"
    )
    for name, samples in (
        ("engram recall, with the search's filters", recall_filtered),
        ("engram recall, no filter", recall_plain),
    ):
        cell = f"{percentile(samples, 50):.2f} / {percentile(samples, 95):.2f}"
        print(f"| {name} | | | {cell} |")


if __name__ == "__main__":
    main()
