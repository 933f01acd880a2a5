"""Where a forgotten text is still found in PostgreSQL's files, after the PostgreSQL
forget listener (VACUUM) and after later writes.

    python -m bench.redaction_residue          # --records 20000 --after 20000

A scratch embedded PostgreSQL; a store of ``--records`` records plus one that holds
a unique marker (revised twice; one revision long enough to be TOASTed). Its rows
are forgotten, the PostgreSQL listener's VACUUM runs, and the data directory's
bytes are searched for the marker (as written, and lower-cased as the full-text
index keeps it) at each step, after a CHECKPOINT so that every page is on disk.
Each file found is named by the relation it belongs to (heap, index, TOAST) or
as write-ahead log. Rows are checked too: the marker must be in none.
"""

from __future__ import annotations

import argparse
import random
import string
from collections import defaultdict
from pathlib import Path

import psycopg

from bench.common import discard, fresh_database, scratch_postgres, sentences
from engram.store import HashingEmbedder, Operation, Store
from engram.store.write import forgets
from tests.helpers import rows_containing

SCOPE = {"user_id": "residue"}


def marker() -> str:
    rng = random.Random()
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(24))


def where(data_dir: Path, dsn: str, needle: str) -> dict[str, list[str]]:
    """Files under the data directory holding ``needle`` (or its lower case), by kind."""
    with psycopg.connect(dsn) as conn:
        names = {
            path: f"{kind}:{name}"
            for name, kind, path in conn.execute(
                "SELECT c.relname, CASE c.relkind WHEN 'i' THEN 'index' WHEN 't' THEN 'toast'"
                " ELSE 'table' END, pg_relation_filepath(c.oid) FROM pg_class c"
                " WHERE pg_relation_filepath(c.oid) IS NOT NULL"
            ).fetchall()
        }
    found: dict[str, list[str]] = defaultdict(list)
    variants = [needle.encode(), needle.lower().encode()]
    for path in sorted(data_dir.rglob("*")):
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        hits = [v.decode() for v in variants if v in data]
        if not hits:
            continue
        rel = str(path.relative_to(data_dir))
        base = rel.split(".")[0].removesuffix("_fsm").removesuffix("_vm")
        label = names.get(base) or ("wal" if rel.startswith("pg_wal") else "other")
        found[label.split(":")[0]].append(f"{label.split(':')[-1]} ({'/'.join(hits)})")
    return found


def checkpoint(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def report(step: str, found: dict[str, list[str]]) -> None:
    print(f"\n{step}:")
    if not found:
        print("  nowhere")
    for kind in ("table", "index", "toast", "wal", "other"):
        if found.get(kind):
            print(f"  {kind:<6} {', '.join(sorted(set(found[kind])))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--after", type=int, default=20_000, help="records written afterwards")
    args = parser.parse_args()

    server = scratch_postgres()
    try:
        dsn = fresh_database(server, "residue")
        data_dir = Path(server.data_dir)
        secret = marker()
        embedder = HashingEmbedder(64)
        with Store.connect(dsn) as store:
            filler = sentences(args.records)
            for start in range(0, len(filler), 1000):
                ops = [
                    Operation.build("remember", {"user_id": f"u{i % 50}"}, {"text": t})
                    for i, t in enumerate(filler[start : start + 1000], start)
                ]
                store.execute(ops, embedder)
            mem = store.session(SCOPE, embedder=embedder, on_forget=[lambda event: None])
            fact = mem.remember(f"The door code is {secret}.").records[0]
            long_text = " ".join(sentences(400, seed=7)) + f" {secret}"  # TOASTed
            mem.revise(fact.id, text=long_text, expected_revision=1)
            mem.revise(fact.id, text=f"{secret} opens the door.", expected_revision=2)
            checkpoint(dsn)
            report("before the forget", where(data_dir, dsn, secret))

            mem.forget(fact.id)
            with psycopg.connect(dsn) as conn:
                rows = rows_containing(conn, secret)
            checkpoint(dsn)
            report(
                f"after the forget (rows holding it: {rows or 'none'})",
                where(data_dir, dsn, secret),
            )

            forgets.vacuum(store.pool)
            checkpoint(dsn)
            report("after VACUUM", where(data_dir, dsn, secret))
            forgets.reindex_text(store.pool)
            checkpoint(dsn)
            report("after VACUUM and the full-text index rebuilt", where(data_dir, dsn, secret))

            more = sentences(args.after, seed=3)
            for start in range(0, len(more), 1000):
                ops = [
                    Operation.build("remember", {"user_id": f"v{i % 50}"}, {"text": t})
                    for i, t in enumerate(more[start : start + 1000], start)
                ]
                store.execute(ops, embedder)
            checkpoint(dsn)
            checkpoint(dsn)
            report(
                f"after {args.after} more records and two checkpoints", where(data_dir, dsn, secret)
            )
    finally:
        discard(server)


if __name__ == "__main__":
    main()
