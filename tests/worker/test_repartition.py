"""``engram repartition`` under load: producers keep sending, three real ``engram worker``
processes keep committing, and the partition count changes (4 to 6, 6 to 3), with a
worker SIGKILLed mid-switch, or the command itself SIGKILLed and run again. Every
acknowledged operation commits once, each scope's in the order it was sent. Then the
workers retire the replaced epoch's keys: a raw XADD there is refused. Marked slow;
they still run in CI."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
import redis

from engram.store import Store
from engram.worker import Pending, Producer, keys, layout
from engram.worker.admin import pause
from engram.worker.consuming.leases import Leases
from engram.worker.consuming.membership import live_workers
from engram.worker.embedded.runtime import connect_redis
from engram.worker.layout import Epoch, Layout
from engram.worker.protocol import partition_of
from engram.worker.settings import WorkerConfig
from tests.redis_fixtures import REPO, WorkerProcess, stop_all, wait_until, worker_env
from tests.worker.test_chaos import assert_applied_once

pytestmark = pytest.mark.slow

StartProcess = Callable[..., WorkerProcess]
RunCommand = Callable[..., WorkerProcess]


def config_of(partitions: int) -> WorkerConfig:
    return WorkerConfig(
        partitions=partitions, batch_size=32, block_ms=100, lease_ttl_ms=1000, lease_margin_ms=200
    )


@pytest.fixture
def db(fresh_dsn: str) -> Iterator[Store]:
    with Store.connect(fresh_dsn) as store:
        yield store


@pytest.fixture
def commands(tmp_path: Path) -> Iterator[RunCommand]:
    """``engram <argv>`` as subprocesses; every one is stopped (by pid) at the end."""
    started: list[WorkerProcess] = []

    def run(*argv: str, env: dict[str, str]) -> WorkerProcess:
        log_path = tmp_path / f"command-{len(started)}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "engram", *argv],
                env={**os.environ, "PYTHONPATH": str(REPO), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        started.append(WorkerProcess(process, log_path))
        return started[-1]

    yield run
    stop_all(started)


class Load:
    """Producer threads, each the only sender of its scopes, so the order it sent a
    scope's operations in is the order they must commit in: a remember of the scope's
    record, then revises of it, with a remember of another record now and then."""

    def __init__(self, redis_url: str, partitions: int, producers: int = 4, scopes: int = 5):
        self.redis_url = redis_url
        self.partitions = partitions
        self.owned = [
            [{"user_id": f"load-{n}-{i}"} for i in range(scopes)] for n in range(producers)
        ]
        self.sent: dict[str, list[tuple[Pending, str | None]]] = {
            s["user_id"]: [] for own in self.owned for s in own
        }
        self.counts = [0] * producers
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.producers: list[Producer] = []  # closed once their receipts are in
        self.threads = [
            threading.Thread(target=self._produce, args=(n,), daemon=True) for n in range(producers)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _produce(self, n: int) -> None:
        try:
            producer = Producer.from_url(self.redis_url, partitions=self.partitions)
            self.producers.append(producer)
            rng = random.Random(n)
            for s in self.owned[n]:
                uid = s["user_id"]
                self.sent[uid].append((producer.remember(s, "t-0", id=f"mem_{uid}"), "t-0"))
            j = 0
            while not self.stop.is_set():
                j += 1
                s = rng.choice(self.owned[n])
                uid = s["user_id"]
                if rng.random() < 0.8:
                    text: str | None = f"t-{j}"
                    p = producer.revise(s, f"mem_{uid}", text=text, operation_id=f"{uid}:{j}")
                else:
                    text = None
                    p = producer.remember(s, f"other {j}", operation_id=f"{uid}:{j}")
                self.sent[uid].append((p, text))
                self.counts[n] += 1
                time.sleep(rng.uniform(0.02, 0.06))
        except BaseException as exc:  # the test fails on it, with what was raised
            self.errors.append(exc)

    def run_on(self, ops_each: int) -> None:
        """Let every producer send ``ops_each`` more, then stop them."""
        marks = list(self.counts)
        wait_until(
            lambda: (
                all(c >= m + ops_each for c, m in zip(self.counts, marks, strict=True))
                or self.errors
            ),
            timeout=60,
            what="the producers to send more",
        )
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        assert not self.errors, self.errors

    def every(self) -> list[Pending]:
        return [p for sent in self.sent.values() for p, _ in sent]

    def check(self, db: Store, dsn: str) -> None:
        """Every acknowledged operation committed once, each scope's in the order sent."""
        for p in self.every():
            p.wait(60)
        for producer in self.producers:
            producer.close()
        for uid, sent in self.sent.items():
            scope = {"user_id": uid}
            receipts = sorted(
                db.receipts(scope=scope, limit=10_000), key=lambda r: r.scope_revision
            )
            assert [r.operation_id for r in receipts] == [p.operation_id for p, _ in sent], uid
            history = [rev.text for rev in db.history(scope, f"mem_{uid}")]
            assert history == [text for _, text in sent if text is not None], uid
        assert_applied_once(db, dsn, self.every())


def start_workers(
    worker_processes: StartProcess, dsn: str, redis_url: str, config: WorkerConfig
) -> list[WorkerProcess]:
    workers = [
        worker_processes(database_url=dsn, redis_url=redis_url, config=config) for _ in range(3)
    ]
    client = connect_redis(redis_url)
    pids = {str(w.pid) for w in workers}
    leases = Leases(client, ttl_ms=config.lease_ttl_ms)
    wait_until(
        lambda: (
            pids <= {w.get("pid") for w in live_workers(client, 10_000)}
            and all(leases.holders(range(config.partitions)).values())
        ),
        timeout=60,
        what="three live workers holding every partition",
    )
    client.close()
    return workers


def hold_one(client: redis.Redis, load: Load) -> int:
    """Pause a partition the load sends to, once it holds an entry: until it is resumed
    its stream cannot drain, so a switch begun now stays under way."""
    number = partition_of(load.owned[0][0], load.partitions)
    pause.pause_partition(client, number, pause.Pause.now("test"))
    stream = keys.stream(number)

    def unread() -> int:
        """Entries no worker was given: they stay while the pause holds."""
        if not client.exists(stream):
            return 0
        return client.xlen(stream) - int(client.xpending(stream, keys.GROUP)["pending"])

    wait_until(
        lambda: not pause.not_yet_seen(number, live_workers(client, 2_000)),
        timeout=30,
        what="the pause in effect in every worker",
    )
    wait_until(lambda: unread() > 0, timeout=30, what="an entry held by the pause")
    return number


def serving(client: redis.Redis, workers: list[WorkerProcess], epoch: Epoch) -> bool:
    """Every one of ``workers`` serves ``epoch``, and its partitions are all held."""
    pids = {str(w.pid) for w in workers}
    live = [w for w in live_workers(client, 2_000) if w.get("pid") in pids]
    held = Leases(client, ttl_ms=1000).holders(range(epoch.partitions), epoch.number)
    return (
        len(live) == len(pids)
        and all(w.get("epoch") == str(epoch.number) for w in live)
        and all(held.values())
    )


def test_four_to_six_under_load_with_a_worker_killed_mid_switch(
    db: Store,
    fresh_dsn: str,
    redis_url: str,
    redis_client: redis.Redis,
    worker_processes: StartProcess,
    commands: RunCommand,
) -> None:
    config = config_of(4)
    env = worker_env(database_url=fresh_dsn, redis_url=redis_url, config=config)
    workers = start_workers(worker_processes, fresh_dsn, redis_url, config)
    load = Load(redis_url, config.partitions)
    load.start()
    wait_until(lambda: min(load.counts) >= 10, timeout=30, what="the load under way")
    # A paused partition holds the switch (its stream cannot drain) while a worker dies.
    held = hold_one(redis_client, load)
    command = commands("repartition", "6", env=env)
    wait_until(lambda: "waiting" in command.log(), timeout=30, what="the switch under way")
    assert layout.stored(redis_client) == Layout(Epoch(1, 6), previous=Epoch(0, 4))
    [victim] = [w for w in live_workers(redis_client, 2_000) if w.get("pid") == str(workers[0].pid)]
    assert victim.get("partitions"), "the victim held no partition"
    workers[0].kill()  # mid-switch: its partitions of epoch 0 move to the others
    # Operations keep coming, on the new epoch, while the old one is not drained.
    wait_until(lambda: min(load.counts) >= 30, timeout=30, what="operations sent mid-switch")
    assert layout.stored(redis_client) == Layout(Epoch(1, 6), previous=Epoch(0, 4))
    pause.resume_partition(redis_client, held)
    assert command.process.wait(timeout=120) == 0, command.log()
    assert "done: 6 partitions (epoch 1)" in command.log()
    assert layout.stored(redis_client) == Layout(Epoch(1, 6))
    load.run_on(10)  # sent after the switch: they commit too
    load.check(db, fresh_dsn)
    wait_until(
        lambda: serving(redis_client, workers[1:], Epoch(1, 6)),
        timeout=30,
        what="the survivors on epoch 1",
    )
    assert all(w.process.poll() is None for w in workers[1:])


def test_six_to_three_with_the_command_killed_mid_switch_and_run_again(
    db: Store,
    fresh_dsn: str,
    redis_url: str,
    redis_client: redis.Redis,
    worker_processes: StartProcess,
    commands: RunCommand,
) -> None:
    config = config_of(6)
    env = worker_env(database_url=fresh_dsn, redis_url=redis_url, config=config)
    workers = start_workers(worker_processes, fresh_dsn, redis_url, config)
    load = Load(redis_url, config.partitions)
    load.start()
    wait_until(lambda: min(load.counts) >= 10, timeout=30, what="the load under way")
    held = hold_one(redis_client, load)
    first = commands("repartition", "3", env=env)
    wait_until(lambda: "waiting" in first.log(), timeout=30, what="the switch under way")
    first.kill()
    switching = Layout(Epoch(1, 3), previous=Epoch(0, 6))
    assert layout.stored(redis_client) == switching
    # Another target while this switch is under way: refused, nothing changed.
    other = commands("repartition", "5", env=env)
    assert other.process.wait(timeout=60) == 2
    assert "repartition_refused" in other.log() and "in progress" in other.log()
    assert layout.stored(redis_client) == switching
    again = commands("repartition", "3", env=env)
    wait_until(lambda: "waiting" in again.log(), timeout=30, what="the switch taken up")
    pause.resume_partition(redis_client, held)
    assert again.process.wait(timeout=120) == 0, again.log()
    assert "taking up the switch to 3 partitions" in again.log()
    assert layout.stored(redis_client) == Layout(Epoch(1, 3))
    load.run_on(10)
    load.check(db, fresh_dsn)
    wait_until(
        lambda: serving(redis_client, workers, Epoch(1, 3)),
        timeout=30,
        what="the workers on epoch 1",
    )
    assert all(w.process.poll() is None for w in workers)


def _commit_times(dsn: str) -> list[datetime]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT committed_at FROM engram_receipts ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def _longest_gap_s(times: list[datetime], start: datetime, end: datetime) -> float:
    inside = [t for t in times if start <= t <= end]
    return max(((b - a).total_seconds() for a, b in itertools.pairwise(inside)), default=0.0)


def test_what_a_switch_costs_under_load(
    db: Store,
    fresh_dsn: str,
    redis_url: str,
    redis_client: redis.Redis,
    worker_processes: StartProcess,
    commands: RunCommand,
) -> None:
    """No pause, no kill: the switch's length and the longest gap between two commits
    during it, against the longest in as long a stretch before it (printed)."""
    config = config_of(4)
    env = worker_env(database_url=fresh_dsn, redis_url=redis_url, config=config)
    workers = start_workers(worker_processes, fresh_dsn, redis_url, config)
    load = Load(redis_url, config.partitions)
    load.start()
    wait_until(lambda: min(load.counts) >= 40, timeout=60, what="the load under way")
    began = datetime.now().astimezone()
    started = time.monotonic()
    command = commands("repartition", "8", env=env)
    assert command.process.wait(timeout=120) == 0, command.log()
    took_s = time.monotonic() - started
    # The command ends with the steady layout; the workers move over at their next tick.
    wait_until(
        lambda: serving(redis_client, workers, Epoch(1, 8)),
        timeout=30,
        interval=0.01,
        what="the workers on epoch 1",
    )
    moved_s = time.monotonic() - started
    ended = datetime.now().astimezone()
    load.run_on(20)
    load.check(db, fresh_dsn)
    times = _commit_times(fresh_dsn)
    during = _longest_gap_s(times, began, ended)
    calm = _longest_gap_s(times, began - (ended - began), began)
    drained = command.log().rpartition("drained in ")[2].split()[0]
    print(
        f"\nrepartition 4 -> 8 under load: command {took_s:.2f} s (drain {drained} s), "
        f"workers on the new epoch after {moved_s:.2f} s; longest gap between commits "
        f"{during * 1000:.0f} ms in that time, {calm * 1000:.0f} ms in as long before; "
        f"{len(times)} operations"
    )
    assert all(w.process.poll() is None for w in workers)
    assert layout.stored(redis_client) == Layout(Epoch(1, 8))


def test_eight_to_five_on_a_redis_cluster(
    db: Store,
    fresh_dsn: str,
    cluster_url: str,
    worker_processes: StartProcess,
    commands: RunCommand,
) -> None:
    """Every step touches one slot at a time: the layout key, each closure beside its
    stream, each epoch's lease and fence counter beside its stream."""
    config = config_of(8)
    env = worker_env(database_url=fresh_dsn, redis_url=cluster_url, config=config)
    workers = start_workers(worker_processes, fresh_dsn, cluster_url, config)
    load = Load(cluster_url, config.partitions, producers=3)
    load.start()
    wait_until(lambda: min(load.counts) >= 10, timeout=30, what="the load under way")
    command = commands("repartition", "5", env=env)
    assert command.process.wait(timeout=120) == 0, command.log()
    assert "done: 5 partitions (epoch 1)" in command.log()
    load.run_on(10)
    load.check(db, fresh_dsn)
    client = connect_redis(cluster_url)
    try:
        assert layout.stored(client) == Layout(Epoch(1, 5))
        wait_until(
            lambda: serving(client, workers, Epoch(1, 5)),
            timeout=30,
            what="the workers on epoch 1",
        )
    finally:
        client.close()
    assert all(w.process.poll() is None for w in workers)


def test_the_workers_retire_the_replaced_epoch_and_a_raw_xadd_there_is_refused(
    db: Store,
    fresh_dsn: str,
    redis_url: str,
    redis_client: redis.Redis,
    worker_processes: StartProcess,
    commands: RunCommand,
) -> None:
    config = config_of(4)
    env = worker_env(database_url=fresh_dsn, redis_url=redis_url, config=config)
    workers = start_workers(worker_processes, fresh_dsn, redis_url, config)
    scope = {"user_id": "retired"}
    producer = Producer.from_url(redis_url, partitions=config.partitions)
    producer.remember(scope, "before the switch").wait(30)
    command = commands("repartition", "2", env=env)
    assert command.process.wait(timeout=120) == 0, command.log()
    wait_until(
        lambda: serving(redis_client, workers, Epoch(1, 2)) and not layout.retiring(redis_client),
        timeout=30,
        what="the workers on epoch 1, epoch 0 retired",
    )
    for n in range(config.partitions):
        assert redis_client.type(keys.stream(n)) == b"string", n
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            redis_client.xadd(keys.stream(n), {"op": "{}"})  # the README's raw XADD
        assert not redis_client.exists(keys.fence_counter(n), keys.lease(n))
    assert layout.stranded(redis_client, config.partitions) == []
    # The producer read the layout before the switch: it is sent on, and commits.
    assert producer.remember(scope, "after the switch").wait(30).scope_revision == 2
    producer.close()
    [row] = db.audit.about("epoch 1")
    assert row.action == "layout.repartition" and row.detail["to_partitions"] == 2
    assert all(w.process.poll() is None for w in workers)
