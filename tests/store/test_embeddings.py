"""Embedding generations and reembed, as seed 000 describes them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg
import pytest

from engram.store import EmbeddingMismatchError, HashingEmbedder, KeywordEmbedder, Store
from engram.store.vectors.embeddings import VectorItem
from tests.helpers import CountingEmbedder

V1 = KeywordEmbedder("keywords-1", ["tea", "coffee"])
V2 = KeywordEmbedder("keywords-2", ["tea", "coffee", "green"])
ADA = {"user_id": "ada"}


def test_seed_example_reembed_keywords_1_to_2(fresh_store: Store) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    memory.remember("Ada prefers green tea.")
    assert fresh_store.embeddings.active().model_id == "keywords-1"  # type: ignore[union-attr]

    other = fresh_store.session(ADA, embedder=V2)
    with pytest.raises(EmbeddingMismatchError):
        other.recall("tea")

    job = memory.reembed(V2)
    assert (job.generation, job.embedded, job.skipped, job.activated) == (2, 1, 0, True)
    assert fresh_store.embeddings.active().model_id == "keywords-2"  # type: ignore[union-attr]
    assert len(other.recall("green tea")) == 1
    assert memory.embedder is V2, "after activation the session uses the new embedder"
    assert [g.status for g in fresh_store.embeddings.all()] == ["active", "retired"]


def test_a_store_without_vectors_costs_no_embedding_call(fresh_store: Store) -> None:
    counting = CountingEmbedder(V1)
    plain = fresh_store.session(ADA)
    plain.remember("Ada prefers tea.")
    hits = fresh_store.session(ADA, embedder=counting).recall("tea")
    assert counting.calls == 0
    assert [h.match for h in hits] == ["lexical"]
    assert fresh_store.embeddings.active() is None


def test_records_without_a_vector_are_found_by_text_never_scored_as_zero(
    fresh_store: Store,
) -> None:
    with_vectors = fresh_store.session(ADA, embedder=V1)
    with_vectors.remember("Ada prefers tea.")
    fresh_store.session(ADA).remember("Ada once tried tea from Assam.")
    hits = with_vectors.recall("tea")
    by_text = {h.record.text: h.match for h in hits}
    assert by_text == {"Ada prefers tea.": "hybrid", "Ada once tried tea from Assam.": "lexical"}


def test_a_zero_query_vector_enters_no_vector_list(fresh_store: Store) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    memory.remember("Ada prefers tea.")
    memory.remember("Nothing in common.")  # a zero vector: its distance is undefined
    assert memory.recall("unrelated words") == []
    assert [(h.record.text, h.match) for h in memory.recall("tea")] == [
        ("Ada prefers tea.", "hybrid")
    ]


def test_a_text_change_drops_the_old_vector_and_retract_keeps_it(
    fresh_store: Store, fresh_dsn: str
) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    fact = memory.remember("Ada prefers tea.").records[0]

    def vector() -> tuple[int, str, list[float]]:
        with psycopg.connect(fresh_dsn) as conn:
            row = conn.execute(
                "SELECT revision, digest, embedding::text FROM engram_vectors WHERE record_id = %s",
                (fact.id,),
            ).fetchone()
        assert row is not None
        return row[0], row[1], [float(x) for x in row[2].strip("[]").split(",")]

    assert vector()[2] == [1.0, 0.0]
    second = memory.revise(fact.id, text="Ada prefers coffee.").records[0]
    assert vector() == (2, second.digest, [0.0, 1.0])
    memory.retract(fact.id)
    assert vector() == (3, second.digest, [0.0, 1.0])
    memory.revise(fact.id, kind="preference")
    assert vector() == (4, second.digest, [0.0, 1.0])


def test_generation_api_begin_pending_put_activate(fresh_store: Store) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    a = memory.remember("Ada prefers tea.").records[0]
    b = memory.remember("Ada prefers coffee.").records[0]
    emb = fresh_store.embeddings
    ada_id = fresh_store.scope_id(ADA)
    assert ada_id is not None

    gen = emb.begin("keywords-2", 3)
    assert gen.status == "pending"
    assert emb.begin("keywords-2", 3).id == gen.id, "the same model resumes its generation"
    pending = emb.pending(gen.id)
    assert sorted(p.record_id for p in pending) == sorted([a.id, b.id])

    first = next(p for p in pending if p.record_id == a.id)
    assert (
        emb.put(
            gen.id,
            [
                VectorItem(
                    first.scope_id, first.record_id, first.revision, first.digest, [1.0, 0.0, 0.0]
                )
            ],
        )
        == 1
    )
    assert emb.activate(gen.id) is False, "a current revision still lacks a vector"
    assert emb.active().model_id == "keywords-1"  # type: ignore[union-attr]

    with pytest.raises(EmbeddingMismatchError):
        emb.put(gen.id, [VectorItem(ada_id, b.id, 1, b.digest, [1.0, 0.0])])

    # A vector for an old revision is never applied.
    memory.revise(b.id, text="Ada prefers black coffee.")
    assert emb.put(gen.id, [VectorItem(ada_id, b.id, 1, b.digest, [0.0, 1.0, 0.0])]) == 0
    [left] = emb.pending(gen.id)
    assert (left.record_id, left.revision) == (b.id, 2)
    assert emb.put(gen.id, [VectorItem(ada_id, b.id, 2, left.digest, [0.0, 1.0, 0.0])]) == 1
    assert emb.activate(gen.id) is True
    assert emb.active().id == gen.id  # type: ignore[union-attr]
    assert emb.activate(gen.id) is False, "already active: nothing to do"


def test_begin_with_another_model_retires_the_pending_generation(
    fresh_store: Store, fresh_dsn: str
) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    fact = memory.remember("Ada prefers tea.").records[0]
    emb = fresh_store.embeddings
    ada_id = fresh_store.scope_id(ADA)
    assert ada_id is not None
    abandoned = emb.begin("keywords-2", 3)
    emb.put(abandoned.id, [VectorItem(ada_id, fact.id, 1, fact.digest, [1.0, 0.0, 0.0])])
    newer = emb.begin("keywords-3", 4)
    assert emb.get(abandoned.id).status == "retired"  # type: ignore[union-attr]
    with psycopg.connect(fresh_dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM engram_vectors WHERE generation_id = %s", (abandoned.id,)
        ).fetchone()
    assert left == (0,)
    # A retired generation lists nothing, stores nothing and never becomes active.
    assert emb.pending(abandoned.id) == []
    gone = VectorItem(ada_id, fact.id, 1, fact.digest, [1.0, 0.0, 0.0])
    assert emb.put(abandoned.id, [gone]) == 0
    assert emb.activate(abandoned.id) is False
    assert emb.pending(newer.id) and emb.activate(newer.id) is False
    assert emb.pending(9999) == [] and emb.put(9999, []) == 0 and emb.activate(9999) is False


def test_a_replaced_generation_never_becomes_active_again(fresh_store: Store) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    memory.remember("Ada prefers tea.")
    first = fresh_store.embeddings.active()
    assert memory.reembed(V2).activated
    back = memory.reembed(V1)
    assert back.activated and back.generation not in (first.id,)  # type: ignore[union-attr]
    assert fresh_store.embeddings.get(first.id).status == "retired"  # type: ignore[union-attr]
    assert fresh_store.embeddings.activate(first.id) is False  # type: ignore[union-attr]


class MovingTarget:
    """An embedder that revises records while the job runs, for the first few batches."""

    def __init__(self, store: Store, record_ids: Sequence[str], moves: int) -> None:
        self.store = store
        self.record_ids = record_ids
        self.moves = moves
        self.inner = V2

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dims(self) -> int:
        return self.inner.dims

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.moves > 0:
            self.moves -= 1
            for record_id in self.record_ids:
                self.store.session(ADA).revise(record_id, text=f"Ada prefers tea #{self.moves}.")
        return self.inner.embed(texts)


def test_a_record_that_moves_during_the_job_is_embedded_again_from_its_new_text(
    fresh_store: Store,
) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    fact = memory.remember("Ada prefers coffee.").records[0]
    job = fresh_store.embeddings.reembed(MovingTarget(fresh_store, [fact.id], moves=1))
    assert (job.embedded, job.skipped, job.activated) == (1, 1, True)
    hits = fresh_store.session(ADA, embedder=V2).recall("tea")
    assert [(h.record.text, h.match) for h in hits] == [("Ada prefers tea #0.", "hybrid")]


def test_records_that_keep_moving_leave_the_job_unactivated(fresh_store: Store) -> None:
    """More gaps at the end of each pass than a switch holds writes off for (one batch)."""
    memory = fresh_store.session(ADA, embedder=V1)
    ids = [memory.remember(f"Ada prefers coffee {i}.").records[0].id for i in range(2)]
    job = fresh_store.embeddings.reembed(MovingTarget(fresh_store, ids, moves=10), batch_size=1)
    assert (job.activated, job.embedded, job.skipped) == (False, 0, 6)
    assert fresh_store.embeddings.active().model_id == "keywords-1"  # type: ignore[union-attr]
    # Calling it again continues the same pending generation.
    again = fresh_store.embeddings.reembed(V2)
    assert again.generation == job.generation and again.activated


def test_reembed_covers_every_scope_in_batches(fresh_store: Store) -> None:
    for user in range(5):
        mem = fresh_store.session({"user_id": f"u{user}"}, embedder=V1)
        for i in range(7):
            mem.remember(f"tea note {i}")
    counting = CountingEmbedder(V2)
    job = fresh_store.embeddings.reembed(counting, batch_size=10)
    assert (job.embedded, job.activated) == (35, True)
    assert counting.calls == 4
    progress = fresh_store.embeddings.get(job.generation).progress  # type: ignore[union-attr]
    assert progress == {"pass": 1, "embedded": 35, "skipped": 0}


def test_writes_with_a_stale_embedder_are_refused_not_left_without_vectors(
    fresh_store: Store,
) -> None:
    memory = fresh_store.session(ADA, embedder=V1)
    memory.remember("Ada prefers tea.")
    memory.reembed(V2)
    stale = fresh_store.session(ADA, embedder=V1)
    with pytest.raises(EmbeddingMismatchError):
        stale.remember("Ada prefers coffee.")
    assert fresh_store.scope_revision(ADA) == 1
    assert np.asarray(V2.embed(["tea"])).shape == (1, 3)


def test_a_stale_progress_never_overwrites_a_switch_made_since(fresh_store: Store) -> None:
    """A watchdog that read a re-embedding's progress before its switch must not put it
    back over the progress the switch wrote (the re-embedding would look unfinished)."""
    fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64)).remember("tea")
    pending = fresh_store.embeddings.begin("hashing-32", 32)
    stale = {"state": "running", "job_id": "old"}
    assert fresh_store.embeddings.set_progress(pending.id, stale, if_pending=True)
    fresh_store.embeddings.reembed(HashingEmbedder(32))  # fills it and switches
    switched = fresh_store.embeddings.get(pending.id)
    assert switched is not None and switched.status == "active"
    assert not fresh_store.embeddings.set_progress(pending.id, stale, if_pending=True)
    assert fresh_store.embeddings.get(pending.id) == switched
