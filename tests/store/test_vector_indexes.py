"""Approximate indexes off the write path: vectors written fresh, settled in bulk by a
job, and recall merging the settled part (HNSW) with the fresh part (exact) so that
nothing is lost, duplicated, leaked across scopes, or kept after a forget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Collection
from typing import Any

import numpy as np
import psycopg
import pytest

from engram.store import HashingEmbedder, Operation, Scope, Store
from engram.store.read.recall import RecallQuery, recall, recall_context
from engram.store.vectors import vector_indexes
from tests.redis_fixtures import REPO, wait_until
from tests.web_fixtures import _die_with_parent

EMBEDDER = HashingEmbedder(64)


def texts_for(tag: str, count: int, start: int = 0) -> list[str]:
    # Texts of their own words: vectors far enough apart for an approximate search.
    return [f"{tag}{i} x{i * 7919 % 10007} y{i * 104729 % 20011}" for i in range(start, count)]


def write(store: Store, scope: dict[str, str], texts: list[str]) -> dict[str, str]:
    """The texts remembered in ``scope``; record id -> text."""
    ids = {}
    for i in range(0, len(texts), 1000):
        chunk = texts[i : i + 1000]
        ops = [Operation.build("remember", scope, {"text": t}) for t in chunk]
        for text, result in zip(chunk, store.execute(ops, EMBEDDER), strict=True):
            assert not isinstance(result, Exception), result
            ids[result.records[0].id] = text
    return ids


def parts(dsn: str, scope: dict[str, str]) -> Counter[bool]:
    """The scope's vector rows by settled."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT x.settled, count(*) FROM engram_vectors x JOIN engram_scopes s"
            " ON s.id = x.scope_id WHERE s.key = %s GROUP BY 1",
            (Scope.of(scope).key,),
        ).fetchall()
    return Counter({settled: n for settled, n in rows})


def vector_hits(store: Store, scope: dict[str, str], text: str, top_k: int = 10) -> list[Any]:
    """The vector list alone (no query text), through the scope's approximate index
    if it has one: the hits' records."""
    with store.pool.connection() as conn:
        context = recall_context(conn, Scope.of(scope).key)
        q = context.query(None, EMBEDDER.embed([text])[0], top_k)
        return [h.record for h in recall(conn, q)]


def exact_hits(store: Store, scope: dict[str, str], text: str, top_k: int = 10) -> list[str]:
    with store.pool.connection() as conn:
        context = recall_context(conn, Scope.of(scope).key)
        q = context.query(None, EMBEDDER.embed([text])[0], top_k)
        exact = RecallQuery(**{**_fields(q), "hnsw": False})
        return [h.record.id for h in recall(conn, exact)]


def _fields(q: RecallQuery) -> dict[str, Any]:
    return {name: getattr(q, name) for name in RecallQuery.__dataclass_fields__}


def uses_index(store: Store, scope: dict[str, str]) -> bool:
    with store.pool.connection() as conn:
        return recall_context(conn, Scope.of(scope).key).hnsw


def check_found_once(
    store: Store,
    scope: dict[str, str],
    sample: dict[str, str],
    texts: dict[str, str],
    fresh: Collection[str] = (),
) -> None:
    """Each sampled text finds its own record first and no record twice; and every fresh
    record the exact search ranks in its ten (strictly nearer than its tenth) is found:
    the fresh part is searched exactly, and the settled part can only miss some of its
    own (``texts`` are all the scope's, to measure the distances)."""
    for record_id, text in sample.items():
        found = [r.id for r in vector_hits(store, scope, text)]
        assert found[0] == record_id, text
        assert len(set(found)) == len(found) == 10
        exact = exact_hits(store, scope, text)
        near = dict(zip(exact, distances(text, exact, texts), strict=True))
        tenth = max(near.values())
        assert {i for i, d in near.items() if i in fresh and d < tenth} <= set(found)


def distances(query: str, ids: list[str], texts: dict[str, str]) -> list[float]:
    """The cosine distances of records from a query, in their order."""
    vectors = EMBEDDER.embed([query] + [texts[i] for i in ids])
    q, found = vectors[0], vectors[1:]
    cos = found @ q / (np.linalg.norm(found, axis=1) * np.linalg.norm(q))
    return [round(float(1 - c), 5) for c in cos]


def test_fresh_and_settled_vectors_are_each_found_once(fresh_store: Store, fresh_dsn: str) -> None:
    scope = {"user_id": "grown"}
    settled = write(fresh_store, scope, texts_for("s", 400))
    assert parts(fresh_dsn, scope) == {False: 400}  # written fresh
    assert fresh_store.embeddings.index_large_scopes(threshold=300)
    assert parts(fresh_dsn, scope) == {True: 400}
    fresh = write(fresh_store, scope, texts_for("f", 60))
    assert parts(fresh_dsn, scope) == {True: 400, False: 60}
    assert uses_index(fresh_store, scope)
    sample = {**dict(list(settled.items())[::20]), **dict(list(fresh.items())[::3])}
    texts = {**settled, **fresh}
    check_found_once(fresh_store, scope, sample, texts, set(fresh))  # before the job

    # A run takes about max_rows from a scope; the next goes on.
    assert vector_indexes.settle_fresh(fresh_store.pool, batch=10, max_rows=20) == 20
    assert fresh_store.embeddings.settle_fresh() == 40
    assert parts(fresh_dsn, scope) == {True: 460}
    assert fresh_store.embeddings.settle_fresh() == 0
    check_found_once(fresh_store, scope, sample, texts)  # after it
    # Hybrid recall too (the vector list fused with the lexical one).
    mem = fresh_store.session(scope, embedder=EMBEDDER)
    for record_id, text in sample.items():
        assert next(h.record.id for h in mem.recall(text)) == record_id


def test_an_update_makes_a_settled_vector_fresh(fresh_store: Store, fresh_dsn: str) -> None:
    """A settled row updated in place would be inserted into the graph by the writer:
    it becomes fresh instead, and is found in the fresh part."""
    scope = {"user_id": "kept"}
    ids = write(fresh_store, scope, texts_for("k", 300))
    assert fresh_store.embeddings.index_large_scopes(threshold=300)
    record_id, text = next(iter(ids.items()))
    mem = fresh_store.session(scope, embedder=EMBEDDER)
    mem.revise(record_id, kind="preference")
    assert parts(fresh_dsn, scope) == {True: 299, False: 1}
    assert next(r.id for r in vector_hits(fresh_store, scope, text)) == record_id


def test_forgotten_and_retracted_records_are_gone_from_both_parts(
    fresh_store: Store, fresh_dsn: str
) -> None:
    scope = {"user_id": "forgets"}
    settled = write(fresh_store, scope, texts_for("s", 300))
    assert fresh_store.embeddings.index_large_scopes(threshold=300)
    fresh = write(fresh_store, scope, texts_for("f", 30))
    mem = fresh_store.session(scope, embedder=EMBEDDER)
    (s_forget, s_retract, *_), (f_forget, f_retract, *_) = list(settled), list(fresh)
    for record_id in (s_forget, f_forget):
        mem.forget(record_id)
    for record_id in (s_retract, f_retract):
        mem.retract(record_id)
    with psycopg.connect(fresh_dsn) as conn:
        left = conn.execute(
            "SELECT record_id, settled FROM engram_vectors WHERE record_id = ANY(%s)",
            ([s_forget, f_forget],),
        ).fetchall()
    assert left == []  # a forget leaves no vector, settled or fresh
    gone = {s_forget, f_forget, s_retract, f_retract}
    texts = {**settled, **fresh}
    for record_id in gone:
        for found in (
            [r.id for r in vector_hits(fresh_store, scope, texts[record_id], top_k=50)],
            [h.record.id for h in mem.recall(texts[record_id], top_k=50)],
        ):
            assert found and record_id not in found
    # ...through both parts after the job too (the retracted rows were made fresh).
    fresh_store.embeddings.settle_fresh()
    assert parts(fresh_dsn, scope) == {True: 328}
    for record_id in gone:
        found = [r.id for r in vector_hits(fresh_store, scope, texts[record_id], top_k=50)]
        assert found and record_id not in found


def test_no_hit_from_another_scope(fresh_store: Store) -> None:
    """Two scopes holding the same texts, each with both parts: every hit is in the
    scope asked."""
    scopes = [{"user_id": "left"}, {"user_id": "right"}]
    for scope in scopes:
        write(fresh_store, scope, texts_for("t", 300))
    assert len(fresh_store.embeddings.index_large_scopes(threshold=300)) == 2
    for scope in scopes:
        write(fresh_store, scope, texts_for("t", 330, start=300))
    texts = texts_for("t", 330)[::7]
    for scope in scopes:
        assert uses_index(fresh_store, scope)
        mem = fresh_store.session(scope, embedder=EMBEDDER)
        for text in texts:
            records = vector_hits(fresh_store, scope, text, top_k=50)
            records += [h.record for h in mem.recall(text, top_k=50)]
            assert len(records) > 50
            assert {r.scope for r in records} == {Scope.of(scope)}


_SETTLE = """
import sys
from engram.store import Store
from engram.store.vectors import vector_indexes
with Store.connect(sys.argv[1]) as store:
    if sys.argv[2] == "build":
        vector_indexes.index_large_scopes(store.pool, threshold=1000, batch=5000)
    else:
        vector_indexes.settle_fresh(store.pool, batch=int(sys.argv[3]))
"""


def test_an_index_build_gets_the_memory_its_graph_needs(
    fresh_store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the floor, the memory is what the estimate gives for 3,000 vectors (5 MB):
    # pgvector builds the whole graph in it, and says nothing.
    monkeypatch.setattr(vector_indexes, "BUILD_MEMORY_FLOOR_MB", 1)
    write(fresh_store, {"user_id": "fits"}, texts_for("f", 3000))
    with caplog.at_level("WARNING", logger=vector_indexes.__name__):
        assert fresh_store.embeddings.index_large_scopes(threshold=1000)
    assert vector_indexes.build_memory_mb(3000, EMBEDDER.dims) < 10
    assert not [r for r in caplog.records if "outgrew" in r.getMessage()]


def test_a_graph_that_outgrows_its_build_memory_is_a_warning(
    fresh_store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 MB (PostgreSQL's least) holds a few hundred elements: the rest go in one at a time.
    monkeypatch.setattr(vector_indexes, "build_memory_mb", lambda vectors, dims: 1)
    write(fresh_store, {"user_id": "outgrows"}, texts_for("o", 3000))
    with caplog.at_level("WARNING", logger=vector_indexes.__name__):
        assert fresh_store.embeddings.index_large_scopes(threshold=1000)
    warned = [r for r in caplog.records if "outgrew" in r.getMessage()]
    assert len(warned) == 1 and warned[0].memory_mb == 1  # type: ignore[attr-defined]


def settle_process(dsn: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _SETTLE, dsn, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=_die_with_parent,
    )


def index_state(dsn: str) -> list[tuple[str, bool, bool]]:
    """Every HNSW index on the vectors: name, valid, registered."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT c.relname, i.indisvalid, EXISTS (SELECT 1 FROM engram_vector_indexes r"
            " WHERE r.index_name = c.relname) FROM pg_index i JOIN pg_class c"
            " ON c.oid = i.indexrelid WHERE c.relname LIKE 'engram_vectors_hnsw_%'"
        ).fetchall()


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL


def no_backend_left(dsn: str) -> bool:
    """The killed job's backend noticed its client gone and ended (its lock with it)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
            (vector_indexes._LOCK_CLASS,),
        ).fetchone()
    return row is not None and row[0] == 0


@pytest.mark.slow
def test_a_settling_job_killed_midway_resumes(fresh_store: Store, fresh_dsn: str) -> None:
    scope = {"user_id": "tail"}
    head = write(fresh_store, scope, texts_for("s", 1000))
    assert fresh_store.embeddings.index_large_scopes(threshold=1000)
    tail = write(fresh_store, scope, texts_for("f", 4000))
    process = settle_process(fresh_dsn, "settle", "10")
    try:
        wait_until(lambda: parts(fresh_dsn, scope)[True] >= 1500, timeout=120, what="a batch")
    finally:
        kill(process)
    wait_until(lambda: no_backend_left(fresh_dsn), timeout=30, what="the backend gone")
    left = parts(fresh_dsn, scope)
    assert left[False] > 0 and left[True] + left[False] == 5000  # killed midway

    assert fresh_store.embeddings.settle_fresh() == left[False]
    assert parts(fresh_dsn, scope) == {True: 5000}  # every row settled, once
    assert [(valid, registered) for _, valid, registered in index_state(fresh_dsn)] == [
        (True, True)
    ]
    sample = dict(list(tail.items())[::400])
    check_found_once(fresh_store, scope, sample, {**head, **tail})


@pytest.mark.slow
def test_an_index_build_killed_midway_is_built_again(fresh_store: Store, fresh_dsn: str) -> None:
    scope = {"user_id": "build"}
    ids = write(fresh_store, scope, texts_for("b", 20_000))

    def building() -> bool:
        with psycopg.connect(fresh_dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_progress_create_index"
                " WHERE phase LIKE 'building index%%'"
            ).fetchone()
        return row is not None and row[0] > 0

    process = settle_process(fresh_dsn, "build")
    try:
        wait_until(building, timeout=120, interval=0.02, what="the build")
    finally:
        kill(process)
    wait_until(lambda: no_backend_left(fresh_dsn), timeout=60, what="the backend gone")
    [(name, valid, registered)] = index_state(fresh_dsn)
    assert not valid and not registered  # killed during the build
    assert not uses_index(fresh_store, scope)  # recall stays exact meanwhile

    assert fresh_store.embeddings.index_large_scopes(threshold=1000) == [name]
    assert index_state(fresh_dsn) == [(name, True, True)]
    assert parts(fresh_dsn, scope) == {True: 20_000}
    for record_id, text in list(ids.items())[::2000]:  # approximate at this size
        assert record_id in [r.id for r in vector_hits(fresh_store, scope, text)]
