"""Store benchmark: write rate and recall latency in one scope, against baselines.

    python -m bench.bench_store [--sizes 1000,10000,100000] [--queries 200]

Writes: engram's full versioned write (record, revision, vector, text index,
receipt, scope revision) in batches through ``Store.execute``, against two
baselines measured in the same run on the same server: (a) plain INSERTs of
(id, text, vector) into a table whose HNSW index is kept current, (b) binary
COPY of the same rows into a table with no vector index.

Recall: ``Session.recall`` (hybrid: vector + full text + fusion) p50/p95 at
each size in one scope, interleaved query by query with baselines that issue the
plainest queries a user would write on the same rows (pgvector's exact search
of the scope, its HNSW index when the scope has one, PostgreSQL full-text
search), and the quality of each on the labelled set of ``bench/recall_set.py``
(hit@5, MRR) placed among the scope's filler. A scope past the large-scope
threshold gets its index first (timed), and engram's hybrid recall with the exact
vector search runs beside it: the approximate one must keep its quality. Per
size it prints the share of the exact vector top 50 the approximate search finds;
for an indexed scope, the rate of writes into it against writes into a scope with
no index while recall runs (and the fresh vectors are settled on the jobs
worker's schedule); then recall once more while a writer adds ``--write-rate``
operations per second to the same scope, against its quiet p95. The targets
(``RECALL_P95_TARGETS_MS``, ``WRITE_SHARE_TARGET``, ``UNDER_WRITES_TARGET``) are
printed met or not met at the end. Embedding time is excluded from the write
figures (computed up front) so the database path is what is compared; the query
embedding is included in recall, engram's and the vector baselines'.

    python -m bench.bench_store --skip-writes   # recall only
    python -m bench.bench_store --embedder minilm --sizes 1000,10000   # another model
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from bench import recall_set
from bench.common import (
    discard,
    fresh_database,
    median,
    percentile,
    scratch_postgres,
    sentences,
)
from engram.store import Embedder, Operation, Scope, Session, Store, WriteResult
from engram.store.limits import LARGE_SCOPE_VECTORS
from engram.store.read.recall import HNSW_SETTINGS, RecallQuery, recall, recall_context
from engram.store.server import EmbeddedPostgres
from engram.store.vectors.embedders import embed_checked
from engram.store.vectors.registry import EmbedderRegistry
from engram.store.vectors.vector_indexes import HNSW_EF_CONSTRUCTION, HNSW_M, indexed, settle_fresh

# The bounds on hybrid recall's p95 by the scope's size.
RECALL_P95_TARGETS_MS = {1_000: 3.0, 10_000: 5.0, 100_000: 10.0, 1_000_000: 20.0}
# Writes into an indexed scope against writes into a scope with no index, while recall
# runs; recall's p95 under --write-rate against its quiet p95.
WRITE_SHARE_TARGET = 0.9
UNDER_WRITES_TARGET = 1.5
# How often the bench settles fresh vectors during its write runs, as the jobs
# worker's schedule does (jobs.indexes.SETTLE_EVERY_S).
SETTLE_EVERY_S = 5.0
SETTLE_BENCH_ROWS = 1_000


class Precomputed:
    """``inner``'s vectors of ``texts``, computed once so writes measure the database path."""

    def __init__(self, texts: list[str], vectors: np.ndarray, inner: Embedder) -> None:
        self.by_text = dict(zip(texts, vectors, strict=True))
        self.inner = inner

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dims(self) -> int:
        return self.inner.dims

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.by_text]
        if missing:
            for t, v in zip(missing, self.inner.embed(missing), strict=True):
                self.by_text[t] = v
        return np.stack([self.by_text[t] for t in texts])


def bench_writes(
    dsn: str, texts: list[str], vectors: np.ndarray, batch: int, model: Embedder
) -> dict[str, float]:
    out = {}
    embedder = Precomputed(texts, vectors, model)
    dims = int(vectors.shape[1])
    with Store.connect(dsn) as store:
        ops = [Operation.build("remember", {"user_id": "writer"}, {"text": t}) for t in texts]
        t0 = time.perf_counter()
        for i in range(0, len(ops), batch):
            store.execute(ops[i : i + batch], embedder)
        out["engram versioned write"] = len(ops) / (time.perf_counter() - t0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(f"CREATE TABLE IF NOT EXISTS b_hnsw (id text, body text, v vector({dims}))")
        conn.execute("CREATE INDEX ON b_hnsw USING hnsw (v vector_cosine_ops)")
        conn.execute(f"CREATE TABLE IF NOT EXISTS b_copy (id text, body text, v vector({dims}))")
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


def _interleaved(
    systems: list[tuple[str, Callable[[str], list[str]]]], queries: list[str]
) -> dict[str, tuple[float, float]]:
    """p50 / p95 ms of each system over ``queries``, taken in turn query by query (the
    order rotating), so that a noisy moment of the machine falls on all of them."""
    for _, fn in systems:
        fn(queries[0])  # warm the pool, the model and the caches
    times: dict[str, list[float]] = {name: [] for name, _ in systems}
    for i, q in enumerate(queries):
        for name, fn in systems[i % len(systems) :] + systems[: i % len(systems)]:
            t0 = time.perf_counter()
            fn(q)
            times[name].append((time.perf_counter() - t0) * 1000)
    return {name: (percentile(t, 50), percentile(t, 95)) for name, t in times.items()}


class Baselines:
    """The plainest queries a user would write on the same rows: pgvector's exact
    search of the scope's vectors (the query embedded first, as engram does), and
    PostgreSQL full-text search of its current revisions, each on its own."""

    def __init__(self, dsn: str, scope_key: str, embedder: Embedder) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        register_vector(self.conn)
        self.embedder = embedder
        scope = self.conn.execute(
            "SELECT id FROM engram_scopes WHERE key = %s", (scope_key,)
        ).fetchone()
        # The active generation, read once: the plain query a user writes knows it.
        generation = self.conn.execute(
            "SELECT id, dims FROM engram_generations WHERE status = 'active'"
        ).fetchone()
        assert scope is not None and generation is not None
        self.scope_id = scope[0]
        self.generation, self.dims = generation

    def vector(self, text: str) -> list[str]:
        v = self.embedder.embed([text])[0]
        rows = self.conn.execute(
            "SELECT record_id FROM engram_vectors WHERE scope_id = %s"
            " ORDER BY embedding <=> %s LIMIT 5",
            (self.scope_id, v),
        ).fetchall()
        return [r[0] for r in rows]

    def vector_hnsw(self, text: str) -> list[str]:
        """The scope's own HNSW index (its predicate spelled out, as it must be), on
        the settled rows it holds: pgvector's search alone, without the fresh ones."""
        v = self.embedder.embed([text])[0]
        gen, dims = int(self.generation), int(self.dims)
        rows = self.conn.execute(
            f"SELECT record_id FROM engram_vectors WHERE generation_id = {gen}"
            f" AND scope_id = {int(self.scope_id)} AND settled"
            f" ORDER BY {indexed(gen, dims)} <=> {indexed(gen, dims, '%s::vector')} LIMIT 5",
            (v,),
        ).fetchall()
        return [r[0] for r in rows]

    def full_text(self, text: str) -> list[str]:
        rows = self.conn.execute(
            "SELECT record_id FROM engram_revisions, plainto_tsquery('simple', %s) q"
            " WHERE scope_id = %s AND current AND tsv @@ q"
            " ORDER BY ts_rank(tsv, q) DESC LIMIT 5",
            (text, self.scope_id),
        ).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        self.conn.close()


def load_scope(
    store: Store, scope: dict[str, str], filler: list[str], embedder: Precomputed
) -> dict[str, str]:
    """``filler`` with the labelled facts spread through it; record id -> fact label."""
    texts = list(filler)
    labels = list(recall_set.FACTS)
    step = max(1, len(texts) // (len(labels) + 1))
    for i, label in enumerate(labels):
        texts.insert((i + 1) * step + i, recall_set.FACTS[label])
    ops = [Operation.build("remember", scope, {"text": t}) for t in texts]
    facts = {recall_set.FACTS[label]: label for label in labels}
    by_id = {}
    for i in range(0, len(ops), 1000):
        results = store.execute(ops[i : i + 1000], embedder)
        for text, result in zip(texts[i : i + 1000], results, strict=True):
            if text in facts and isinstance(result, WriteResult):
                by_id[result.records[0].id] = facts[text]
    return by_id


def quality(ranked: Callable[[str], list[str]], labels: dict[str, str]) -> recall_set.Quality:
    return recall_set.score(
        [[labels.get(i, "") for i in ranked(q.text)] for q in recall_set.QUERIES]
    )


def _quality_cell(qual: recall_set.Quality) -> str:
    return f"{qual.hit_at_5:.2f} / {qual.mrr:.3f}"


class PacedWriter(threading.Thread):
    """Writes into the scope at ``rate`` operations per second (a batch every 50 ms,
    as a stream worker's cycles would) until stopped; the rate it kept."""

    def __init__(
        self,
        store: Store,
        scope: dict[str, str],
        texts: list[str],
        embedder: Precomputed,
        rate: float,
    ) -> None:
        super().__init__(daemon=True)
        self.store, self.scope, self.texts, self.embedder = store, scope, texts, embedder
        self.batch = max(1, round(rate * 0.05))
        self.stop = threading.Event()
        self.written = 0
        self.seconds = 0.0

    def run(self) -> None:
        t0 = time.perf_counter()
        due = t0
        while not self.stop.is_set() and self.written + self.batch <= len(self.texts):
            chunk = self.texts[self.written : self.written + self.batch]
            ops = [Operation.build("remember", self.scope, {"text": t}) for t in chunk]
            self.store.execute(ops, self.embedder)
            self.written += len(ops)
            due += 0.05
            self.stop.wait(max(0.0, due - time.perf_counter()))
        self.seconds = time.perf_counter() - t0


class Settler(threading.Thread):
    """Settles the fresh vectors every ``SETTLE_EVERY_S`` seconds, as the jobs worker's
    schedule does, until stopped; the vectors it settled."""

    def __init__(self, store: Store) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.stop = threading.Event()
        self.settled = 0

    def run(self) -> None:
        wait_s = SETTLE_EVERY_S
        while not self.stop.wait(wait_s):
            # Shorter runs than the job's, so that the bench stops when asked; one that
            # found more to do is followed at once, as the job's next slot would be.
            done = settle_fresh(self.store.pool, max_rows=SETTLE_BENCH_ROWS)
            self.settled += done
            wait_s = 0.0 if done >= SETTLE_BENCH_ROWS else SETTLE_EVERY_S


class EngramExact:
    """engram's hybrid recall through the same code, with the exact vector search even
    where the scope has an approximate index: the quality the approximate one must keep."""

    def __init__(self, store: Store, scope: dict[str, str], embedder: Embedder) -> None:
        self.store, self.key, self.embedder = store, Scope.of(scope).key, embedder

    def query(self, text: str | None, top_k: int, exact: bool) -> list[str]:
        vector = np.asarray(self.embedder.embed([text if text is not None else ""])[0])
        with self.store.pool.connection() as conn:
            q = recall_context(conn, self.key).query(text, vector, top_k)
            if exact:
                q = dataclasses.replace(q, hnsw=False)
            return [h.record.id for h in recall(conn, q)]

    def hybrid(self, text: str) -> list[str]:
        return self.query(text, 5, exact=True)

    def top50_share(self, queries: list[str]) -> float:
        """The share of the exact vector top 50 that engram's vector list finds."""
        shares = []
        for text in queries:
            vector = np.asarray(self.embedder.embed([text])[0])
            with self.store.pool.connection() as conn:
                q: RecallQuery = recall_context(conn, self.key).query(None, vector, 50)
                found = {h.record.id for h in recall(conn, q)}
                exact = {h.record.id for h in recall(conn, dataclasses.replace(q, hnsw=False))}
            shares.append(len(found & exact) / max(1, len(exact)))
        return float(np.mean(shares))


@dataclasses.dataclass
class RecallRun:
    p95_ms: float
    quality: recall_set.Quality
    exact_quality: recall_set.Quality


def bench_recall(
    store: Store,
    dsn: str,
    scope: dict[str, str],
    size: int,
    queries: list[str],
    labels: dict[str, str],
    embedder: Embedder,
    search: str,
    writer: PacedWriter | None = None,
) -> RecallRun:
    """One interleaved run; engram's p95 and quality, and exact hybrid's quality."""
    mem = store.session(scope, embedder=embedder)
    base = Baselines(dsn, Scope.of(scope).key, embedder)
    exact = EngramExact(store, scope, embedder)
    engram = f"engram hybrid ({search})" + (" under writes" if writer else "")
    settler = Settler(store) if writer else None
    try:
        systems: list[tuple[str, Callable[[str], list[str]]]] = [
            (engram, lambda q: [h.record.id for h in mem.recall(q, top_k=5)]),
            ("baseline: pgvector exact, vector only", base.vector),
            ("baseline: full text (AND), lexical only", base.full_text),
        ]
        if search != "exact":
            systems.insert(1, ("engram hybrid, exact vector search", exact.hybrid))
            systems.insert(3, ("baseline: pgvector HNSW, vector only", base.vector_hnsw))
        if writer is not None and settler is not None:
            writer.start()
            settler.start()
        timings = _interleaved(systems, queries)
        if writer is not None and settler is not None:
            writer.stop.set()
            settler.stop.set()
            writer.join()
            settler.join()
        qualities = {name: quality(fn, labels) for name, fn in systems}
        exact_quality = qualities.get("engram hybrid, exact vector search", qualities[engram])
        for name, _ in systems:
            p50, p95 = timings[name]
            qual = qualities[name]
            target = ""
            if name == engram and size in RECALL_P95_TARGETS_MS and writer is None:
                bound = RECALL_P95_TARGETS_MS[size]
                target = f"p95 <= {bound:g} ms: {_met(p95 <= bound)}"
            if name == engram and search != "exact":
                kept = qual.hit_at_5 >= exact_quality.hit_at_5 and qual.mrr >= exact_quality.mrr
                target += ("; " if target else "") + f"quality >= exact hybrid's: {_met(kept)}"
            print(
                f"| {size:,} | {name} | {p50:.1f} | {p95:.1f} | {_quality_cell(qual)} | {target} |"
            )
            if name == engram:
                kinds = ", ".join(
                    f"{kind} {h:.2f}/{m:.3f}" for kind, (h, m) in sorted(qual.by_kind.items())
                )
                print(f"|  | (by kind: {kinds}) | | | | |")
        if writer is not None and settler is not None:
            print(
                f"|  | (writes into the scope meanwhile: {writer.written:,} at "
                f"{writer.written / max(writer.seconds, 1e-9):,.0f} ops/s; "
                f"{settler.settled:,} settled by the job, {_fresh(dsn, scope):,} left fresh)"
                " | | | | |"
            )
        return RecallRun(timings[engram][1], qualities[engram], exact_quality)
    finally:
        base.close()


def _ids(mem: Session, text: str) -> list[str]:
    return [h.record.id for h in mem.recall(text)]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _fresh(dsn: str, scope: dict[str, str]) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM engram_vectors x JOIN engram_scopes s ON s.id = x.scope_id"
            " WHERE s.key = %s AND NOT x.settled",
            (Scope.of(scope).key,),
        ).fetchone()
    return int(row[0]) if row else 0


def write_share(
    store: Store,
    scope: dict[str, str],
    texts: list[str],
    embedder: Precomputed,
    recall_fn: Callable[[str], list[str]],
    queries: list[str],
    rounds: int = 3,
    seconds: float = 3.0,
    batch: int = 100,
) -> tuple[float, float, int]:
    """Writes as fast as they go, in batches of ``batch``, into ``scope`` (which has an
    index) and into a scope with none, in turn, while recall runs in ``scope`` and the
    fresh vectors are settled on schedule: the median rates (ops/s) and the texts used."""
    stop = threading.Event()

    def recalls() -> None:
        i = 0
        while not stop.is_set():
            recall_fn(queries[i % len(queries)])
            i += 1

    reader, settler = threading.Thread(target=recalls, daemon=True), Settler(store)
    reader.start()
    settler.start()
    rates: dict[str, list[float]] = {"indexed": [], "none": []}
    used = 0
    try:
        for _ in range(rounds):
            # A scope of its own per size: the next size's index job would index this one.
            none = {"user_id": f"no-index-{scope['user_id']}"}
            for which, into in (("indexed", scope), ("none", none)):
                written, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds and used + batch <= len(texts):
                    chunk = texts[used : used + batch]
                    store.execute(
                        [Operation.build("remember", into, {"text": t}) for t in chunk], embedder
                    )
                    used += batch
                    written += batch
                rates[which].append(written / (time.perf_counter() - t0))
    finally:
        stop.set()
        settler.stop.set()
        reader.join()
        settler.join()
    return median(rates["indexed"]), median(rates["none"]), used


def report_writes(
    server: EmbeddedPostgres,
    texts: list[str],
    vectors: np.ndarray,
    model: Embedder,
    embed_rate: float,
    args: argparse.Namespace,
) -> None:
    writes = bench_writes(
        fresh_database(server, "writes"),
        texts[: args.write_records],
        vectors[: args.write_records],
        args.batch,
        model,
    )
    print(f"\n## Writes ({args.write_records} records, batches of {args.batch})\n")
    print("| path | records/s | vs engram |\n|---|---:|---:|")
    base = writes["engram versioned write"]
    for name, rate in writes.items():
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x |")
    print(f"\n(the embedder alone, {args.embedder}: {embed_rate:,.0f} sentences/s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--write-records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--skip-writes", action="store_true", help="recall only")
    parser.add_argument(
        "--write-rate",
        type=float,
        default=1000.0,
        help="ops/s written into each scope during a last recall run (0: no such run)",
    )
    parser.add_argument(
        "--growth", type=int, default=150_000, help="texts available to those writes"
    )
    parser.add_argument(
        "--large-scope",
        type=int,
        default=LARGE_SCOPE_VECTORS,
        help="vectors from which a scope gets its approximate index",
    )
    parser.add_argument("--ef-search", type=int, default=None, help="hnsw.ef_search to try")
    parser.add_argument(
        "--embedder",
        choices=("wordllama", "minilm"),
        default="wordllama",
        help="the model of the scopes' vectors and of the queries (minilm: engram[minilm])",
    )
    args = parser.parse_args()
    if args.ef_search is not None:  # read by the store's connections as they open
        HNSW_SETTINGS["hnsw.ef_search"] = str(args.ef_search)
    sizes = [int(s) for s in args.sizes.split(",")]
    server = scratch_postgres()
    try:
        embedder = EmbedderRegistry().create(args.embedder)
        texts = sentences(max(max(sizes), args.write_records))
        t0 = time.perf_counter()
        vectors = embed_checked(embedder, texts)
        embed_rate = len(texts) / (time.perf_counter() - t0)

        if not args.skip_writes:
            report_writes(server, texts, vectors, embedder, embed_rate, args)

        print(f"\n## Recall in one scope ({args.queries} queries + the labelled set, top 5)\n")
        print(
            f"(approximate indexes from {args.large_scope:,} vectors: HNSW m {HNSW_M},"
            f" ef_construction {HNSW_EF_CONSTRUCTION}, {HNSW_SETTINGS})\n"
        )
        print(
            "| records in scope | search | p50 ms | p95 ms | hit@5 / MRR (labelled set) | target |"
            "\n|---:|---|---:|---:|---:|---|"
        )
        queries = sentences(args.queries, seed=99, words=5)
        queries += [q.text for q in recall_set.QUERIES]
        dsn = fresh_database(server, "recall")
        # What the scopes grow by while recall is measured under writes.
        growth = sentences(args.growth, seed=3) if args.write_rate else []
        grown = Precomputed(growth, embed_checked(embedder, growth), embedder) if growth else None
        verdicts: list[str] = []
        with Store.connect(dsn) as store:
            pre = Precomputed(texts, vectors, embedder)
            for size in sizes:
                scope = {"user_id": f"scope-{size}"}
                filler = texts[: size - len(recall_set.FACTS)]
                labels = load_scope(store, scope, filler, pre)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE")
                search = "exact"
                t0 = time.perf_counter()
                if store.embeddings.index_large_scopes(args.large_scope):
                    search = "HNSW"
                    print(
                        f"|  | (the scope's index built in {time.perf_counter() - t0:.1f} s)"
                        " | | | | |"
                    )
                quiet = bench_recall(store, dsn, scope, size, queries, labels, embedder, search)
                if size in RECALL_P95_TARGETS_MS:
                    bound = RECALL_P95_TARGETS_MS[size]
                    verdicts.append(
                        f"recall p95 at {size:,}: {quiet.p95_ms:.1f} ms (bound {bound:g}):"
                        f" {_met(quiet.p95_ms <= bound)}"
                    )
                kept = (
                    quiet.quality.hit_at_5 >= quiet.exact_quality.hit_at_5
                    and quiet.quality.mrr >= quiet.exact_quality.mrr
                )
                exact = EngramExact(store, scope, embedder)
                share = exact.top50_share(queries) if search != "exact" else 1.0
                verdicts.append(
                    f"quality at {size:,} ({search}): {_quality_cell(quiet.quality)} against exact"
                    f" hybrid's {_quality_cell(quiet.exact_quality)}: {_met(kept)};"
                    f" exact vector top 50 found: {share:.1%}"
                )
                if search != "exact" and grown is not None:
                    mem = store.session(scope, embedder=embedder)
                    indexed, none, used = write_share(
                        store, scope, growth, grown, partial(_ids, mem), queries
                    )
                    growth = growth[used:]
                    verdicts.append(
                        f"writes into the indexed {size:,} scope while recall runs: {indexed:,.0f}"
                        f" ops/s against {none:,.0f} into a scope with no index"
                        f" ({indexed / none:.2f}x, target >= {WRITE_SHARE_TARGET:g}x):"
                        f" {_met(indexed >= WRITE_SHARE_TARGET * none)}"
                    )
                if args.write_rate and grown is not None:
                    writer = PacedWriter(store, scope, growth, grown, args.write_rate)
                    busy = bench_recall(
                        store, dsn, scope, size, queries, labels, embedder, search, writer
                    )
                    growth = growth[writer.written :]
                    ratio = busy.p95_ms / quiet.p95_ms
                    verdicts.append(
                        f"recall p95 at {size:,} under {args.write_rate:,.0f} ops/s of writes:"
                        f" {busy.p95_ms:.1f} ms, {ratio:.2f}x the quiet"
                        f" {quiet.p95_ms:.1f} (target <= {UNDER_WRITES_TARGET:g}x):"
                        f" {_met(ratio <= UNDER_WRITES_TARGET)}"
                    )
        print("\n## Targets\n")
        for verdict in verdicts:
            print(f"- {verdict}")
    finally:
        discard(server)


if __name__ == "__main__":
    main()
