"""``DATABASE_READ_URL`` through the ``engram`` commands, on a real streaming replica
(tests/replica_fixtures.py): ``engram worker`` stamps each receipt with its commit
position, and the one-off reads go to the replica unless given that position."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from engram.cli import main
from engram.store import Store
from engram.worker import Producer
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST, WorkerProcess
from tests.replica_fixtures import Replica, replica  # noqa: F401 (the fixture)


@pytest.fixture
def read_env(
    monkeypatch: pytest.MonkeyPatch,
    dsn: str,
    redis_url: str,
    replica: Replica,  # noqa: F811
) -> dict[str, str]:
    Store.connect(dsn).close()  # migrated on the primary
    replica.wait_caught_up(dsn)
    env = {"DATABASE_URL": dsn, "DATABASE_READ_URL": replica.dsn_like(dsn)}
    for name, value in {**env, "REDIS_URL": redis_url, "COLUMNS": "200"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("ENGRAM_EMBEDDER", "hashing:64")  # the worker's (worker_env)
    return env


def test_the_worker_stamps_positions_and_the_cli_reads_after_them(
    read_env: dict[str, str],
    dsn: str,
    redis_url: str,
    replica: Replica,  # noqa: F811
    worker_processes: Callable[..., WorkerProcess],
    scope: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    worker_processes(
        database_url=dsn,
        redis_url=redis_url,
        env={"DATABASE_READ_URL": read_env["DATABASE_READ_URL"]},
    )
    with replica.paused(), Producer.from_url(redis_url, partitions=FAST.partitions) as producer:
        receipt = producer.remember(scope, "the harbour opens at six").wait(60)
        position, record_id = receipt.position, receipt.records[0].id
        assert position is not None  # the worker knows of the replica
        where = ("--scope", json.dumps(scope))
        # Without the position: the replica, whose replay is paused.
        assert main(["get", record_id, *where]) == 1
        assert main(["history", record_id, *where]) == 1
        capsys.readouterr()
        assert main(["get", record_id, *where, "--after", position, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["text"] == "the harbour opens at six"
        assert main(["recall", "harbour", *where, "--after", position, "--json"]) == 0
        hits: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
        assert [h["record"]["id"] for h in hits] == [record_id]


def test_a_bad_position_is_refused(read_env: dict[str, str], scope: dict[str, str]) -> None:
    assert main(["get", "r1", "--scope", json.dumps(scope), "--after", "soon"]) != 0


def test_engram_web_reads_through_the_replica(read_env: dict[str, str]) -> None:
    """``engram web``'s app is built on a store with the replica as its read pool."""
    from engram.web.config import WebConfig
    from engram.web_cli import build
    from engram.worker.settings import Settings

    with build(
        Settings.from_env(), WebConfig(token="s3cret-dashboard-token-for-tests"), embedder=False
    ) as app:
        store: Store = app.state.web.services.store
        with store.reads.connection() as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
