"""Several writers on one scope at once: nothing lost, scope revisions gap-free."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg

from engram.store import HashingEmbedder, RevisionConflictError, Store

WRITERS = 6
WRITES_EACH = 25


def test_concurrent_writers_never_lose_a_write_nor_share_a_revision(
    fresh_store: Store, fresh_dsn: str
) -> None:
    scope = {"user_id": "shared"}
    start = threading.Barrier(WRITERS)

    def writer(n: int) -> list[int]:
        mem = fresh_store.session(scope, embedder=HashingEmbedder(32))
        start.wait()
        return [
            mem.remember(f"writer {n} note {i}", operation_id=f"w{n}:{i}").receipt.scope_revision
            for i in range(WRITES_EACH)
        ]

    with ThreadPoolExecutor(WRITERS) as pool:
        revisions = [r for rs in pool.map(writer, range(WRITERS)) for r in rs]

    total = WRITERS * WRITES_EACH
    assert sorted(revisions) == list(range(1, total + 1))
    assert fresh_store.scope_revision(scope) == total
    with psycopg.connect(fresh_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM engram_records").fetchone() == (total,)
        assert conn.execute("SELECT count(*) FROM engram_vectors").fetchone() == (total,)
        stored = [
            r[0]
            for r in conn.execute(
                "SELECT scope_revision FROM engram_receipts ORDER BY scope_revision"
            )
        ]
    assert stored == list(range(1, total + 1))


def test_concurrent_revisers_of_one_record_exactly_one_wins(fresh_store: Store) -> None:
    scope = {"user_id": "racers"}
    fact = fresh_store.session(scope).remember("v1").records[0]
    start = threading.Barrier(WRITERS)

    def revise(n: int) -> str:
        start.wait()
        try:
            fresh_store.session(scope).revise(fact.id, text=f"v2 by {n}", expected_revision=1)
            return "won"
        except RevisionConflictError as error:
            assert error.actual == 2
            return "conflict"

    with ThreadPoolExecutor(WRITERS) as pool:
        outcomes = list(pool.map(revise, range(WRITERS)))
    assert sorted(outcomes) == ["conflict"] * (WRITERS - 1) + ["won"]
    assert [r.revision for r in fresh_store.session(scope).history(fact.id)] == [1, 2]


def test_the_same_operation_from_two_writers_applies_once(fresh_store: Store) -> None:
    scope = {"user_id": "twins"}
    start = threading.Barrier(4)

    def send(_: int) -> bool:
        start.wait()
        return fresh_store.session(scope).remember("once", operation_id="twin-op").replayed

    with ThreadPoolExecutor(4) as pool:
        replayed = list(pool.map(send, range(4)))
    assert sorted(replayed) == [False, True, True, True]
    assert fresh_store.scope_revision(scope) == 1


def test_one_id_created_from_two_scopes_at_once_is_one_record_in_each(
    fresh_store: Store,
) -> None:
    """A record id is its scope's (issue 36): two scopes creating it at once never wait
    on nor refuse each other; each holds its own."""
    start = threading.Barrier(2)

    def create(user: str) -> str:
        start.wait()
        fresh_store.session({"user_id": user}).remember(f"{user}'s", id="contested")
        return "created"

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(create, ["a", "b"]))
    assert outcomes == ["created", "created"]
    for user in ("a", "b"):
        assert fresh_store.get({"user_id": user}, "contested").text == f"{user}'s"  # type: ignore[union-attr]
