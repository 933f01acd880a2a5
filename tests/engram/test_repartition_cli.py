"""``engram repartition`` in this process: what it prints, its refusals (exit 2, nothing
changed), a wait that runs out (exit 3), its audit row, and what ``engram health``
says of entries left in a replaced epoch's streams. Under load, with real workers and
SIGKILLs: ``tests/worker/test_repartition.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from engram.cli import main
from engram.store import Store
from engram.worker import Producer, keys, layout
from engram.worker.consuming.membership import live_workers
from engram.worker.defaults import MAX_PARTITIONS
from engram.worker.layout import Epoch, Layout
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST, InProcessWorker, wait_until


@pytest.fixture
def env(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, tmp_path: Path, store: Store, dsn: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)  # a switch is audited
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("ENGRAM_LEASE_TTL_MS", str(FAST.lease_ttl_ms))


@pytest.mark.usefixtures("env")
def test_refusals_change_nothing(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, why in (
        (["repartition", "0"], "at least 1"),
        (["repartition", str(FAST.partitions)], f"already has {FAST.partitions}"),
        (["repartition", str(MAX_PARTITIONS + 1)], f"at most {MAX_PARTITIONS}"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "repartition_refused" in err and why in err
        assert layout.stored(redis_client) is None
        assert not redis_client.exists(keys.closed(0), keys.RETIRING)
    assert main(["repartition"]) == 0
    assert capsys.readouterr().out.startswith(f"{FAST.partitions} partitions, epoch 0 (")


@pytest.mark.usefixtures("env")
def test_a_configured_count_past_the_maximum_is_refused(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(MAX_PARTITIONS + 1))
    assert main(["repartition", "2"]) == 2
    assert f"at most {MAX_PARTITIONS}" in capsys.readouterr().err
    assert layout.stored(redis_client) is None


@pytest.mark.usefixtures("env")
def test_a_switch_begun_or_taken_up_is_audited(
    fresh_store: Store,
    fresh_dsn: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    assert main(["repartition", "2", "--no-wait", "--by", "ops:ada"]) == 0
    assert main(["repartition", "2", "--no-wait"]) == 0
    first, again = fresh_store.audit.about("epoch 1")
    assert (first.action, first.requested_by) == ("layout.repartition", "ops:ada")
    assert first.detail == {
        "from_epoch": 0,
        "from_partitions": FAST.partitions,
        "to_epoch": 1,
        "to_partitions": 2,
        "taken_up": False,
    }
    assert again.requested_by.startswith("cli:") and again.detail["taken_up"] is True
    assert main(["repartition", "3"]) == 2  # refused: no row
    assert len(fresh_store.audit.about("epoch 1")) == 2


@pytest.mark.usefixtures("env")
def test_health_and_the_layout_name_entries_no_worker_reads(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    _, new = layout.begin(redis_client, 2, FAST.partitions)
    layout.finish(redis_client, new)
    # Sent with a raw XADD once no worker reads epoch 0 (before a worker retires it).
    redis_client.xadd(keys.stream(1), {"op": "{}"})
    redis_client.xadd(keys.stream(1), {"op": "{}"})
    assert main(["health"]) == 1  # no worker on this host: as before
    report = json.loads(capsys.readouterr().out)
    assert report["stranded_entries"] == 2
    assert report["stranded_streams"] == [keys.stream(1)]
    assert main(["repartition"]) == 0
    assert f"{keys.stream(1)}: 2 entries no worker reads" in capsys.readouterr().out


@pytest.mark.usefixtures("env")
def test_a_setting_unlike_the_live_workers_is_refused_before_the_first_switch(
    store: Store,
    redis_client: redis.Redis,
    start_worker: Callable[..., InProcessWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with start_worker(store):
        wait_until(lambda: live_workers(redis_client, 5_000), what="a live worker")
        monkeypatch.setenv("ENGRAM_PARTITIONS", "16")
        assert main(["repartition", "8"]) == 2
        assert "live workers use 4" in capsys.readouterr().err
        assert layout.stored(redis_client) is None


@pytest.mark.usefixtures("env")
def test_a_wait_that_runs_out_exits_3_and_the_switch_goes_on(
    redis_client: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No worker runs: the queued operation keeps the old partition from draining.
    Producer.from_url(redis_url, partitions=FAST.partitions).remember({"user_id": "a"}, "x")
    assert main(["repartition", "2", "--timeout", "0.3"]) == 3
    out = capsys.readouterr().out
    assert "still holds entries on 1 partitions" in out
    switching = Layout(Epoch(1, 2), previous=Epoch(0, FAST.partitions))
    assert layout.stored(redis_client) == switching
    assert main(["repartition"]) == 0
    assert "1 of them not yet closed and drained" in capsys.readouterr().out
    assert main(["repartition", "2", "--no-wait"]) == 0
    assert "taking up the switch to 2 partitions" in capsys.readouterr().out
    assert layout.stored(redis_client) == switching


@pytest.mark.usefixtures("env")
def test_a_pause_names_a_partition_of_the_epoch_served(
    store: Store,
    dsn: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    layout.begin(redis_client, 6, FAST.partitions)  # nothing queued: drained already
    # Mid-switch the workers serve the 4 old partitions.
    assert main(["pause", "partition", "5"]) == 2
    assert "numbered 0 to 3" in capsys.readouterr().err
    assert layout.finish(redis_client, layout.read(redis_client, 4)) == Layout(Epoch(1, 6))
    # ENGRAM_PARTITIONS still says 4: the layout in Redis wins.
    assert main(["pause", "partition", "5"]) == 0
    assert main(["resume", "partition", "5"]) == 0
    assert "partition 5 resumed" in capsys.readouterr().out
