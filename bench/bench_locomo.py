"""LoCoMo evidence recall through the public door, against BM25, PostgreSQL full text
and dense exact search over the same turns, in one run.

    python -m bench.bench_locomo --data ../shared/data/locomo/locomo-dev.json \
        [--json OUT] [--svg OUT] [--embedders wordllama,minilm] [--limit-questions N]

For each embedder (default: the built-in default, then every other registered name
but ``hashing``, so a model added to ``store/vectors/registry.py`` or named in
``ENGRAM_EMBEDDERS`` shows up without edits): a database of its own on one scratch
PostgreSQL, a valkey, ``engram worker`` and ``engram web`` (subprocesses, as a user
runs them) with ``ENGRAM_EMBEDDER`` set to it. Each conversation is one scope; each
session one ``extract(messages, infer=False)`` through the ``Producer`` (``bench.locomo``
says what a message holds), all in flight at once and timed to the last receipt.
Each question is then asked through ``POST /api/v1/recall`` (``top_k`` 10) with a
token scoped to its conversation: the door an agent uses, HTTP and the token's
check and read log included. A hit counts for the turns its record cites.

Beside it, over the same turn texts: BM25 (``bm25s``, English stop words; the
``bench`` extra), PostgreSQL full text alone (the ``english`` configuration, the
question's words OR-ed, ``ts_rank_cd``, a GIN index), and dense exact search alone
with each embedder (the turn texts embedded here, pgvector's exact cosine search).
The systems take the questions in turn, question by question, so a noisy moment
of the machine falls on all of them. Their latency is what each takes for one
question, from the caller's side (the baselines in this process, engram over HTTP).

Scores: evidence recall@5 and @10 (the share of a question's evidence turns its top
k cite, averaged over questions) and MRR (1 / rank of the first hit citing an
evidence turn, 0 past 10), over categories 1-4, each category apart, and category 5
(adversarial) apart. Questions with no evidence (2 upstream) are left out; evidence
ids that name no turn (a typo upstream) count as unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from bench import locomo
from bench.common import discard, fresh_database, percentile, scratch_postgres
from bench.locomo import ANSWERABLE, CATEGORIES, Ask, Conversation, Ranked, Scores
from engram.store import Embedder, Store
from engram.store.vectors.embedders import embed_checked
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey

REPO = Path(__file__).resolve().parent.parent
RECEIPT_TIMEOUT_S = 1800.0
TEST_ONLY_EMBEDDERS = ("hashing",)


def default_embedders() -> list[str]:
    """The built-in default, then every other registered name a user could pick."""
    default = locomo.default_embedder()
    others = [n for n in locomo.registry().names() if n != default and n not in TEST_ONLY_EMBEDDERS]
    return [default, *others]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Served:
    """One embedder's engram: its database, valkey, worker and web server."""

    spec: str
    dsn: str
    valkey: EmbeddedValkey
    processes: list[subprocess.Popen[bytes]]
    url: str

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        self.valkey.stop()


def serve(spec: str, dsn: str, home: Path) -> Served:
    home.mkdir(parents=True, exist_ok=True)
    Store.connect(dsn).close()  # migrated before the processes open it
    valkey = EmbeddedValkey(home / "valkey").start()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DATABASE_URL": dsn,
        "REDIS_URL": valkey.url,
        "ENGRAM_HOME": str(home),
        "ENGRAM_EMBEDDER": spec,
    }
    log = open(home / "processes.log", "wb")  # noqa: SIM115
    base = [sys.executable, "-m", "engram"]
    port = free_port()
    processes = [
        subprocess.Popen([*base, "worker"], env=env, stdout=log, stderr=log),
        subprocess.Popen([*base, "web", "--port", str(port)], env=env, stdout=log, stderr=log),
    ]
    served = Served(spec, dsn, valkey, processes, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(served.url + "/healthz", timeout=1).status_code == 200:
                return served
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            served.stop()
            raise SystemExit(f"engram web ({spec}) did not start: see {home}/processes.log")
        time.sleep(0.2)


class Bm25:
    """BM25 (Lucene's variant, k1 1.5, b 0.75) over each conversation's turn texts."""

    def __init__(self, conversations: Sequence[Conversation]) -> None:
        import bm25s

        self.bm25s = bm25s
        self.indexes: dict[str, tuple[Any, list[str]]] = {}
        for c in conversations:
            turns = c.turns()
            index = bm25s.BM25()
            index.index(self._tokens([t.text for t in turns]), show_progress=False)
            self.indexes[c.sample_id] = (index, [t.dia_id for t in turns])

    def _tokens(self, texts: list[str]) -> Any:
        return self.bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def ask(self, conversation: Conversation, question: str) -> Ranked:
        index, ids = self.indexes[conversation.sample_id]
        k = min(locomo.TOP_K, len(ids))
        found, scores = index.retrieve(self._tokens([question]), k=k, show_progress=False)
        return [[ids[i]] for i, s in zip(found[0], scores[0], strict=True) if s > 0]


class Turns:
    """The turn texts in a table of their own, beside engram's (in the first embedder's
    database): what a user would search with PostgreSQL alone."""

    def __init__(self, dsn: str, conversations: Sequence[Conversation]) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(
            "CREATE TABLE locomo_turns (conversation text, dia_id text, body text,"
            " tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', body)) STORED)"
        )
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO locomo_turns VALUES (%s, %s, %s)",
                [(c.sample_id, t.dia_id, t.text) for c in conversations for t in c.turns()],
            )
        self.conn.execute("CREATE INDEX ON locomo_turns USING gin (tsv)")
        self.conn.execute("ANALYZE locomo_turns")

    def full_text(self, conversation: Conversation, question: str) -> Ranked:
        rows = self.conn.execute(
            "SELECT dia_id FROM locomo_turns, (SELECT"
            " replace(plainto_tsquery('english', %s)::text, ' & ', ' | ')::tsquery AS q) words"
            " WHERE conversation = %s AND tsv @@ q ORDER BY ts_rank_cd(tsv, q) DESC, dia_id"
            " LIMIT %s",
            (question, conversation.sample_id, locomo.TOP_K),
        ).fetchall()
        return [[r[0]] for r in rows]


class Dense:
    """Dense exact search alone: the turn texts embedded here, pgvector's exact cosine
    search in the conversation (no index), the question embedded per query."""

    def __init__(self, dsn: str, spec: str, conversations: Sequence[Conversation]) -> None:
        self.embedder: Embedder = locomo.registry().load(spec)
        self.conn = psycopg.connect(dsn, autocommit=True)
        register_vector(self.conn)
        dims = self.embedder.dims
        self.conn.execute(
            f"CREATE TABLE locomo_dense (conversation text, dia_id text, v vector({dims}))"
        )
        rows = [(c.sample_id, t) for c in conversations for t in c.turns()]
        started = time.perf_counter()
        vectors: list[np.ndarray] = []
        for i in range(0, len(rows), 256):
            vectors.extend(embed_checked(self.embedder, [t.text for _, t in rows[i : i + 256]]))
        self.embed_s = time.perf_counter() - started
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO locomo_dense VALUES (%s, %s, %s)",
                [(sid, t.dia_id, v) for (sid, t), v in zip(rows, vectors, strict=True)],
            )

    def ask(self, conversation: Conversation, question: str) -> Ranked:
        v = embed_checked(self.embedder, [question])[0]
        rows = self.conn.execute(
            "SELECT dia_id FROM locomo_dense WHERE conversation = %s ORDER BY v <=> %s LIMIT %s",
            (conversation.sample_id, v, locomo.TOP_K),
        ).fetchall()
        return [[r[0]] for r in rows]


def interleaved(
    conversations: Sequence[Conversation], systems: Mapping[str, Ask], limit: int | None
) -> dict[str, Scores]:
    """Every system on every question, in turn question by question (the order rotating)."""
    names = list(systems)
    first = conversations[0]
    for ask in systems.values():
        ask(first, locomo.scored(first.questions)[0].text)  # warm pools, models, caches
    scores = {name: Scores() for name in names}
    i = 0
    for c in conversations:
        for q in locomo.scored(c.questions)[:limit]:
            for name in names[i % len(names) :] + names[: i % len(names)]:
                started = time.perf_counter()
                ranked = systems[name](c, q.text)
                scores[name].add(q, ranked, (time.perf_counter() - started) * 1000)
            i += 1
    return scores


def results(scores: Mapping[str, Scores], ingests: Mapping[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, s in scores.items():
        out[name] = {
            "answerable": s.summary(ANSWERABLE),
            "by_category": {CATEGORIES[c]: s.summary([c]) for c in CATEGORIES},
            "latency_ms": {
                "p50": percentile(s.latencies_ms, 50),
                "p95": percentile(s.latencies_ms, 95),
            },
        }
        if name in ingests:
            out[name]["ingest_turns_per_s"] = ingests[name]
    return out


def markdown(found: Mapping[str, Any]) -> str:
    cats = [CATEGORIES[c] for c in ANSWERABLE]
    lines = [
        "| system | R@5 | R@10 | MRR | "
        + " | ".join(f"{c} R@10" for c in cats)
        + " | adversarial R@10 | p50 / p95 ms | ingest turns/s |",
        "|---|---:|---:|---:|" + "---:|" * len(cats) + "---:|---:|---:|",
    ]
    for name, r in found.items():
        a = r["answerable"]
        by = r["by_category"]
        ingest = r.get("ingest_turns_per_s")
        lines.append(
            f"| {name} | {a['recall@5']:.3f} | **{a['recall@10']:.3f}** | {a['mrr']:.3f} | "
            + " | ".join(_figure(by[c], "recall@10") for c in cats)
            + f" | {_figure(by['adversarial'], 'recall@10')}"
            + f" | {r['latency_ms']['p50']:.1f} / {r['latency_ms']['p95']:.1f}"
            + f" | {f'{ingest:,.0f}' if ingest else ''} |"
        )
    return "\n".join(lines)


def chart(found: Mapping[str, Any], title: str) -> str:
    """Evidence recall@10 over categories 1-4, a bar per system (an SVG for the docs);
    engram in process scores as through the API, so it is left out."""
    names = [n for n in found if _group(n) != 1]
    bar_h, gap, left, width = 22, 8, 250, 420
    top = 44
    height = top + len(names) * (bar_h + gap) + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 70}" height="{height}"'
        ' font-family="sans-serif" font-size="13">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="22" font-size="15" font-weight="bold">{_esc(title)}</text>',
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        x = left + tick * width
        out.append(
            f'<line x1="{x:.0f}" y1="{top - 6}" x2="{x:.0f}" y2="{height - 24}"'
            ' stroke="#ddd"/>'
            f'<text x="{x:.0f}" y="{height - 8}" text-anchor="middle" fill="#555">{tick:.2f}</text>'
        )
    for i, name in enumerate(names):
        value = found[name]["answerable"]["recall@10"]
        y = top + i * (bar_h + gap)
        colour = "#2b6cb0" if name.startswith("engram") else "#a0aec0"
        out.append(
            f'<text x="{left - 8}" y="{y + 16}" text-anchor="end">{_esc(name)}</text>'
            f'<rect x="{left}" y="{y}" width="{value * width:.1f}" height="{bar_h}"'
            f' fill="{colour}"/>'
            f'<text x="{left + value * width + 6:.1f}" y="{y + 16}">{value:.3f}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _group(name: str) -> int:
    """engram through the API first, then in process, then the baselines."""
    return 0 if name.startswith("engram hybrid") else 1 if name.startswith("engram") else 2


def _figure(summary: Mapping[str, float], key: str) -> str:
    return f"{summary[key]:.3f}" if summary["questions"] else "-"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@contextlib.contextmanager
def engrams(specs: Sequence[str], server: Any, home: Path) -> Iterator[list[Served]]:
    served: list[Served] = []
    try:
        for i, spec in enumerate(specs):
            dsn = fresh_database(server, f"locomo_{i}")
            served.append(serve(spec, dsn, home / f"engram-{i}"))
        yield served
    finally:
        for s in served:
            s.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="upstream LoCoMo JSON")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--svg", type=Path, help="write the chart here")
    parser.add_argument(
        "--embedders",
        default=",".join(default_embedders()),
        help="comma-separated registered embedders (default: %(default)s)",
    )
    parser.add_argument(
        "--limit-questions", type=int, help="only the first N questions of each conversation"
    )
    args = parser.parse_args()
    specs = [s.strip() for s in args.embedders.split(",") if s.strip()]
    conversations = locomo.load(args.data)
    turns = sum(len(c.turns()) for c in conversations)
    print(f"{len(conversations)} conversations, {turns} turns; embedders: {', '.join(specs)}")

    home = Path(tempfile.mkdtemp(prefix="engram-bench-locomo-"))
    server = scratch_postgres()
    clients: list[httpx.Client] = []
    stores: list[Store] = []
    try:
        with engrams(specs, server, home) as served:
            systems: dict[str, Ask] = {}
            ingests: dict[str, float] = {}
            for s in served:
                producer = Producer(connect_redis(s.valkey.url))
                done = locomo.ingest(producer, conversations, RECEIPT_TIMEOUT_S)
                producer.close()
                locomo.steady(s.dsn)
                name = f"engram hybrid ({s.spec})"
                ingests[name] = done.turns_per_s
                print(f"{name}: {done.turns} turns in {done.seconds:.1f} s")
                with Store.connect(s.dsn) as admin:
                    tokens = {
                        c.sample_id: admin.tokens.create(
                            f"locomo-{c.sample_id}", c.scope, ["recall"], by="bench"
                        )[0]
                        for c in conversations
                    }
                client = httpx.Client(base_url=s.url, timeout=60)
                clients.append(client)
                systems[name] = locomo.api_recall(client, tokens)
                store = Store.connect(s.dsn, embedders=locomo.registry())
                stores.append(store)
                systems[f"engram Store.recall ({s.spec}), in process"] = locomo.store_recall(store)
            systems["BM25 (bm25s)"] = Bm25(conversations).ask
            systems["PostgreSQL full text"] = Turns(served[0].dsn, conversations).full_text
            for s in served:
                dense = Dense(s.dsn, s.spec, conversations)
                systems[f"dense exact ({s.spec})"] = dense.ask
                print(f"dense exact ({s.spec}): {turns} turns embedded in {dense.embed_s:.1f} s")
            scores = interleaved(conversations, systems, args.limit_questions)
    finally:
        for client in clients:
            client.close()
        for store in stores:
            store.close()
        discard(server)
    order = sorted(scores, key=lambda n: (_group(n), n))
    found = results({n: scores[n] for n in order}, ingests)
    answerable = next(iter(found.values()))["answerable"]["questions"]
    print(f"\n{answerable:.0f} questions of categories 1-4, top_k {locomo.TOP_K}")
    print(markdown(found))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")
    if args.svg:
        title = f"LoCoMo, {answerable:.0f} questions: evidence recall@10, categories 1-4"
        args.svg.write_text(chart(found, title))


if __name__ == "__main__":
    main()
