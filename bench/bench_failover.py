"""A cluster master SIGKILLed under load: how long until its replica serves its slots,
and how many acknowledged enqueues were lost (no ``WAIT``: replication is
asynchronous).

    python -m bench.bench_failover [--seconds 3] [--producers 2] [--repeat 3]

Each run: a fresh 3-master + 3-replica valkey cluster (``tests.cluster_fixtures``,
``cluster-node-timeout`` 2 s, ``appendfsync always``), a fresh database, two
``engram worker`` processes (hashing embedder), producer threads enqueueing
``remember`` operations one at a time, each with its own operation id. After
``--seconds`` the master serving partition 0 is SIGKILLed; the load goes on until
the cluster is whole again and ``--seconds`` more. Then two fresh workers are
started (so that a worker the failover stopped does not count as a loss) and
every acknowledged operation's receipt is awaited.

Reports, per run: the failover time (kill -> every slot served, ``cluster_state:ok``),
the enqueues acknowledged, refused (the producer got an error: it would retry),
acknowledged but never committed (lost), and whether the first workers survived.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_cluster import start_workers, stop_workers
from bench.common import discard, fresh_database, scratch_postgres
from engram.store import Store
from engram.store.errors import EngramError
from engram.worker import Pending, Producer, keys
from tests.cluster_fixtures import ValkeyCluster

PARTITIONS = 16


class Load:
    """Producer threads enqueueing until stopped; what was acknowledged, what refused."""

    def __init__(self, url: str, producers: int) -> None:
        self.stop = threading.Event()
        self.acknowledged: list[Pending] = []
        self.refused = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._produce, args=(url, n), daemon=True)
            for n in range(producers)
        ]

    def _produce(self, url: str, n: int) -> None:
        producer = Producer.from_url(url, partitions=PARTITIONS)
        i = 0
        while not self.stop.is_set():
            try:
                p = producer.remember({"user_id": f"fo-{n}-{i % 200}"}, f"fact {i}")
                with self._lock:
                    self.acknowledged.append(p)
            except EngramError:
                with self._lock:
                    self.refused += 1
                time.sleep(0.05)
            i += 1
            time.sleep(0.002)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=30)


def one_run(args: argparse.Namespace, run: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    cluster = ValkeyCluster(folder / "cluster").start()
    try:
        dsn = fresh_database(args.postgres, f"bench_failover_{run}")
        Store.connect(dsn).close()  # migrated before the workers start
        workers = start_workers(2, dsn, cluster.url, folder, partitions=PARTITIONS)
        try:
            with Load(cluster.url, args.producers) as load:
                time.sleep(args.seconds)
                took = cluster.kill_master_of(keys.stream(0))
                time.sleep(args.seconds)
            survived = all(w.poll() is None for w in workers)
        finally:
            stop_workers(workers)
        logs = "".join(f.read_text(errors="replace") for f in folder.glob("worker-*.log"))
        fresh = start_workers(2, dsn, cluster.url, folder, partitions=PARTITIONS, tag="after")
        try:
            lost = sum(1 for p in load.acknowledged if not _committed(p))
        finally:
            stop_workers(fresh)
        return {
            "failover s": took,
            "acknowledged": len(load.acknowledged),
            "refused": load.refused,
            "lost": lost,
            "workers survived": survived and "consumer crashed" not in logs,
        }
    finally:
        cluster.stop()


def _committed(p: Pending) -> bool:
    try:
        p.wait(20)
    except EngramError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.postgres = scratch_postgres()
    rows = []
    try:
        for run in range(args.repeat):
            rows.append(one_run(args, run))
    finally:
        discard(args.postgres)
    print("\n| run | failover s | acknowledged | refused | lost | first workers survived |")
    print("|---:|---:|---:|---:|---:|---|")
    for n, r in enumerate(rows, 1):
        print(
            f"| {n} | {r['failover s']:.1f} | {r['acknowledged']} | {r['refused']} "
            f"| {r['lost']} | {r['workers survived']} |"
        )


if __name__ == "__main__":
    main()
