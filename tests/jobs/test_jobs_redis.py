"""The jobs on a Redis of their own (``ENGRAM_JOBS_REDIS_URL``) beside a real valkey
cluster (``cluster_fixtures``): the commands that need the jobs refuse a cluster with
no jobs Redis (or a cluster named for the jobs), saying what to set; the pause of the
jobs goes to the jobs' Redis, a partition's to the cluster."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from typing import Any

import pytest
import redis

from engram.cli import main
from engram.jobs import keys as jobs_keys
from engram.jobs import redaction
from engram.jobs_redis import forget_hook
from engram.store import ForgetEvent, Scope, Store
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.settings import Settings
from tests.cli_support import command_env, logging_restored  # noqa: F401 (an autouse fixture)
from tests.worker.test_cluster import CONFIG

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
    command_env(monkeypatch, tmp_path / "home", redis_url=cluster_url, database_url=dsn)
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
    command_env(
        monkeypatch,
        tmp_path / "home",
        redis_url=cluster_url,
        database_url=dsn,
        jobs_redis_url=redis_url,
        partitions=CONFIG.partitions,
    )
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


# -- the stream workers' forget hook ----------------------------------------------------

EVENT = ForgetEvent(
    scope=Scope.of({"user_id": "ada"}),
    record_id="mem_1",
    revisions=(1,),
    operation_id="op-forget",
    already_forgotten=False,
)


def test_the_forget_hook_follows_where_the_jobs_live(
    cluster_url: str, redis_url: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    home = str(tmp_path / "home")
    single, cluster = connect_redis(redis_url), connect_redis(cluster_url)
    # The jobs share the streams' one server: the events go in the workers' pipeline.
    shared = Settings.from_env({"REDIS_URL": redis_url, "ENGRAM_HOME": home})
    assert forget_hook(shared, single) is redaction.hand_over
    # A cluster and no jobs Redis: no hook, and the worker says why.
    alone = Settings.from_env({"REDIS_URL": cluster_url, "ENGRAM_HOME": home})
    with caplog.at_level(logging.WARNING):
        assert forget_hook(alone, cluster) is None
    assert "ENGRAM_JOBS_REDIS_URL is not set" in caplog.text
    # The jobs on their own Redis: the events go there, nothing into the cluster pipeline.
    apart = Settings.from_env(
        {"REDIS_URL": cluster_url, "ENGRAM_JOBS_REDIS_URL": redis_url, "ENGRAM_HOME": home}
    )
    hook = forget_hook(apart, cluster)
    assert hook is not None and hook is not redaction.hand_over
    pipe = cluster.pipeline(transaction=False)
    hook([EVENT], pipe)
    assert len(pipe) == 0
    [raw] = single.lrange(jobs_keys.FORGET_INBOX, 0, -1)
    assert json.loads(raw)["operation_id"] == "op-forget"
    single.close()
    cluster.close()


def test_a_jobs_redis_that_does_not_answer_stops_no_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
    with caplog.at_level(logging.WARNING):
        redaction.hand_over_to(down)([EVENT], None)  # no error: the sweeper hands it over
    assert "forgets not handed to the jobs" in caplog.text and "ada" not in caplog.text


def test_a_redaction_waits_a_moment_for_a_reply_not_there_yet(
    cluster_url: str, redis_url: str, store: Store
) -> None:
    """With the jobs on their own Redis, a forget reaches them just before its worker's
    reply reaches the cluster: the redaction still updates that reply."""
    from engram.jobs.context import JobContext
    from tests.jobs_fixtures import registry, settings

    cluster = connect_redis(cluster_url)
    ctx = JobContext(
        store=store,
        client=connect_redis(redis_url),
        registry=registry(),
        settings=settings(),
        streams=CONFIG,
        streams_redis=cluster,
    )
    reply = {"receipt": {"kind": "forget", "redaction": "pending"}}
    late = threading.Timer(
        0.3, lambda: cluster.rpush(keys.reply(EVENT.scope.key, "op-forget"), json.dumps(reply))
    )
    late.start()
    redaction.finish(ctx, [EVENT], "complete")
    late.join()
    [raw] = cluster.lrange(keys.reply(EVENT.scope.key, "op-forget"), 0, -1)
    assert json.loads(raw)["receipt"]["redaction"] == "complete"
    ctx.client.close()
    cluster.close()
