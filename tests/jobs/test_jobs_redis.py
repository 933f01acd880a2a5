"""The jobs on a Redis of their own (``ENGRAM_JOBS_REDIS_URL``) beside a real valkey
cluster (``cluster_fixtures``): the commands that need the jobs refuse a cluster with
no jobs Redis (or a cluster named for the jobs), saying what to set; the pause of the
jobs goes to the jobs' Redis, a partition's to the cluster."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from engram.cli import main
from store import Store
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.worker.test_cluster import CONFIG
from worker import keys
from worker.runtime import connect_redis
from worker.settings import Settings

# -- the commands that need the jobs --------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["jobs-health"],
        ["web", "--no-embedder"],
        ["reembed", "--model", "hashing:32", "--detach"],
        ["prune", "--enqueue"],
        ["pause", "jobs"],
        ["resume", "jobs"],
        ["paused"],
    ],
)
def test_a_command_that_needs_the_jobs_says_what_to_set_on_a_cluster(
    argv: list[str],
    cluster_url: str,
    redis_url: str,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("REDIS_URL", cluster_url)
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ENGRAM_JOBS_REDIS_URL", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "ENGRAM_JOBS_REDIS_URL" in err and "Traceback" not in err
    assert err.strip().count("\n") == 0, err  # one line, no traceback
    # Named a cluster for the jobs: refused as well.
    monkeypatch.setenv("ENGRAM_JOBS_REDIS_URL", cluster_url)
    assert main(argv) == 2
    assert "ENGRAM_JOBS_REDIS_URL names a Redis Cluster" in capsys.readouterr().err
    # Nothing was written on the cluster.
    with contextlib.closing(connect_redis(cluster_url)) as client:
        assert client.dbsize() == 0


def test_the_pause_of_the_jobs_is_on_the_jobs_redis(
    cluster_url: str,
    redis_url: str,
    store: Store,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("REDIS_URL", cluster_url)
    monkeypatch.setenv("ENGRAM_JOBS_REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(CONFIG.partitions))
    assert main(["pause", "jobs", "--reason", "upgrade"]) == 0
    assert main(["pause", "partition", "3"]) == 0
    capsys.readouterr()
    assert main(["paused", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["jobs"]["paused"] is True and state["jobs"]["reason"] == "upgrade"
    assert [p["partition"] for p in state["partitions"]] == [3]
    with contextlib.closing(connect_redis(redis_url)) as jobs:
        assert jobs.exists("rq:suspended") and not jobs.exists(keys.PAUSED)
    with contextlib.closing(connect_redis(cluster_url)) as cluster:
        assert cluster.hkeys(keys.PAUSED) == [b"3"] and not cluster.exists("rq:suspended")
    assert main(["resume", "jobs"]) == 0
    assert "jobs resumed" in capsys.readouterr().out


def test_the_jobs_redis_is_a_setting_masked_in_repr() -> None:
    secret = "s3cret-Pa55word-0123456789"
    settings = Settings.from_env({"ENGRAM_JOBS_REDIS_URL": f"redis://default:{secret}@q:6379/0"})
    assert settings.jobs_redis_url == f"redis://default:{secret}@q:6379/0"
    assert secret not in repr(settings) and "default:***@q:6379" in repr(settings)
    assert Settings.from_env({}).jobs_redis_url is None
