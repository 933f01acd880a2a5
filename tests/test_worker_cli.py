"""The ``engram`` command: enqueue, metrics, health, and ``engram up`` end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from engram.cli import main
from store import Store
from tests.redis_fixtures import FAST, REPO, InProcessWorker, wait_until

StartWorker = Callable[..., InProcessWorker]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, redis_url: str, tmp_path: Path) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("ENGRAM_LEASE_TTL_MS", str(FAST.lease_ttl_ms))


@pytest.mark.usefixtures("env")
def test_enqueue_waits_and_prints_the_receipt(
    store: Store,
    start_worker: StartWorker,
    scope: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with start_worker(store):
        code = main(
            [
                "enqueue",
                "remember",
                "--scope",
                json.dumps(scope),
                "--request",
                '{"text": "Ada lives in London."}',
                "--operation-id",
                "cli:1",
                "--wait",
                "10",
            ]
        )
        assert code == 0
        receipt = json.loads(capsys.readouterr().out)
        assert receipt["operation_id"] == "cli:1" and receipt["scope_revision"] == 1
        assert receipt["records"][0]["status"] == "active"
        code = main(
            [
                "enqueue",
                "retract",
                "--scope",
                json.dumps(scope),
                "--request",
                '{"id": "mem_none"}',
                "--wait",
                "10",
            ]
        )
        assert code == 1
        assert json.loads(capsys.readouterr().out)["error"]["code"] == "not_found"
        assert main(["health"]) == 0
        assert json.loads(capsys.readouterr().out) == {"live_workers_on_this_host": 1}
        assert main(["metrics"]) == 0
        assert "engram_ops_committed_total 1" in capsys.readouterr().out


@pytest.mark.usefixtures("env")
def test_enqueue_without_wait_prints_where_it_went(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["enqueue", "forget", "--scope", '{"user_id": "ada"}', "--request", '{"id": "mem_1"}'])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["operation_id"].startswith("op_") and 0 <= out["partition"] < FAST.partitions
    assert out["entry"]


@pytest.mark.usefixtures("env")
def test_enqueue_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "remember", "--scope", "{", "--request", "{}"]) == 2
    assert "must be JSON" in capsys.readouterr().err
    assert (
        main(["enqueue", "remember", "--scope", '{"user_id": "a"}', "--request", '{"text": ""}'])
        == 2
    )
    assert "invalid_request" in capsys.readouterr().err
    assert main(["health"]) == 1  # no worker running


def test_commands_say_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("REDIS_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path))
    assert main(["metrics"]) == 2
    assert "set REDIS_URL, or start `engram up`" in capsys.readouterr().err


def _pids_of(home: Path) -> dict[str, int]:
    pg = int((home / "postgres" / "postmaster.pid").read_text().split()[0])
    vk = int((home / "valkey" / "valkey.pid").read_text().strip())
    return {"postgres": pg, "valkey": vk}


@pytest.mark.slow
def test_engram_up_runs_everything_and_stops_cleanly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        {
            "ENGRAM_HOME": str(home),
            "ENGRAM_EMBEDDER": "hashing:64",
            "ENGRAM_PARTITIONS": "4",
            "ENGRAM_LEASE_TTL_MS": "1000",
            "PYTHONPATH": str(REPO),
        }
    )
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "engram", "up", "--workers", "2"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        wait_until(
            lambda: "Ctrl-C stops everything" in log_path.read_text() or up.poll(),
            timeout=60,
            what="engram up to start",
        )
        out = log_path.read_text()
        assert "engram is up" in out, out
        assert "PostgreSQL  postgresql://" in out and "Redis       redis://127.0.0.1:" in out
        run = json.loads((home / "run.json").read_text())
        pids = _pids_of(home)
        workers = wait_until(
            lambda: (
                [c for c in psutil.Process(up.pid).children() if "worker" in " ".join(c.cmdline())]
                or None
            ),
            what="worker processes",
        )
        assert len(workers) == 2
        # Another shell, same ENGRAM_HOME, no URLs: found through the run file.
        sent = subprocess.run(
            [
                sys.executable,
                "-m",
                "engram",
                "enqueue",
                "remember",
                "--scope",
                '{"user_id": "up"}',
                "--request",
                '{"text": "Through engram up."}',
                "--wait",
                "30",
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["scope_revision"] == 1
        assert run["redis_url"].startswith("redis://127.0.0.1:")
    finally:
        up.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            raise
    assert code == 0
    for name, pid in [*pids.items(), *(("worker", w.pid) for w in workers)]:
        wait_until(lambda pid=pid: not _alive(pid), what=f"{name} to exit")  # type: ignore[misc]
    assert not (home / "run.json").exists()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
