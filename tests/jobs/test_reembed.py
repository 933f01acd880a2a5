"""The re-embedding job, run in this process (RQ burst mode): progress, slices,
a second model, records that keep moving, failures."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rq.job import JobStatus
from rq.registry import ScheduledJobRegistry
from rq.scheduler import RQScheduler

from engram.jobs import keys, queues, reembed
from engram.jobs.context import JobContext
from engram.jobs.progress import Progress
from engram.store import HashingEmbedder, Operation, Store
from engram.store.errors import EmbedderLoadError, InvalidRequestError
from engram.store.vectors.embeddings import Switched
from engram.store.vectors.registry import EmbedderRegistry, parse_plugins
from engram.web import rqjobs
from tests.embedder_faults import FAULTY_PLUGINS
from tests.helpers import bytes_hold, marker_text, redis_values
from tests.jobs_fixtures import context, jobs_of, marks, run_burst

OLD = HashingEmbedder(64)


def fill(store: Store, count: int, scopes: int = 5, text: str = "note {i} about tea") -> list[str]:
    ops = [
        Operation.build("remember", {"user_id": f"u{i % scopes}"}, {"text": text.format(i=i)})
        for i in range(count)
    ]
    ids = []
    for start in range(0, count, 500):
        for result in store.execute(ops[start : start + 500], OLD):
            assert not isinstance(result, Exception), result
            ids.append(result.records[0].id)
    return ids


def current(store: Store) -> Progress:
    status = reembed.progress(store)
    assert status is not None
    return status.progress


def every_current_revision_has_a_vector(store: Store, generation_id: int) -> bool:
    done, total = store.embeddings.counts(generation_id)
    return done == total


def test_a_reembed_runs_to_activation_with_its_progress_on_the_generation(
    fresh_store: Store, redis_url: str
) -> None:
    fill(fresh_store, 300)
    ctx = context(fresh_store, redis_url)
    started = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:32", requested_by="ada")
    waiting = current(fresh_store)
    assert (waiting.state, waiting.done, waiting.total, waiting.job_id) == (
        "waiting",
        0,
        300,
        started.job_id,
    )
    run_burst(ctx, redis_url)

    status = reembed.progress(fresh_store)
    assert status is not None and status.status == "active" and status.model_id == "hashing-32"
    p = status.progress
    assert (p.state, p.done, p.total, p.skipped, p.errors, p.requested_by) == (
        "activated",
        300,
        300,
        0,
        0,
        "ada",
    )
    assert p.rate_per_s > 0 and p.eta_s == 0.0
    assert fresh_store.embeddings.active().id == started.generation_id  # type: ignore[union-attr]
    assert every_current_revision_has_a_vector(fresh_store, started.generation_id)
    job = rqjobs.get(ctx.client, started.job_id)
    assert (
        job is not None and job.state == "finished" and job.arguments == repr(started.generation_id)
    )
    assert job.result["state"] == "activated"


def test_start_refuses_an_unknown_model_and_the_active_one_and_joins_a_running_one(
    fresh_store: Store, redis_url: str
) -> None:
    fill(fresh_store, 10)
    ctx = context(fresh_store, redis_url)
    with pytest.raises(InvalidRequestError, match="unknown embedder"):
        reembed.start(fresh_store, ctx.client, ctx.registry, "nope", requested_by="t")
    with pytest.raises(InvalidRequestError, match="already the active"):
        reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:64", requested_by="t")
    assert [g.status for g in fresh_store.embeddings.all()] == ["active"]
    first = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:32", requested_by="a")
    again = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:32", requested_by="b")
    assert again == reembed.Started(first.generation_id, first.job_id, already_running=True)
    assert queues.queue(ctx.client, keys.REEMBED_QUEUE).count == 1


def test_a_model_that_cannot_load_is_refused_before_a_generation_is_made(
    fresh_store: Store, redis_url: str
) -> None:
    fill(fresh_store, 3)
    ctx = context(fresh_store, redis_url)
    registry = EmbedderRegistry(parse_plugins(FAULTY_PLUGINS))
    with pytest.raises(EmbedderLoadError, match=r"unloadable\.onnx is missing") as missing:
        reembed.start(fresh_store, ctx.client, registry, "unloadable", requested_by="t")
    assert missing.value.status == 422 and missing.value.code == "embedder_cannot_load"
    with pytest.raises(EmbedderLoadError, match="RuntimeError: no GPU here"):
        reembed.start(fresh_store, ctx.client, registry, "nofactory", requested_by="t")
    assert [g.status for g in fresh_store.embeddings.all()] == ["active"]
    assert queues.queue(ctx.client, keys.REEMBED_QUEUE).count == 0


def test_a_second_model_started_meanwhile_retires_the_pending_generation(
    fresh_store: Store, redis_url: str
) -> None:
    fill(fresh_store, 50)
    ctx = context(fresh_store, redis_url)
    first = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:32", requested_by="t")
    second = reembed.start(fresh_store, ctx.client, ctx.registry, "hashing:16", requested_by="t")
    assert fresh_store.embeddings.get(first.generation_id).status == "retired"  # type: ignore[union-attr]
    run_burst(ctx, redis_url)
    retired = Progress.from_dict(fresh_store.embeddings.get(first.generation_id).progress)  # type: ignore[union-attr,arg-type]
    assert retired is not None and retired.state == "superseded"
    assert retired.superseded_by == second.generation_id
    assert retired.outcome == f"superseded by generation {second.generation_id}"
    assert rqjobs.get(ctx.client, first.job_id).result == {  # type: ignore[union-attr]
        "state": "superseded",
        "by": second.generation_id,
    }
    assert fresh_store.embeddings.active().id == second.generation_id  # type: ignore[union-attr]


def test_a_reembed_goes_on_in_slices_without_embedding_a_record_twice(
    fresh_store: Store, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = tmp_path / "embedded"
    monkeypatch.setenv("ENGRAM_TEST_EMBED_MARK", str(mark))
    monkeypatch.setenv("ENGRAM_TEST_EMBED_DELAY_S", "0.02")
    fill(fresh_store, 400)
    ctx = context(
        fresh_store, redis_url, ENGRAM_REEMBED_SLICE="0.2s", ENGRAM_REEMBED_BATCH_SIZE="20"
    )
    started = reembed.start(fresh_store, ctx.client, ctx.registry, "slow", requested_by="t")
    assert [n for *_, n in marks(mark)] == [1], "start tried the model on one text"
    mark.unlink()
    run_burst(ctx, redis_url)
    p = current(fresh_store)
    assert (p.state, p.done, p.total) == ("activated", 400, 400)
    assert p.job_id != started.job_id, "later slices carried it"
    finished = jobs_of(ctx.client, reembed.run_slice)
    assert len(finished) >= 3 and all(j.get_status() == "finished" for j in finished)
    assert sum(n for _, _, _, n in marks(mark)) == 400


class Moving:
    """The target model, revising two records at each call while ``moves`` last: each
    pass ends with more gaps than a switch may hold writes for (batches of 1)."""

    model_id = "slow-hashing-32"
    dims = 32

    def __init__(self, store: Store, record_ids: Sequence[str], moves: int) -> None:
        self.store, self.record_ids, self.moves = store, record_ids, moves
        self.inner = HashingEmbedder(32)

    def embed(self, texts: Sequence[str]) -> Any:
        if self.moves > 0:
            self.moves -= 1
            for rid in self.record_ids:
                self.store.session({"user_id": "u0"}).revise(rid, text=f"moved {time.monotonic()}")
        return self.inner.embed(texts)


def run_due(ctx: JobContext) -> None:
    """RQ's scheduler, once: move the delayed jobs that are due to their queue."""
    scheduler = RQScheduler(keys.QUEUES, connection=ctx.client)
    scheduler.acquire_locks()
    scheduler.enqueue_scheduled_jobs()
    scheduler.release_locks()


def test_records_that_keep_moving_leave_it_waiting_then_it_resumes(
    fresh_store: Store, redis_url: str
) -> None:
    ids = fill(fresh_store, 2, scopes=1)
    # A switch holds writes off for one record at most (and so never calls the
    # embedder that writes, which would wait for itself).
    ctx = context(
        fresh_store,
        redis_url,
        ENGRAM_REEMBED_BATCH_SIZE="1",
        ENGRAM_REEMBED_SWITCH_HOLD="0.001s",
        ENGRAM_REEMBED_RESUME_AFTER="1h",
    )
    moving = Moving(fresh_store, ids, moves=50)
    ctx.registry.add(moving)
    started = reembed.start(fresh_store, ctx.client, ctx.registry, "slow", requested_by="t")
    run_burst(ctx, redis_url)
    p = current(fresh_store)
    assert (p.state, p.pass_) == ("waiting", 1)
    assert p.message is not None and "changed during the last pass" in p.message
    assert p.skipped >= 6
    scheduled = ScheduledJobRegistry(queue=queues.queue(ctx.client, keys.REEMBED_QUEUE))
    assert scheduled.get_job_ids() == [p.job_id]
    due = scheduled.get_scheduled_time(p.job_id)
    assert 3500 < (due - datetime.now(UTC)).total_seconds() <= 3600
    assert fresh_store.embeddings.active().model_id == "hashing-64"  # type: ignore[union-attr]

    moving.moves = 0  # the records settle; and the hour is up
    scheduled.schedule(queues.fetch(ctx.client, p.job_id), datetime.now(UTC))  # type: ignore[arg-type]
    run_due(ctx)
    run_burst(ctx, redis_url)
    p = current(fresh_store)
    assert p.state == "activated"
    assert fresh_store.embeddings.active().id == started.generation_id  # type: ignore[union-attr]


class Interleaved:
    """The target model, with writes landing between the batches of its passes: before
    each batch one of the first records (behind the pass's cursor) is revised and a
    new one remembered, and once a pass is over, one more of each right before the
    switch takes its hold (``writing_before``). Every switch so finds gaps that only
    its last fill, made with writes held off, can close. Nothing is written while the
    switch holds writes off: it would wait for itself."""

    model_id = "slow-hashing-32"
    dims = 32

    def __init__(self, store: Store, record_ids: Sequence[str]) -> None:
        self.session = store.session({"user_id": "u0"}, embedder=OLD)
        self.first = sorted(record_ids)[:3]
        self.inner = HashingEmbedder(32)
        self.holding = False
        self.revised: dict[str, str] = {}
        self.remembered: list[str] = []
        self.switched: list[Switched] = []

    def embed(self, texts: Sequence[str]) -> Any:
        if not self.holding:
            self.write()
        return self.inner.embed(texts)

    def write(self) -> None:
        n = len(self.remembered)
        rid = self.first[n % len(self.first)]
        self.revised[rid] = f"revised {n} to mention coffee"
        self.session.revise(rid, text=self.revised[rid])
        self.remembered.append(
            self.session.remember(f"written {n} during the passes").records[0].id
        )

    def writing_before(self, switch: Any) -> Any:
        def switched(*args: Any, **kwargs: Any) -> Any:
            self.write()
            self.holding = True
            try:
                self.switched.append(switch(*args, **kwargs))
            finally:
                self.holding = False
            return self.switched[-1]

        return switched


def current_vectors(store: Store, generation_id: int) -> dict[str, tuple[str, bool, Any]]:
    """Every current record's (text, whether its vector in the generation is of its
    current revision and text, the vector or None)."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT r.id, v.text, x.revision = r.revision AND x.digest = v.digest,"
            " x.embedding::text FROM engram_records r"
            " JOIN engram_revisions v ON v.record_id = r.id AND v.revision = r.revision"
            " LEFT JOIN engram_vectors x ON x.record_id = r.id AND x.generation_id = %s",
            (generation_id,),
        ).fetchall()
        [(strays,)] = conn.execute(
            "SELECT count(*) FROM engram_vectors x WHERE x.generation_id = %s"
            " AND NOT EXISTS (SELECT 1 FROM engram_records r WHERE r.id = x.record_id)",
            (generation_id,),
        ).fetchall()
    assert strays == 0, "a vector of no current record"
    return {
        rid: (text, bool(fresh), None if vector is None else json.loads(vector))
        for rid, text, fresh, vector in rows
    }


def test_writes_landing_during_the_passes_are_embedded_by_the_switch_under_its_hold(
    fresh_store: Store, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = fill(fresh_store, 100, scopes=1)
    ctx = context(
        fresh_store,
        redis_url,
        ENGRAM_REEMBED_BATCH_SIZE="20",
        ENGRAM_REEMBED_RESUME_AFTER="1h",
    )
    target = Interleaved(fresh_store, ids)
    ctx.registry.add(target)
    embeddings = fresh_store.embeddings
    monkeypatch.setattr(embeddings, "switch", target.writing_before(embeddings.switch))
    started = reembed.start(fresh_store, ctx.client, ctx.registry, "slow", requested_by="t")
    run_burst(ctx, redis_url)

    p = current(fresh_store)
    # Writes landed during the pass, and before the switch: its last fill embedded the
    # record revised and the one remembered then, at least.
    assert len(target.remembered) > len(target.switched) >= 1
    assert target.switched[-1].activated and target.switched[-1].embedded >= 2
    assert p.state == "activated", p.message
    active = fresh_store.embeddings.active()
    assert active is not None and active.id == started.generation_id
    assert (active.model_id, active.dims) == (target.model_id, target.dims)
    found = current_vectors(fresh_store, active.id)
    assert len(found) == 100 + len(target.remembered)
    assert set(target.remembered) <= set(found)
    for rid, (text, fresh, vector) in found.items():
        assert vector is not None and fresh, f"{rid} has no vector of its current revision"
        assert vector == pytest.approx(target.inner.embed([text])[0].tolist(), abs=1e-6)
    for rid, text in target.revised.items():
        assert found[rid][0] == text
    assert (p.done, p.total) == (len(found), len(found))


def test_a_slice_that_keeps_failing_marks_it_failed_and_rq_keeps_no_text(
    fresh_store: Store, redis_url: str
) -> None:
    marker = marker_text()
    fill(fresh_store, 3, text=f"secret {marker} number {{i}}")
    ctx = context(fresh_store, redis_url, ENGRAM_REEMBED_RETRY="off")
    started = reembed.start(
        fresh_store,
        ctx.client,
        ctx.registry,
        "leaky",
        requested_by="t",
        settings=ctx.settings.reembed,
    )
    run_burst(ctx, redis_url)
    p = current(fresh_store)
    # Each batch that fails is counted; the switch at the end of the pass fails the slice.
    assert p.state == "failed" and p.errors >= 2
    # Its message quotes the text: the root cause keeps its type only.
    assert p.message == "ValueError (its message quoted a record's text and is not kept)"
    job = rqjobs.get(ctx.client, started.job_id)
    assert job is not None and job.state == JobStatus.FAILED
    assert job.error == f"engram.jobs.errors.JobFailedError: re-embedding slice failed: {p.message}"
    assert not bytes_hold(redis_values(ctx.client), marker)
    assert marker not in json.dumps(fresh_store.embeddings.get(started.generation_id).progress)  # type: ignore[union-attr]
