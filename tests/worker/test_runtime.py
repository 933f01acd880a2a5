"""Finding the servers without being told: REDIS_URL, else the running up's run file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from engram.store import Store
from engram.worker import ConfigError, Producer
from engram.worker.embedded import runfile
from tests.redis_fixtures import InProcessWorker

StartWorker = Callable[..., InProcessWorker]


def _run_file(home: Path, pid: int, create_time: float, redis_url: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / runfile.NAME).write_text(
        json.dumps({"pid": pid, "create_time": create_time, "redis_url": redis_url})
    )


def test_from_env_finds_the_running_homes_redis(
    tmp_path: Path,
    redis_url: str,
    store: Store,
    start_worker: StartWorker,
    scope: dict[str, str],
) -> None:
    me = psutil.Process(os.getpid())
    _run_file(tmp_path, me.pid, me.create_time(), redis_url)  # as a running up writes it
    env = {"ENGRAM_HOME": str(tmp_path), "ENGRAM_PARTITIONS": "4"}
    with start_worker(store), Producer.from_env(env) as producer:
        assert producer.partitions == 4
        receipt = producer.remember(scope, "Found without a URL.").wait(timeout=10)
        assert receipt.scope_revision == 1


def test_from_env_prefers_redis_url_and_ignores_a_dead_ups_run_file(
    tmp_path: Path, redis_url: str
) -> None:
    _run_file(tmp_path, 999_999_999, 0.0, "redis://127.0.0.1:1/0")  # its up is gone
    assert runfile.read_live(tmp_path) is None
    with pytest.raises(ConfigError) as info:
        Producer.from_env({"ENGRAM_HOME": str(tmp_path)})
    assert info.value.code == "not_configured"
    me = psutil.Process(os.getpid())
    _run_file(tmp_path, me.pid, me.create_time() - 100, "redis://127.0.0.1:1/0")
    assert runfile.read_live(tmp_path) is None  # the pid lives, but it is another process now
    with Producer.from_env({"ENGRAM_HOME": str(tmp_path), "REDIS_URL": redis_url}) as producer:
        assert producer.client.ping()
