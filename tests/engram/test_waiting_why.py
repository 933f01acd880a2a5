"""A wait that runs out says why, when engram knows: ``engram enqueue --wait`` to a
paused partition names the pause (who, since when, why), not a worker that may be
missing; ``engram reembed`` while the jobs are paused says they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from engram.cli import main
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST
from worker import pause
from worker.protocol import partition_of


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, redis_url: str, tmp_path: Path) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("ENGRAM_LEASE_TTL_MS", str(FAST.lease_ttl_ms))


@pytest.mark.usefixtures("env")
def test_a_wait_on_a_paused_partition_names_the_pause(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    scope = {"user_id": "paused-wait"}
    number = partition_of(scope, FAST.partitions)
    pause.pause_partition(redis_client, number, pause.Pause.now("ada", "reindexing"))
    code = main(
        [
            "enqueue",
            "remember",
            "--scope",
            json.dumps(scope),
            "--request",
            '{"text": "Ada lives in London."}',
            "--wait",
            "0.3",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 3 and json.loads(out)["status"] == "pending"
    assert f"Its partition {number} is paused by ada since " in err
    assert "UTC (reindexing)" in err and f"engram resume partition {number}" in err
    assert "engram up" not in err
    # Not paused: the question it asked before, whether a worker runs.
    pause.resume_partition(redis_client, number)
    assert main(["enqueue", "forget", "--scope", json.dumps(scope), "--request",
                 '{"id": "mem_1"}', "--wait", "0.3"]) == 3  # fmt: skip
    assert "is `engram up` or `engram worker` running?" in capsys.readouterr().err
