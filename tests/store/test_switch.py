"""Writes follow a switch of the active generation; a switch holds writes off briefly."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from engram.store import EmbeddingMismatchError, HashingEmbedder, Operation, Store, WriteResult
from engram.store.errors import EmbedderUnavailableError
from engram.store.vectors.embeddings import _MISSING, VectorItem, _compare_all
from engram.store.vectors.registry import EmbedderRegistry

ADA = {"user_id": "ada"}
OLD, NEW = HashingEmbedder(64), HashingEmbedder(16)


def remember(store: Store, text: str, embedder: Any) -> WriteResult:
    [result] = store.execute([Operation.build("remember", ADA, {"text": text})], embedder)
    assert isinstance(result, WriteResult), result
    return result


def vector_of(dsn: str, record_id: str) -> tuple[int, int]:
    """(generation, dims) of the record's vector in the active generation."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT x.generation_id, vector_dims(x.embedding) FROM engram_vectors x"
            " JOIN engram_generations g ON g.id = x.generation_id AND g.status = 'active'"
            " WHERE x.record_id = %s",
            (record_id,),
        ).fetchone()
    assert row is not None, "no vector in the active generation"
    return row[0], row[1]


class SwitchesWhileEmbedding:
    """The old model's embedder, which moves the store to NEW during its first call: the
    batch in hand was embedded for a generation that is no longer active at commit."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    model_id = OLD.model_id
    dims = OLD.dims

    def embed(self, texts: Sequence[str]) -> Any:
        self.calls += 1
        if self.calls == 1:
            assert self.store.embeddings.reembed(NEW).activated
        return OLD.embed(texts)


def test_a_batch_embedded_just_before_a_switch_is_embedded_again_and_committed(
    fresh_store: Store, fresh_dsn: str
) -> None:
    remember(fresh_store, "Ada prefers tea.", OLD)
    registry = EmbedderRegistry()
    switching = SwitchesWhileEmbedding(fresh_store)
    resolver = registry.resolver(switching)  # OLD's model id resolves to it
    result = remember(fresh_store, "Ada prefers coffee.", resolver)
    generation, dims = vector_of(fresh_dsn, result.records[0].id)
    assert fresh_store.embeddings.active().model_id == NEW.model_id  # type: ignore[union-attr]
    assert (generation, dims) == (fresh_store.embeddings.active().id, 16)  # type: ignore[union-attr]
    assert result.conflict_retries >= 1


def test_a_fixed_embedder_of_the_old_model_is_refused_after_a_switch(fresh_store: Store) -> None:
    remember(fresh_store, "Ada prefers tea.", OLD)
    fresh_store.embeddings.reembed(NEW)
    [result] = fresh_store.execute(
        [Operation.build("remember", ADA, {"text": "Ada prefers coffee."})], OLD
    )
    assert isinstance(result, EmbeddingMismatchError)
    assert fresh_store.scope_revision(ADA) == 1


def test_a_model_this_process_does_not_have_is_refused_with_its_own_error(
    fresh_store: Store,
) -> None:
    remember(fresh_store, "Ada prefers tea.", OLD)
    gen = fresh_store.embeddings.begin("someone-elses-model", 8)
    fresh_store.embeddings.put(
        gen.id,
        [
            VectorItem(p.scope_id, p.record_id, p.revision, p.digest, [1.0] * 8)
            for p in fresh_store.embeddings.pending(gen.id)
        ],
    )
    assert fresh_store.embeddings.activate(gen.id)
    [result] = fresh_store.execute(
        [Operation.build("remember", ADA, {"text": "Ada prefers coffee."})],
        EmbedderRegistry().resolver(OLD),
    )
    assert isinstance(result, EmbedderUnavailableError)
    assert fresh_store.scope_revision(ADA) == 1


class Slow:
    """NEW, slowed: a switch that embeds with it holds writes off meanwhile."""

    model_id = NEW.model_id
    dims = NEW.dims

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.started = threading.Event()

    def embed(self, texts: Sequence[str]) -> Any:
        self.started.set()
        time.sleep(self.delay_s)
        return NEW.embed(texts)


def test_a_switch_holds_writes_off_while_it_fills_the_last_gaps(
    fresh_store: Store, fresh_dsn: str
) -> None:
    remember(fresh_store, "Ada prefers tea.", OLD)
    gen = fresh_store.embeddings.begin(NEW.model_id, NEW.dims)
    slow = Slow(delay_s=1.0)
    switched: list[Any] = []
    switch = threading.Thread(
        target=lambda: switched.append(fresh_store.embeddings.switch(gen.id, slow))
    )
    switch.start()
    assert slow.started.wait(10)
    began = time.monotonic()
    result = remember(fresh_store, "Ada prefers coffee.", EmbedderRegistry().resolver(OLD))
    waited = time.monotonic() - began
    switch.join()
    assert switched[0].activated and switched[0].embedded == 1
    # The write waited for the switch, then was embedded with the new model.
    assert waited > 0.5
    assert vector_of(fresh_dsn, result.records[0].id) == (gen.id, 16)


def test_a_switch_with_more_gaps_than_it_may_hold_writes_for_changes_nothing(
    fresh_store: Store,
) -> None:
    for i in range(3):
        remember(fresh_store, f"Ada note {i}.", OLD)
    gen = fresh_store.embeddings.begin(NEW.model_id, NEW.dims)
    switched = fresh_store.embeddings.switch(gen.id, NEW, max_missing=2)
    assert (switched.activated, switched.embedded, switched.missing) == (False, 0, 3)
    assert fresh_store.embeddings.active().model_id == OLD.model_id  # type: ignore[union-attr]
    assert fresh_store.embeddings.counts(gen.id) == (0, 3)


def test_a_stale_fence_stores_no_vector(fresh_store: Store) -> None:
    from engram.store import Fence, FencedError

    fact = remember(fresh_store, "Ada prefers tea.", OLD).records[0]
    gen = fresh_store.embeddings.begin(NEW.model_id, NEW.dims)
    item = VectorItem(
        fresh_store.scope_id(ADA) or 0, fact.id, fact.revision, fact.digest, [1.0] * 16
    )
    assert fresh_store.embeddings.put(gen.id, [item], fence=Fence("reembed", 5)) == 1
    with pytest.raises(FencedError):
        fresh_store.embeddings.put(gen.id, [item], fence=Fence("reembed", 4))


def vectors_of(dsn: str, generation_id: int) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM engram_vectors WHERE generation_id = %s", (generation_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_writes_and_recall_go_on_while_the_old_generations_vectors_are_deleted(
    fresh_store: Store, fresh_dsn: str
) -> None:
    """Deleting the old generation's vectors takes as long as the store is large: the
    switch releases writes first. Here a row lock stalls that deletion until the end."""
    for i in range(20):
        remember(fresh_store, f"Ada note {i}.", OLD)
    old = fresh_store.embeddings.active()
    assert old is not None
    with psycopg.connect(fresh_dsn) as blocker:
        blocker.execute(
            "SELECT 1 FROM engram_vectors WHERE generation_id = %s LIMIT 1 FOR UPDATE",
            (old.id,),
        )
        results: list[Any] = []
        job = threading.Thread(target=lambda: results.append(fresh_store.embeddings.reembed(NEW)))
        job.start()
        deadline = time.monotonic() + 20
        while (active := fresh_store.embeddings.active()) is None or active.id == old.id:
            assert time.monotonic() < deadline, "the switch waited for the deletion"
            time.sleep(0.05)
        written = remember(fresh_store, "Ada prefers coffee.", NEW)
        hits = fresh_store.session(ADA, embedder=NEW).recall("coffee")
        assert written.records[0].id in [h.record.id for h in hits]
        assert job.is_alive() and vectors_of(fresh_dsn, old.id) == 20  # still deleting
        blocker.rollback()
    job.join(timeout=30)
    assert results and results[0].activated
    assert vectors_of(fresh_dsn, old.id) == 0


def test_what_a_crash_left_of_a_retired_generation_is_deleted_by_the_next_purge(
    fresh_store: Store, fresh_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(5):
        remember(fresh_store, f"Ada note {i}.", OLD)
    old = fresh_store.embeddings.active()
    assert old is not None and fresh_store.embeddings.index_large_scopes(threshold=1)
    with monkeypatch.context() as crash:  # the process dies right after the switch
        crash.setattr(type(fresh_store.embeddings), "purge_retired", lambda self: 0)
        assert fresh_store.embeddings.reembed(NEW).activated
    assert vectors_of(fresh_dsn, old.id) == 5
    hits = fresh_store.session(ADA, embedder=NEW).recall("Ada note 3")
    assert hits[0].record.text == "Ada note 3."  # the new generation's, not the old's

    assert fresh_store.embeddings.purge_retired(batch=2) == 5
    assert vectors_of(fresh_dsn, old.id) == 0
    with psycopg.connect(fresh_dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM engram_vector_indexes WHERE generation_id = %s", (old.id,)
        ).fetchone()
        assert left == (0,)
        assert not conn.execute(
            "SELECT 1 FROM pg_indexes WHERE tablename = 'engram_vectors' AND indexdef LIKE %s",
            (f"%generation_id = {old.id})%",),
        ).fetchall()


def test_the_gap_checks_stay_linear_when_the_statistics_predate_the_pass(
    fresh_store: Store,
) -> None:
    """Statistics taken before a pass say the new generation holds no vector: planned
    from them, the check that every current revision has a vector compared all pairs in
    a nested loop, quadratic in the store (a switch held writes off for 8 minutes at
    100,000 records). The store runs its whole-store comparisons without nested loops."""
    for i in range(0, 3000, 500):
        fresh_store.execute(
            [Operation.build("remember", ADA, {"text": f"note {n}"}) for n in range(i, i + 500)],
            OLD,
        )
    with fresh_store.pool.connection() as conn:
        conn.execute("VACUUM ANALYZE")
    gen = fresh_store.embeddings.begin(NEW.model_id, NEW.dims)
    assert fresh_store.embeddings.fill(gen.id, NEW, 500) == (3000, 0)
    check = f"EXPLAIN SELECT EXISTS (SELECT 1 {_MISSING})"
    with fresh_store.pool.connection() as conn:
        planned_alone = "\n".join(r[0] for r in conn.execute(check, {"g": gen.id}))
        planned_by_store = "\n".join(r[0] for r in _compare_all(conn, check, {"g": gen.id}))
    assert "Nested Loop Anti Join" in planned_alone  # the hazard is there
    assert "Nested Loop" not in planned_by_store
    assert fresh_store.embeddings.counts(gen.id) == (3000, 3000)
    assert fresh_store.embeddings.switch(gen.id, NEW).activated
