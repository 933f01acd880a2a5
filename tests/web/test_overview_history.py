"""The overview's last 24 hours (per-minute counters and lag samples in Redis, so they
outlive a restart of the dashboard) and its costly counts (at most every 30 s), on the
suite's real PostgreSQL and valkey, with an injected clock."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from starlette.testclient import TestClient

from engram.store import Store
from engram.web import Services, WebConfig, create_app
from engram.worker import Producer, keys
from engram.worker.admin import metrics
from engram.worker.admin.metrics import BatchStats, StreamState
from engram.worker.embedded.runtime import connect_redis
from tests.redis_fixtures import FAST
from tests.web_fixtures import BASE_URL, EMBEDDER, TOKEN, Web, sign_in

NOW_S = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC, on a minute


@dataclass
class Clock:
    now_s: float = NOW_S

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = connect_redis(redis_url)
    yield conn
    conn.close()


def dashboard(store: Store, conn: redis.Redis, clock: Clock) -> TestClient:
    """A dashboard process's app: built afresh, it holds nothing from an earlier one."""
    app = create_app(
        WebConfig(token=TOKEN, partitions=FAST.partitions, lease_ttl_ms=FAST.lease_ttl_ms),
        Services(
            store=store,
            redis=conn,
            producer=Producer(conn, partitions=FAST.partitions),
            embedder=EMBEDDER,
            clock=clock,
        ),
    )
    client = TestClient(app, base_url=BASE_URL, follow_redirects=False)
    sign_in(client, "local")
    return client


def committed(conn: redis.Redis, n: int, at_s: float, failed: int = 0) -> None:
    """What a worker writes with a batch's ack: its counts, as of ``at_s``."""
    stats = BatchStats(entries=n + failed, committed=n)
    stats.failed["revision_conflict"] = failed
    pipe = conn.pipeline(transaction=True)
    metrics.record_batch(pipe, stats, "worker-1", now_s=at_s)
    pipe.execute()


def day_titles(html: str) -> list[str]:
    day = html[html.index('id="last-day"') : html.index('id="lag-history"')]
    return re.findall(r"<title>([^<]+)</title>", day)


def test_workers_count_each_minute_for_25_hours(client: redis.Redis) -> None:
    committed(client, 3, NOW_S - 3 * 3600 + 5)
    committed(client, 4, NOW_S - 3 * 3600 + 50, failed=2)
    minutes = metrics.minutes(client, now_s=NOW_S)
    assert len(minutes) == 1440 and minutes[-1].start_s == NOW_S
    busy = [m for m in minutes if m.operations]
    assert [(m.start_s, m.committed, m.failed) for m in busy] == [(NOW_S - 3 * 3600, 7, 2)]
    ttl = client.ttl(keys.minute(int(NOW_S - 3 * 3600) // 60))
    assert 24 * 3600 < int(ttl) <= metrics.HISTORY_TTL_S


def test_the_last_day_outlives_a_restart_of_the_dashboard(
    store: Store, client: redis.Redis
) -> None:
    clock = Clock()
    committed(client, 30, NOW_S - 20 * 3600 + 1)  # 20 hours ago
    committed(client, 12, NOW_S - 3600 + 1, failed=1)  # an hour ago
    committed(client, 99, NOW_S - 25 * 3600)  # past the day: not shown
    # The dashboard that was running sampled a backlog on partition 2 two hours ago.
    metrics.record_lag(
        client, [StreamState(p, 500, 0, 480 if p == 2 else 0) for p in range(4)],
        now_s=NOW_S - 2 * 3600,
    )  # fmt: skip
    # A restart: a new app, nothing in its memory; only Redis remembers.
    with dashboard(store, client, clock) as fresh:
        html = fresh.get("/").text
    titles = day_titles(html)
    assert len(titles) == 145  # 10-minute columns over 24 hours, the current one last
    assert "Jan 14 12:00: 30 committed, 0 replayed, 0 failed" in titles[24]
    assert "Jan 15 07:00: 12 committed, 0 replayed, 1 failed" in titles[-7]
    assert sum(int(t.split(": ")[1].split()[0]) for t in titles) == 42
    lag = html[html.index('id="lag-history"') :]
    row = re.search(r"<td class=\"num\">#2</td>(.*?)</tr>", lag, re.S)
    assert row is not None
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1)) == ["0", "0", "480", "Jan 15 06:00"]


def test_the_dashboard_samples_lag_every_minute_it_looks(store: Store, client: redis.Redis) -> None:
    clock = Clock()
    client.xadd(keys.stream(1), {"op": "{}"})
    client.xgroup_create(keys.stream(1), keys.GROUP, id="0")
    with dashboard(store, client, clock) as web:
        web.get("/")
        clock.now_s += 60
        client.xadd(keys.stream(1), {"op": "{}"})
        web.get("/")
    samples = metrics.lag_samples(client, now_s=clock.now_s)
    assert [(s.start_s, s.lags[1]) for s in samples] == [(NOW_S, 1), (NOW_S + 60, 2)]


def test_the_lag_tables_highest_is_never_below_the_lag_now(
    store: Store, client: redis.Redis
) -> None:
    """Issue 42, item 11: the samples are read at most every 30 s, so a lag that rose
    since showed as "now 5 · last hour 0 · 24 h 0" at once."""
    clock = Clock()
    client.delete(keys.stream(3))
    client.xgroup_create(keys.stream(3), keys.GROUP, id="0", mkstream=True)
    with dashboard(store, client, clock) as web:
        web.get("/")  # the history read (and kept for 30 s) while partition 3 is idle
        for _ in range(5):
            client.xadd(keys.stream(3), {"op": "{}"})
        clock.now_s += 10
        lag = web.get("/").text.split('id="lag-history"', 1)[1]
    row = re.search(r"<td class=\"num\">#3</td>(.*?)</tr>", lag, re.S)
    assert row is not None
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))[:3] == ["5", "5", "5"]


def test_vector_counts_are_counted_at_most_every_30_s(store: Store, client: redis.Redis) -> None:
    clock = Clock()
    web = Web(store, client, Producer(client), dashboard(store, client, clock))

    def vectors_shown() -> int:
        found = re.search(r"([\d,]+) vectors</span>", web.client.get("/").text)
        assert found is not None
        return int(found.group(1).replace(",", ""))

    def vectors_stored() -> int:
        return store.browse.generations(limit=1).items[0].vectors

    with web.client:
        web.remember({"user_id": "counted"}, "A first note.")
        first = vectors_shown()
        assert first == vectors_stored()
        web.remember({"user_id": "counted"}, "A second note.")
        clock.now_s += 29
        assert vectors_shown() == first, "counted again within 30 s"
        clock.now_s += 1
        assert vectors_shown() == first + 1 == vectors_stored()
