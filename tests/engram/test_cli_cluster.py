"""``engram dead-letters`` with ``REDIS_URL`` naming a real valkey cluster
(``cluster_fixtures``): letters made there are listed, shown, retried (onto their
scope's partition, where the worker commits them) and discarded in bulk."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from engram.cli import main
from engram.store import Store
from engram.worker import keys
from engram.worker.admin import deadletters
from engram.worker.embedded.runtime import connect_redis
from tests.cli_support import command_env, logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import wait_until
from tests.worker.test_cluster import CONFIG, cluster_worker, scope_on


def _op(scope: dict[str, str], operation_id: str) -> str:
    request = {"text": "Bob likes jazz."}
    return json.dumps(
        {"operation_id": operation_id, "kind": "remember", "scope": scope, "request": request}
    )


def test_dead_letters_on_a_cluster_from_the_command_line(
    cluster_url: str,
    fresh_dsn: str,
    fresh_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    command_env(
        monkeypatch,
        tmp_path / "home",
        redis_url=cluster_url,
        database_url=fresh_dsn,
        partitions=CONFIG.partitions,
    )
    client = connect_redis(cluster_url)
    with cluster_worker(cluster_url, fresh_store):
        # Each sent to a partition that is not its scope's: dead-lettered.
        for n, partition in enumerate((1, 6)):
            wrong = keys.stream((partition + 1) % CONFIG.partitions)
            client.xadd(wrong, {"op": _op(scope_on(partition, "cli-dead"), f"op-{n}")})
        wait_until(lambda: len(deadletters.read(client)) == 2, timeout=30, what="the letters")

        assert main(["dead-letters", "list", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert listed["total"] == 2
        by_op = {d["operation_id"]: d["id"] for d in listed["dead_letters"]}
        assert set(by_op) == {"op-0", "op-1"}
        assert main(["dead-letters", "show", by_op["op-0"], "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["operation_id"] == "op-0"

        # Retried onto its scope's partition (another slot): committed there.
        assert main(["dead-letters", "retry", by_op["op-0"]]) == 0
        assert json.loads(capsys.readouterr().out)["partition"] == 1
        wait_until(lambda: fresh_store.browse.receipt("op-0"), timeout=30, what="the commit")

        assert main(["dead-letters", "discard", "--all"]) == 0
        dry = json.loads(capsys.readouterr().out)
        assert dry["count"] == 1 and [d["operation_id"] for d in dry["dead_letters"]] == ["op-1"]
        confirm = dry["confirm"]
        assert main(["dead-letters", "discard", "--all", "--confirm", confirm]) == 0
        capsys.readouterr()
        assert deadletters.read(client) == []
    client.close()


def test_a_cluster_none_of_whose_seeds_answers_is_unavailable_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = []
    for _ in range(2):  # ports nothing listens on
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    monkeypatch.setenv("REDIS_URL", f"redis://default:s3cret-pw@{hosts}/0")
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    for argv in (["health"], ["metrics"], ["dead-letters", "list"], ["jobs-health"]):
        assert main(argv) == 5, argv
        err = capsys.readouterr().err
        assert "no node of the Redis Cluster answered" in err and "Traceback" not in err
        assert "s3cret-pw" not in err


def test_prune_trims_the_dead_letters_on_the_cluster_without_a_jobs_redis(
    cluster_url: str,
    fresh_dsn: str,
    fresh_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    command_env(monkeypatch, tmp_path / "home", redis_url=cluster_url, database_url=fresh_dsn)
    client = connect_redis(cluster_url)
    client.xadd(keys.DEAD_LETTERS, {"op": "{}"}, id="1000-0")  # from 1970: past any window
    client.xadd(keys.DEAD_LETTERS, {"op": "{}"})
    assert main(["prune", "dead-letters", "--older-than", "1h"]) == 0
    assert "dead-letters: 1 removed" in capsys.readouterr().out
    assert client.xlen(keys.DEAD_LETTERS) == 1
    client.close()
