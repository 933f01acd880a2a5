"""Cancelling a pending re-embedding: its generation ends ``cancelled`` with no vector
left, the audit trail says who and why, its job (a real ``engram jobs`` process) stops
before its next batch, recall stays on the active generation; a generation that is not
pending is refused and unchanged; a cancel and an activation never both win."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engram.jobs import keys, reembed
from engram.jobs.progress import Progress
from engram.store import HashingEmbedder, Operation, Store
from engram.store.errors import GenerationNotPendingError, InvalidRequestError, NotFoundError
from engram.web import rqjobs
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import PLUGINS, JobsProcess, context, marks, registry
from tests.redis_fixtures import wait_until

OLD = HashingEmbedder(64)


def fill(store: Store, count: int) -> None:
    ops = [
        Operation.build("remember", {"user_id": "tea"}, {"text": f"note {i} about green tea"})
        for i in range(count)
    ]
    for result in store.execute(ops, OLD):
        assert not isinstance(result, Exception), result


def audit_rows(store: Store) -> list[Any]:
    return list(store.audit.page().items)


def test_a_running_reembed_cancelled_stops_and_leaves_nothing_behind(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],
    tmp_path: Path,
) -> None:
    fill(fresh_store, 80)
    mark = tmp_path / "embedded"
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={
            "ENGRAM_EMBEDDERS": PLUGINS,
            "ENGRAM_REEMBED_BATCH_SIZE": "5",
            "ENGRAM_TEST_EMBED_DELAY_S": "0.2",
            "ENGRAM_TEST_EMBED_MARK": str(mark),
        },
    )
    client = connect_redis(redis_url)
    started = reembed.start(fresh_store, client, registry(), "slow", requested_by="ada")
    gen = started.generation_id
    wait_until(
        lambda: fresh_store.embeddings.vector_count(gen) >= 10, timeout=60, what="some batches"
    )
    running = Progress.from_dict(fresh_store.embeddings.get(gen).progress)  # type: ignore[union-attr,arg-type]
    assert running is not None and running.state == "running"

    ended = reembed.cancel(fresh_store, gen, requested_by="ada", why="wrong model, sorry")
    assert ended.status == "cancelled"
    assert fresh_store.embeddings.vector_count(gen) == 0

    def stopped() -> Any:
        job = rqjobs.get(client, running.job_id)
        return job if job is not None and job.state == "finished" else None

    job = wait_until(stopped, timeout=30, what="the slice to stop")
    assert job.result == {"state": "cancelled"}
    assert not client.exists(keys.REEMBED_LEASE), "the lease is let go"
    over_at = time.time()
    time.sleep(1.0)
    embedded = marks(mark)
    assert all(start < over_at for _, start, _, _ in embedded), "no batch after it stopped"
    assert sum(n for *_, n in embedded) < 80, "it stopped before the end"
    assert fresh_store.embeddings.vector_count(gen) == 0, "no batch in flight stored a vector"
    generation = fresh_store.embeddings.get(gen)
    assert generation is not None and generation.status == "cancelled"
    p = Progress.from_dict(generation.progress)
    assert p is not None and p.state == "cancelled" and p.finished
    assert p.outcome == "cancelled by ada: wrong model, sorry"
    [row] = audit_rows(fresh_store)[:1]
    assert (row.action, row.requested_by, row.target) == ("reembed.cancel", "ada", str(gen))
    assert row.detail == {"model": "slow-hashing-32", "reason": "wrong model, sorry",
                          "job_id": started.job_id}  # fmt: skip

    active = fresh_store.embeddings.active()
    assert active is not None and active.model_id == "hashing-64"
    hits = fresh_store.session({"user_id": "tea"}, embedder=OLD).recall("green tea", top_k=3)
    # The old generation's vectors still answer. (Its 80 notes score alike, so a note
    # only the text search brought can tie with them: not every hit need be a vector's.)
    assert len(hits) == 3 and any(h.match in ("vector", "hybrid") for h in hits)
    assert reembed.progress(fresh_store).progress.state == "cancelled"  # type: ignore[union-attr]
    client.close()


def test_a_generation_that_is_not_pending_cannot_be_cancelled(
    fresh_store: Store, redis_url: str
) -> None:
    fill(fresh_store, 5)
    ctx = context(fresh_store, redis_url)
    active = fresh_store.embeddings.active()
    assert active is not None
    before = [(g.id, g.status, g.progress) for g in fresh_store.embeddings.all()]
    vectors = fresh_store.embeddings.vector_count(active.id)
    with pytest.raises(GenerationNotPendingError, match="is active") as refused:
        reembed.cancel(fresh_store, active.id, requested_by="ada", why="oops")
    assert (refused.value.status, refused.value.code) == (409, "generation_not_pending")
    with pytest.raises(NotFoundError):
        reembed.cancel(fresh_store, 999, requested_by="ada")
    first = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:32", requested_by="t")
    with pytest.raises(InvalidRequestError, match="200 characters"):
        reembed.cancel(fresh_store, first.generation_id, requested_by="ada", why="x" * 201)
    assert fresh_store.embeddings.get(first.generation_id).status == "pending"  # type: ignore[union-attr]
    reembed.cancel(fresh_store, first.generation_id, requested_by="ada")
    with pytest.raises(GenerationNotPendingError, match="is cancelled"):
        reembed.cancel(fresh_store, first.generation_id, requested_by="ada")
    second = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:16", requested_by="t")
    third = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:8", requested_by="t")
    with pytest.raises(GenerationNotPendingError, match="is retired"):
        reembed.cancel(fresh_store, second.generation_id, requested_by="ada")

    assert [(g.id, g.status, g.progress) for g in fresh_store.embeddings.all()][3:] == before
    assert fresh_store.embeddings.vector_count(active.id) == vectors
    assert [r.target for r in audit_rows(fresh_store)] == [str(first.generation_id)]
    assert fresh_store.embeddings.get(third.generation_id).status == "pending"  # type: ignore[union-attr]


def test_a_cancel_and_an_activation_in_flight_never_both_win(fresh_store: Store) -> None:
    """Both wait for the generation row's lock (held here as a third party would);
    whichever takes it first wins, and the other refuses, changing nothing."""
    fill(fresh_store, 20)
    embeddings = fresh_store.embeddings
    for dims in (32, 16, 8, 24):
        gen = embeddings.begin(f"hashing-{dims}", dims)
        embeddings.fill(gen.id, HashingEmbedder(dims))
        outcomes: dict[str, Any] = {}

        def cancel(gen_id: int = gen.id, outcomes: dict[str, Any] = outcomes) -> None:
            try:
                outcomes["cancel"] = embeddings.cancel(gen_id, {"state": "cancelled"}).status
            except GenerationNotPendingError:
                outcomes["cancel"] = "refused"

        def activate(gen_id: int = gen.id, outcomes: dict[str, Any] = outcomes) -> None:
            outcomes["activate"] = embeddings.activate(gen_id)

        with fresh_store.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT 1 FROM engram_generations WHERE id = %s FOR UPDATE", (gen.id,))
            threads = [threading.Thread(target=f) for f in (cancel, activate)]
            for t in threads:
                t.start()
            time.sleep(0.5)
            assert outcomes == {}, "both wait for the row"
        for t in threads:
            t.join(timeout=30)
        status = embeddings.get(gen.id).status  # type: ignore[union-attr]
        if outcomes["activate"]:
            assert (outcomes["cancel"], status) == ("refused", "active")
            assert embeddings.vector_count(gen.id) == 20
        else:
            assert (outcomes["cancel"], status) == ("cancelled", "cancelled")
            assert embeddings.vector_count(gen.id) == 0
            assert embeddings.activate(gen.id) is False
        assert [g.status for g in embeddings.all()].count("active") == 1
