"""How long a reembed's switch holds writes off, by store size, against the one scan
any whole-store check must make, in the same run.

    python -m bench.bench_switch      # --sizes 20000 100000 --switches 3 --gaps 64

A scratch PostgreSQL; for each size, that many records over 100 scopes (the hashing
embedder: the database is measured, not a model), ``VACUUM ANALYZE`` as autovacuum
would after the load; then ``--switches`` times: a pending generation of a new model
filled in batches of 1,000, ``--gaps`` records revised meanwhile (each a gap the switch
fills with writes held), and ``Embeddings.switch``. Per size, medians of:

- engram: the time writes were held (listing the gaps, embedding and storing them,
  checking that none is left, activating), and the switch call in all (with the
  ANALYZE before the hold and the deletion of the old generation's vectors after);
- baseline: one anti join of every current revision against the new generation's
  vectors, sent straight to PostgreSQL (hashed), timed after the switch;
- before: the check that no gap is left, planned as it was before, from the
  statistics taken before the pass (nested loops allowed), timed when no gap is
  left (as the switch runs it); quadratic, so only up to ``--before-max`` records
  (at 100,000 it held writes for 495 s, measured once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import psycopg

from bench.common import discard, fresh_database, scratch_postgres, sentences
from engram.store import HashingEmbedder, Operation, Store, WriteOptions
from engram.store.vectors.embeddings import _MISSING

OLD = HashingEmbedder(64)
MODELS = [HashingEmbedder(d) for d in (32, 48, 16, 24, 40)]
SCOPES = 100

# Loading: every operation is new, so no replay look-up before embedding.
FIRST_TIME = WriteOptions(check_replays=False)


def load(store: Store, n: int) -> list[str]:
    texts = sentences(n)
    ids: list[str] = []
    for i in range(0, n, 1000):
        ops = [
            Operation.build("remember", {"user_id": f"u{j % SCOPES}"}, {"text": texts[j]})
            for j in range(i, min(i + 1000, n))
        ]
        ids += [r.records[0].id for r in store.execute(ops, OLD, options=FIRST_TIME)]  # type: ignore[union-attr]
    with store.pool.connection() as conn:
        conn.execute("VACUUM ANALYZE")
    return ids


def fill(store: Store, model: HashingEmbedder) -> int:
    """A pending generation of ``model``, filled in batches of 1,000; its id."""
    generation = store.embeddings.begin(model.model_id, model.dims)
    store.embeddings.fill(generation.id, model, 1000)
    return generation.id


def revise(store: Store, ids: list[str], embedder: Any, tag: str) -> None:
    """Revise these records (new texts: gaps in the pending generation)."""
    # A revise names its record's scope: read them, as a producer would know them.
    with store.pool.connection() as conn:
        scopes = dict(
            conn.execute(
                "SELECT r.id, s.key FROM engram_records r JOIN engram_scopes s"
                " ON s.id = r.scope_id WHERE r.id = ANY(%s)",
                (ids,),
            ).fetchall()
        )
    ops = [
        Operation.build("revise", json.loads(scopes[rid]), {"id": rid, "text": f"r {tag} {n}"})
        for n, rid in enumerate(ids)
    ]
    store.execute(ops, embedder)


def scan(dsn: str, generation_id: int, *, nested_loops: bool) -> float:
    """Seconds of one whole-store gap check sent straight to PostgreSQL."""
    with psycopg.connect(dsn) as conn:
        if not nested_loops:
            conn.execute("SET enable_nestloop = off")
        began = time.perf_counter()
        conn.execute(f"SELECT EXISTS (SELECT 1 {_MISSING})", {"g": generation_id}).fetchone()
        return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--switches", type=int, default=3, help="switches per size (median)")
    parser.add_argument("--gaps", type=int, default=64, help="records revised during a fill")
    parser.add_argument("--before-max", type=int, default=20_000)
    args = parser.parse_args()
    if args.switches > len(MODELS):
        parser.error(f"--switches: at most {len(MODELS)}")

    server = scratch_postgres()
    rows = []
    try:
        for size in args.sizes:
            dsn = fresh_database(server, f"switch_{size}")
            with Store.connect(dsn) as store:
                ids = load(store, size)
                held, total, direct, before = [], [], [], []
                active: Any = OLD
                for n, model in enumerate(MODELS[: args.switches]):
                    generation_id = fill(store, model)
                    if size <= args.before_max:  # no gap left, as when the switch checks
                        before.append(scan(dsn, generation_id, nested_loops=True))
                    revise(store, ids[n * args.gaps : (n + 1) * args.gaps], active, str(n))
                    began = time.perf_counter()
                    switched = store.embeddings.switch(generation_id, model)
                    total.append(time.perf_counter() - began)
                    assert switched.activated and switched.embedded == args.gaps, switched
                    held.append(switched.held_s)
                    direct.append(scan(dsn, generation_id, nested_loops=False))
                    active = model
            rows.append((size, held, total, direct, before))
            print(f"  {size:,} records done", flush=True)
    finally:
        discard(server)
    _report(rows, args)


def _report(rows: list[Any], args: argparse.Namespace) -> None:
    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:,.0f}" if values else "not run"

    def each(values: list[float]) -> str:
        return " / ".join(f"{v * 1000:,.0f}" for v in values) if values else "not run"

    print(
        f"\n## Writes held by a switch ({os.cpu_count()} CPUs; {SCOPES} scopes; {args.gaps}"
        f" gaps to fill; median of {args.switches} switches)\n"
    )
    print(
        "| records | engram: writes held, ms | one gap check sent direct, ms | ratio"
        " | switch call in all, ms | before: the check planned from stale statistics, ms"
        " (each switch) |"
        "\n|---:|---:|---:|---:|---:|---:|"
    )
    for size, held, total, direct, before in rows:
        ratio = statistics.median(held) / statistics.median(direct)
        figures = [f"{size:,}", ms(held), ms(direct), f"{ratio:.1f}x", ms(total), each(before)]
        print("| " + " | ".join(figures) + " |")


if __name__ == "__main__":
    main()
