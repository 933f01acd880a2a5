"""A wait that runs out says why, when engram knows: ``engram enqueue --wait`` to a
paused partition names the pause (who, since when, why), not a worker that may be
missing; ``engram reembed`` while the jobs are paused says they are."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from engram.cli import main
from engram.following import follow
from engram.jobs_cli import jobs_waiting
from engram.store import HashingEmbedder, Store
from engram.worker.admin import pause
from engram.worker.protocol import partition_of
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.jobs_fixtures import PLUGINS, JobsProcess, jobs_processes  # noqa: F401
from tests.redis_fixtures import FAST


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


@pytest.mark.usefixtures("env")
def test_a_reembed_waiting_while_the_jobs_are_paused_says_so(
    monkeypatch: pytest.MonkeyPatch,
    fresh_store: Store,
    fresh_dsn: str,
    redis_client: redis.Redis,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.setenv("ENGRAM_EMBEDDERS", PLUGINS)
    mem = fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64))
    for i in range(3):
        mem.remember(f"Ada note {i}.")
    pause.pause_jobs(redis_client, pause.Pause.now("ada", "upgrade"))
    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
    assert main(["reembed", "--model", "hashing:32", "--detach"]) == 0
    err = capsys.readouterr().err
    assert "engram: reembed waiting: jobs are paused by ada since " in err
    assert "UTC (upgrade); `engram resume jobs` resumes them" in err
    # Followed: the bar's line says why it waits; once resumed, it runs to the end.
    said: list[str] = []

    def why() -> str | None:
        text = jobs_waiting(redis_client)
        if text and not said:
            said.append(text)
            pause.resume_jobs(redis_client)  # after the first line holds it
        return text

    [generation] = [g for g in fresh_store.embeddings.all() if g.status == "pending"]
    assert follow(fresh_store, generation.id, poll_s=0.05, why_waiting=why) == 0
    first, *_, bar, outcome = capsys.readouterr().out.strip().splitlines()
    assert first.endswith(" · " + said[0]) and "pass 1" in first
    assert "jobs are paused" not in bar and bar.endswith("activated")
    assert outcome.startswith("activated: ")
