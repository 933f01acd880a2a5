"""The jobs' commands: reembed (with its progress), prune, jobs --burst, jobs-health."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from engram.cli import main
from engram.jobs import keys, queues
from engram.store import HashingEmbedder, Store
from engram.worker.embedded.runtime import connect_redis
from tests.embedder_faults import FAULTY_PLUGINS
from tests.jobs_fixtures import PLUGINS, JobsProcess
from tests.redis_fixtures import FAST


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, fresh_dsn: str, redis_url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("ENGRAM_EMBEDDERS", PLUGINS)
    monkeypatch.setenv("ENGRAM_JOBS_TICK", "0.2s")


def records(store: Store, count: int = 3) -> None:
    mem = store.session({"user_id": "ada"}, embedder=HashingEmbedder(64))
    for i in range(count):
        mem.remember(f"Ada note {i}.")


@pytest.mark.usefixtures("env")
def test_reembed_follows_the_job_with_a_progress_bar_until_active(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    records(fresh_store)
    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
    assert main(["reembed", "--model", "hashing:32", "--requested-by", "ops"]) == 0
    out = capsys.readouterr().out
    assert "re-embedding generation 2: job reembed-" in out
    *_, bar, said = out.strip().splitlines()
    assert "3/3" in bar and "100%" in bar and bar.endswith("activated")
    assert said.startswith("activated: writes held off ")
    assert fresh_store.embeddings.active().model_id == "hashing-32"  # type: ignore[union-attr]


@pytest.mark.usefixtures("env")
def test_reembed_refuses_a_bad_model_and_says_when_no_jobs_worker_runs(
    fresh_store: Store, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    records(fresh_store)
    assert main(["reembed", "--model", "nope"]) == 2
    assert "invalid_request: unknown embedder 'nope'" in capsys.readouterr().err
    assert main(["reembed", "--model", "hashing:16", "--detach"]) == 0
    captured = capsys.readouterr()
    assert "job reembed-" in captured.out
    assert "no `engram jobs` worker is running" in captured.err
    assert queues.queue(connect_redis(redis_url), keys.REEMBED_QUEUE).count == 1
    # `engram jobs --burst` runs what is queued, then exits.
    assert main(["jobs", "--burst"]) == 0
    assert fresh_store.embeddings.active().model_id == "hashing-16"  # type: ignore[union-attr]


# ``python -m engram`` as if onnxruntime were not installed (minilm's extra missing).
WITHOUT_ONNXRUNTIME = """
import runpy, sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "onnxruntime":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
sys.argv = ["engram", *sys.argv[1:]]
runpy.run_module("engram", run_name="__main__", alter_sys=True)
"""


@pytest.mark.usefixtures("env")
def test_reembed_to_a_model_that_cannot_load_exits_2_and_creates_nothing(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    records(fresh_store)
    before = [(g.id, g.status) for g in fresh_store.embeddings.all()]
    monkeypatch.setenv("ENGRAM_EMBEDDERS", FAULTY_PLUGINS)
    assert main(["reembed", "--model", "unloadable"]) == 2
    err = capsys.readouterr().err
    assert "embedder_cannot_load" in err and "unloadable.onnx is missing" in err
    env = {**os.environ, "DATABASE_URL": fresh_dsn, "REDIS_URL": redis_url}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ONNXRUNTIME, "reembed", "--model", "minilm"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'engram[minilm]'" in done.stderr
    assert "onnxruntime is missing" in done.stderr
    assert [(g.id, g.status) for g in fresh_store.embeddings.all()] == before
    assert queues.queue(connect_redis(redis_url), keys.REEMBED_QUEUE).count == 0


@pytest.mark.usefixtures("env")
def test_reembed_exits_1_with_the_cause_when_its_job_fails(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    records(fresh_store)
    monkeypatch.setenv("ENGRAM_REEMBED_RETRY", "off")
    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
    # leaky loads, then fails on every text it is given.
    assert main(["reembed", "--model", "leaky"]) == 1
    captured = capsys.readouterr()
    assert "failed: ValueError" in captured.out + captured.err


@pytest.mark.usefixtures("env")
def test_prune_reports_counts_per_kind(
    fresh_store: Store, fresh_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mem = fresh_store.session({"user_id": "bob"}, embedder=HashingEmbedder(64))
    fact = mem.remember("Bob likes jazz.").records[0]
    mem.retract(fact.id)
    with psycopg.connect(fresh_dsn) as conn:
        conn.execute(
            "UPDATE engram_revisions SET recorded_at = recorded_at - %s", (timedelta(days=40),)
        )
    assert main(["prune", "history", "receipts", "--older-than", "30d"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("history: 1 removed (older than ")
    assert lines[1].startswith("receipts: 0 removed")
    assert main(["prune", "receipts"]) == 0
    assert capsys.readouterr().out == "receipts: retention off, nothing pruned\n"
    assert main(["prune", "everything"]) == 2
    assert "prune one of history, receipts, dead-letters" in capsys.readouterr().err
    assert main(["prune", "history", "--older-than", "a while"]) == 2


@pytest.mark.usefixtures("env")
def test_a_prune_with_no_target_keeps_receipts_while_their_retention_is_off(
    fresh_store: Store, fresh_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mem = fresh_store.session({"user_id": "bob"}, embedder=HashingEmbedder(64))
    mem.remember("Bob likes jazz.", operation_id="signup:bob")
    with psycopg.connect(fresh_dsn) as conn:
        conn.execute(
            "UPDATE engram_receipts SET committed_at = committed_at - %s", (timedelta(days=40),)
        )
    assert main(["prune", "--older-than", "30d"]) == 0
    out = capsys.readouterr().out
    assert "receipts: retention off, nothing pruned (name it to prune it anyway)" in out
    # The receipt is still the dedupe memory: the same operation replays.
    assert mem.remember("Bob likes jazz.", operation_id="signup:bob").replayed
    assert main(["prune", "--older-than", "30d", "--enqueue"]) == 0
    assert "prune receipts" not in capsys.readouterr().out


@pytest.mark.usefixtures("env")
def test_jobs_health_says_whether_a_jobs_worker_lives_here(
    fresh_store: Store, fresh_dsn: str, redis_url: str, jobs_processes: Callable[..., JobsProcess]
) -> None:
    from tests.redis_fixtures import wait_until

    assert main(["jobs-health"]) == 1
    worker = jobs_processes(database_url=fresh_dsn, redis_url=redis_url)
    wait_until(lambda: main(["jobs-health"]) == 0, timeout=30, what="a live jobs worker")
    worker.kill()
    assert main(["jobs-health"]) == 1, "a killed worker is not alive, however fresh its key"


@pytest.mark.slow
@pytest.mark.usefixtures("env")
def test_demo_reembed_moves_the_store_while_writes_go_on(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    worker_processes: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    worker_processes(database_url=fresh_dsn, redis_url=redis_url, env={"ENGRAM_EMBEDDERS": PLUGINS})
    code = main(["demo-reembed", "--model", "hashing:32", "--records", "50", "--rate", "10"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "starting `engram jobs` for the demo" in out
    writes = next(line for line in out.splitlines() if line.startswith("writes meanwhile"))
    sent = int(writes.split()[2])
    assert f"{sent} committed, 0 refused" in writes
    assert "active model: hashing-32" in out
    assert fresh_store.embeddings.active().model_id == "hashing-32"  # type: ignore[union-attr]
