"""Store benchmark: write rate and recall latency in one scope, against baselines.

    python bench/bench_store.py [--sizes 1000,10000,100000] [--queries 200]

Writes: engram's full versioned write (record, revision, vector, text index,
receipt, scope revision) in batches through ``Store.execute``, against two
baselines measured in the same run on the same server: (a) plain INSERTs of
(id, text, vector) into a table whose HNSW index is kept current, (b) binary
COPY of the same rows into a table with no vector index.

Recall: ``Session.recall`` (hybrid: vector + full text + fusion) p50/p95 at
each size in one scope; at sizes where the scope passes the large-scope
threshold it is measured before (exact search) and after its HNSW index.
Embedding time is excluded from the write figures (computed up front) so the
database path is what is compared; the query embedding is included in recall.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from bench.common import fresh_database, percentile, scratch_postgres, sentences
from store import Operation, Store, WordLlamaEmbedder
from store.embedders import embed_checked


class Precomputed:
    """The default embedder's vectors, computed once so writes measure the database path."""

    def __init__(self, texts: list[str], vectors: np.ndarray) -> None:
        self.by_text = dict(zip(texts, vectors, strict=True))
        self.inner = WordLlamaEmbedder()

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dims(self) -> int:
        return self.inner.dims

    def embed(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.by_text]
        if missing:
            for t, v in zip(missing, self.inner.embed(missing), strict=True):
                self.by_text[t] = v
        return np.stack([self.by_text[t] for t in texts])


def bench_writes(dsn: str, texts: list[str], vectors: np.ndarray, batch: int) -> dict[str, float]:
    out = {}
    embedder = Precomputed(texts, vectors)
    with Store.connect(dsn) as store:
        ops = [Operation.build("remember", {"user_id": "writer"}, {"text": t}) for t in texts]
        t0 = time.perf_counter()
        for i in range(0, len(ops), batch):
            store.execute(ops[i : i + batch], embedder)
        out["engram versioned write"] = len(ops) / (time.perf_counter() - t0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS b_hnsw (id text, body text, v vector(256))")
        conn.execute("CREATE INDEX ON b_hnsw USING hnsw (v vector_cosine_ops)")
        conn.execute("CREATE TABLE IF NOT EXISTS b_copy (id text, body text, v vector(256))")
        rows = [(f"r{i}", t, v) for i, (t, v) in enumerate(zip(texts, vectors, strict=True))]
        t0 = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany("INSERT INTO b_hnsw VALUES (%s, %s, %s)", rows)
        out["baseline: INSERT, HNSW kept current"] = len(rows) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        with (
            conn.transaction(),
            conn.cursor() as cur,
            cur.copy("COPY b_copy (id, body, v) FROM STDIN WITH (FORMAT BINARY)") as copy,
        ):
            copy.set_types(["text", "text", "vector"])
            for row in rows:
                copy.write_row(row)
        out["baseline: binary COPY, no vector index"] = len(rows) / (time.perf_counter() - t0)
    return out


def bench_recall(store: Store, queries: list[str], scope: dict[str, str]) -> tuple[float, float]:
    mem = store.session(scope, embedder=WordLlamaEmbedder())
    mem.recall(queries[0])  # warm the pool and the model
    times = []
    for q in queries:
        t0 = time.perf_counter()
        mem.recall(q, top_k=5)
        times.append((time.perf_counter() - t0) * 1000)
    return percentile(times, 50), percentile(times, 95)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--write-records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = scratch_postgres()
    try:
        embedder = WordLlamaEmbedder()
        texts = sentences(max(max(sizes), args.write_records))
        t0 = time.perf_counter()
        vectors = embed_checked(embedder, texts)
        embed_rate = len(texts) / (time.perf_counter() - t0)

        writes = bench_writes(
            fresh_database(server, "writes"),
            texts[: args.write_records],
            vectors[: args.write_records],
            args.batch,
        )
        print(f"\n## Writes ({args.write_records} records, batches of {args.batch})\n")
        print("| path | records/s | vs engram |\n|---|---:|---:|")
        base = writes["engram versioned write"]
        for name, rate in writes.items():
            print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x |")
        print(f"\n(default embedder alone: {embed_rate:,.0f} sentences/s)")

        print(f"\n## Recall in one scope ({args.queries} queries, top 5, hybrid)\n")
        print("| records in scope | search | p50 ms | p95 ms |\n|---:|---|---:|---:|")
        queries = sentences(args.queries, seed=99, words=5)
        dsn = fresh_database(server, "recall")
        with Store.connect(dsn) as store:
            pre = Precomputed(texts, vectors)
            loaded = 0
            for size in sizes:
                scope = {"user_id": f"scope-{size}"}
                ops = [Operation.build("remember", scope, {"text": t}) for t in texts[:size]]
                for i in range(0, len(ops), 1000):
                    store.execute(ops[i : i + 1000], pre)
                loaded += size
                p50, p95 = bench_recall(store, queries, scope)
                print(f"| {size:,} | exact (generation, scope) | {p50:.1f} | {p95:.1f} |")
                if store.embeddings.index_large_scopes():
                    p50, p95 = bench_recall(store, queries, scope)
                    print(f"| {size:,} | HNSW for this scope | {p50:.1f} | {p95:.1f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
