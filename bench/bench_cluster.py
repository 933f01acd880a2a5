"""One valkey against a valkey cluster (3 masters + 1 replica each), side by side in
one run: the same ``engram worker`` processes, the same operations, the same store.

    python -m bench.bench_cluster [--ops 5000] [--workers 2] [--repeat 3]

Both servers run on this machine with the append-only file on and ``appendfsync
always`` (the embedded valkey's setting); the cluster is ``tests.cluster_fixtures``'.
Workers use the hashing embedder (``hashing:64``): the figures are the streams',
not a model's. For each system, interleaved (one, cluster, one, cluster...) so a
noisy minute hits both, on a fresh database and an emptied Redis:

1. throughput: ``--ops`` remember operations enqueued 200 per round trip
   (``enqueue_many``) while the workers run; ops/s = operations / (last receipt -
   first enqueue);
2. light load: 200 operations one at a time, each after 20 ms idle (so the worker
   waits in its blocking read): enqueue -> receipt p50 / p99, and the enqueue call
   alone;
3. idle: for 5 s with nothing to do, the workers' CPU (% of one core, all workers)
   and the commands Redis served per second (all nodes).

Prints a markdown table of the medians over ``--repeat`` runs and their ratios
(cluster / one server).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import redis

from bench.common import discard, fresh_database, percentile, scratch_postgres
from engram.procs import die_with_parent
from engram.store import Operation, Store
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey
from tests.cluster_fixtures import ValkeyCluster

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 16
LIGHT_OPS = 200
IDLE_S = 5.0

Figures = dict[str, float]


def start_workers(
    count: int,
    dsn: str,
    url: str,
    folder: Path,
    *,
    partitions: int = PARTITIONS,
    tag: str = "worker",
) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DATABASE_URL": dsn,
        "REDIS_URL": url,
        "ENGRAM_EMBEDDER": "hashing:64",
        "ENGRAM_PARTITIONS": str(partitions),
        "ENGRAM_DB_POOL_SIZE": "4",
    }
    procs = []
    for n in range(count):
        with open(folder / f"{tag}-{n}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "engram", "worker"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    preexec_fn=die_with_parent(),
                )
            )
    return procs


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def throughput(producer: Producer, ops: int) -> float:
    batch = [
        Operation.build("remember", {"user_id": f"bench-{i % 1000}"}, {"text": f"fact {i}"})
        for i in range(ops)
    ]
    started = time.monotonic()
    pending = []
    for i in range(0, ops, 200):
        pending += producer.enqueue_many(batch[i : i + 200])
    for p in pending:
        p.wait(120)
    return ops / (time.monotonic() - started)


def light_load(producer: Producer) -> Figures:
    receipts, enqueues = [], []
    for i in range(LIGHT_OPS):
        time.sleep(0.02)
        started = time.monotonic()
        pending = producer.remember({"user_id": f"light-{i % 50}"}, f"light fact {i}")
        enqueued = time.monotonic()
        pending.wait(30)
        receipts.append((time.monotonic() - started) * 1000)
        enqueues.append((enqueued - started) * 1000)
    return {
        "receipt p50 ms": percentile(receipts, 50),
        "receipt p99 ms": percentile(receipts, 99),
        "enqueue p50 ms": percentile(enqueues, 50),
    }


def idle(workers: list[subprocess.Popen[bytes]], servers: list[int], url: str) -> Figures:
    procs = [psutil.Process(w.pid) for w in workers]
    nodes = [psutil.Process(pid) for pid in servers]

    def cpu(ps: list[psutil.Process]) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in ps)

    time.sleep(1.0)  # the last receipts' counters go out
    commands = _commands(url)
    before_w, before_s = cpu(procs), cpu(nodes)
    time.sleep(IDLE_S)
    return {
        "idle workers CPU %": (cpu(procs) - before_w) / IDLE_S * 100,
        "idle redis CPU %": (cpu(nodes) - before_s) / IDLE_S * 100,
        "idle redis commands/s": (_commands(url) - commands) / IDLE_S,
    }


def _commands(url: str) -> int:
    """Commands served so far, summed over every node (the reply includes this INFO)."""
    client = connect_redis(url)
    try:
        info: object = client.info("stats")
        if isinstance(info, dict) and "total_commands_processed" not in info:
            return sum(int(v["total_commands_processed"]) for v in info.values())
        assert isinstance(info, dict)
        return int(info["total_commands_processed"])
    finally:
        client.close()


def one_run(
    name: str, url: str, servers: list[int], flush: Callable[[], None], args: argparse.Namespace
) -> Figures:
    flush()
    pg, folder = args.postgres, Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    dsn = fresh_database(pg, f"bench_cluster_{name}")
    Store.connect(dsn).close()  # migrated before the workers start
    workers = start_workers(args.workers, dsn, url, folder)
    try:
        with Producer.from_url(url, partitions=PARTITIONS) as producer:
            producer.remember({"user_id": "warm"}, "warm up").wait(60)
            figures = {"ops/s": throughput(producer, args.ops)}
            figures |= light_load(producer)
            figures |= idle(workers, servers, url)
    finally:
        stop_workers(workers)
    return figures


@contextlib.contextmanager
def servers(folder: Path) -> Iterator[tuple[EmbeddedValkey, ValkeyCluster]]:
    single = EmbeddedValkey(folder / "single").start()
    cluster = ValkeyCluster(folder / "cluster")
    try:
        cluster.start()
        yield single, cluster
    finally:
        cluster.stop()
        single.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.postgres = scratch_postgres()
    results: dict[str, list[Figures]] = {"one server": [], "cluster": []}
    try:
        with servers(Path(tempfile.mkdtemp(prefix="bench-cluster-"))) as (single, cluster):

            def flush_single() -> None:
                redis.Redis.from_url(single.url).flushall()

            for run in range(args.repeat):
                results["one server"].append(
                    one_run("single", single.url, [single.pid], flush_single, args)
                )
                results["cluster"].append(
                    one_run(
                        "cluster", cluster.url, [n.pid for n in cluster.nodes], cluster.flush, args
                    )
                )
                print(f"run {run + 1}/{args.repeat} done", file=sys.stderr)
    finally:
        discard(args.postgres)
    print_table(results, args)


def print_table(results: dict[str, list[Figures]], args: argparse.Namespace) -> None:
    print(
        f"\n{args.ops} ops, {args.workers} workers, {PARTITIONS} partitions, "
        f"median of {args.repeat} runs\n"
    )
    print("| figure | one server | cluster (3+3) | cluster / one |")
    print("|---|---:|---:|---:|")
    for key in results["one server"][0]:
        a = statistics.median(r[key] for r in results["one server"])
        b = statistics.median(r[key] for r in results["cluster"])
        print(f"| {key} | {a:.1f} | {b:.1f} | {b / a if a else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
