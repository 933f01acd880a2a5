"""Read-replica benchmark: what ``DATABASE_READ_URL`` costs the write path, the lag a
reader without a position sees, and where reads with one are served.

    python -m bench.bench_replica [--commits 2000] [--batch 1,100] [--rounds 5]

On a scratch embedded PostgreSQL and a streaming replica of it (made as the tests
make theirs: tests/replica_fixtures.py), in the same run:

- the write path, ``Store.execute`` of remembers with precomputed vectors, by a store
  without a read pool and by one with it (which reads the commit position after each
  COMMIT, pipelined with it), in alternating rounds so both see the same server;
- the replica's lag: after each commit, how long until ``pg_last_wal_replay_lsn()``
  reaches the receipt's position;
- reads right after a write with the receipt's position: how many the replica served
  and how many went to the primary (the replica had not replayed that far yet), and
  ``get``'s latency each way.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import psycopg

from bench.common import discard, fresh_database, percentile, scratch_postgres
from engram.store import HashingEmbedder, Operation, Store, WriteResult
from engram.store.read.routing import parse_position
from tests.replica_fixtures import Replica


def bench_write_path(
    dsn: str, read_dsn: str, commits: int, batch: int, rounds: int
) -> dict[str, list[float]]:
    """Per-commit latencies (ms), without and with the read pool, round after round."""
    embedder = HashingEmbedder(dims=384)
    latencies: dict[str, list[float]] = {"without": [], "with": []}
    with Store.connect(dsn) as single, Store.connect(dsn, read_dsn=read_dsn) as replicated:
        stores = [("without", single), ("with", replicated)]
        for r in range(rounds):
            # Each goes first in every other round: neither always meets the larger tables.
            for name, store in stores if r % 2 == 0 else stores[::-1]:
                per_round = commits // rounds
                for i in range(per_round):
                    ops = [
                        Operation.build(
                            "remember", {"user_id": f"w{batch}"}, {"text": f"{name} {r} {i} {j}"}
                        )
                        for j in range(batch)
                    ]
                    t0 = time.perf_counter()
                    store.execute(ops, embedder)
                    latencies[name].append((time.perf_counter() - t0) * 1000)
    return latencies


def bench_lag(dsn: str, replica: Replica, writes: int) -> list[float]:
    """Seconds from a commit's answer to the replica replaying its position."""
    embedder = HashingEmbedder(dims=384)
    lags = []
    with (
        Store.connect(dsn, read_dsn=replica.dsn_like(dsn)) as store,
        psycopg.connect(replica.dsn_like(dsn), autocommit=True) as standby,
    ):
        for i in range(writes):
            [result] = store.execute(
                [Operation.build("remember", {"user_id": "lag"}, {"text": f"lag {i}"})], embedder
            )
            assert isinstance(result, WriteResult) and result.receipt.position
            t0 = time.perf_counter()
            while True:
                row = standby.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()
                if row and parse_position(row[0]) >= parse_position(result.receipt.position):  # type: ignore[operator]
                    break
            lags.append(time.perf_counter() - t0)
    return lags


def bench_reads_after_writes(dsn: str, replica: Replica, writes: int) -> dict[str, float]:
    embedder = HashingEmbedder(dims=384)
    with Store.connect(dsn, read_dsn=replica.dsn_like(dsn)) as store:
        mem = store.session({"user_id": "ryw"}, embedder=embedder)
        served_before = dict(store.reads.served)
        at_once, plain = [], []
        for i in range(writes):
            written = mem.remember(f"read after write {i}")
            t0 = time.perf_counter()
            assert mem.get(written.records[0].id, after=written.receipt.position) is not None
            at_once.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            mem.get(written.records[0].id)
            plain.append((time.perf_counter() - t0) * 1000)
        served = {k: v - served_before.get(k, 0) for k, v in store.reads.served.items()}
    with Store.connect(dsn) as single:
        record = single.records({"user_id": "ryw"}, limit=1)[0]
        primary = []
        for _ in range(writes):
            t0 = time.perf_counter()
            single.get({"user_id": "ryw"}, record.id)
            primary.append((time.perf_counter() - t0) * 1000)
    return {
        "served by the replica": served.get("replica", 0) - writes,  # (less the plain reads)
        "sent to the primary (replica behind)": served.get("behind", 0),
        "get with after, p50 ms": percentile(at_once, 50),
        "get without after (replica), p50 ms": percentile(plain, 50),
        "get on a store without replica, p50 ms": percentile(primary, 50),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--batch", default="1,100")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    server = scratch_postgres()
    replica = Replica(server, Path(server.data_dir.parent) / "replica")
    try:
        replica.start()
        dsn = fresh_database(server, "bench_replica")
        Store.connect(dsn).close()  # migrated
        replica.wait_caught_up(dsn)
        print("| batch | commits | p50 ms without | p50 ms with | mean ms without | mean ms with |")
        print("|---:|---:|---:|---:|---:|---:|")
        for batch in (int(b) for b in args.batch.split(",")):
            commits = args.commits if batch == 1 else max(args.commits // 20, args.rounds)
            lat = bench_write_path(dsn, replica.dsn_like(dsn), commits, batch, args.rounds)
            print(
                f"| {batch} | {commits} | {percentile(lat['without'], 50):.3f} "
                f"| {percentile(lat['with'], 50):.3f} | {np.mean(lat['without']):.3f} "
                f"| {np.mean(lat['with']):.3f} |"
            )
        # The write benchmark's burst (tens of MB of WAL) is replayed first: how long that
        # took is the lag a burst leaves; the lag below is the steady state's.
        print(f"\nreplica catch-up after the write burst: {replica.wait_caught_up(dsn, 600):.2f} s")
        lags = bench_lag(dsn, replica, 500)
        print(
            f"replica lag after a commit (500 commits): p50 {percentile(lags, 50) * 1000:.2f} ms,"
            f" p95 {percentile(lags, 95) * 1000:.2f} ms, max {max(lags) * 1000:.2f} ms"
        )
        print()
        for name, value in bench_reads_after_writes(dsn, replica, 500).items():
            print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
    finally:
        replica.stop()
        discard(server)


if __name__ == "__main__":
    main()
