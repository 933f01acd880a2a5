"""Backups and restores of the embedded PostgreSQL, and what WAL archiving costs writes.

    python -m bench.bench_backup [--records 100000] [--forgets 1000]

1. Loads ``--records`` records (synthetic sentences, 256-dimension hashing vectors,
   committed in batches of 1,000) into a home whose server archives its WAL.
2. ``engram backup``'s base backup of it: its size and time.
3. Forgets ``--forgets`` of the records (each a forget of its own, into the ledger),
   then ``engram restore`` from the backup: its time, and the ledger replay's rate
   (forgets applied per second, the VACUUM and the text index's rebuild included).
4. The write benchmark with archiving on and off, side by side: two homes, one of
   each, written in turn (``--rounds`` rounds of ``--write-records`` remembers in
   batches of ``--batch``), operations per second per round.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from engram.restore import run_restore
from engram.store import HashingEmbedder, Operation, Store
from engram.store import backup as backups
from engram.store.ledger import ForgetLedger
from engram.store.server import EmbeddedPostgres
from engram.worker.settings import Settings

from .common import sentences

SCOPE = {"user_id": "bench-backup"}
DIMS = 256


def remembers(texts: list[str]) -> list[Operation]:
    return [Operation.build("remember", SCOPE, {"text": t}) for t in texts]


def load(store: Store, n: int, batch: int = 1_000, seed: int = 1) -> list[str]:
    texts = sentences(n, seed=seed)
    embedder = HashingEmbedder(DIMS)
    ids: list[str] = []
    for start in range(0, n, batch):
        ops = [
            Operation.build("remember", SCOPE, {"text": t}) for t in texts[start : start + batch]
        ]
        for result in store.execute(ops, embedder):
            ids.append(result.records[0].id)  # type: ignore[union-attr]
    return ids


def write_rate(store: Store, n: int, batch: int, seed: int) -> float:
    texts = sentences(n, seed=seed)
    embedder = HashingEmbedder(DIMS)
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        ops = [
            Operation.build("remember", SCOPE, {"text": t}) for t in texts[start : start + batch]
        ]
        store.execute(ops, embedder)
    return n / (time.perf_counter() - t0)


def bench_backup_restore(top: Path, records: int, forgets: int) -> None:
    home, bk = top / "h", top / "bk"
    home.mkdir()
    server = EmbeddedPostgres(home, backup_dir=bk)
    with Store.connect(server.dsn(), ledger=ForgetLedger(home / "ledger")) as store:
        t0 = time.perf_counter()
        ids = load(store, records)
        print(f"loaded {records} records in {time.perf_counter() - t0:.1f} s")
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
        info = backups.base_backup(server.dsn(), bk)
        print(f"base backup: {info.size_bytes / 1e6:.0f} MB in {info.seconds:.1f} s")
        mem = store.session(SCOPE, embedder=HashingEmbedder(DIMS))
        for rid in ids[:forgets]:
            mem.forget(rid)
    server.stop()
    settings = Settings.from_env({"ENGRAM_HOME": str(home), "ENGRAM_BACKUP_DIR": str(bk)})
    report = run_restore(settings, bk, None)
    print(
        f"restore: {report.seconds:.1f} s in all; replay of {report.replayed} forgets"
        f" {report.replay_seconds:.2f} s ({report.replayed / report.replay_seconds:.0f}/s)"
    )


def bench_archiving(top: Path, rounds: int, n: int, batch: int) -> None:
    on = EmbeddedPostgres(top / "on", backup_dir=top / "on-bk")
    off = EmbeddedPostgres(top / "off")
    rates: dict[str, list[float]] = {"on": [], "off": []}
    try:
        with Store.connect(on.dsn()) as s_on, Store.connect(off.dsn()) as s_off:
            for r in range(rounds):
                pairs = (
                    [("on", s_on), ("off", s_off)] if r % 2 == 0 else [("off", s_off), ("on", s_on)]
                )
                for name, store in pairs:
                    rates[name].append(write_rate(store, n, batch, seed=100 + r))
        for name in ("off", "on"):
            print(
                f"archiving {name}: {statistics.median(rates[name]):.0f} remembers/s"
                f" (rounds: {', '.join(f'{x:.0f}' for x in rates[name])})"
            )
    finally:
        on.stop()
        off.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--forgets", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--write-records", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--skip-backup", action="store_true")
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="eb-bench-"))
    try:
        if not args.skip_backup:
            bench_backup_restore(top, args.records, args.forgets)
        bench_archiving(top, args.rounds, args.write_records, args.batch)
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
