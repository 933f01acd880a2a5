"""The batch path (``Store.execute``): many scopes in one transaction, refusals kept."""

from __future__ import annotations

import psycopg
import pytest

from engram.store import (
    HashingEmbedder,
    KeywordEmbedder,
    NotFoundError,
    Operation,
    OperationAmbiguousError,
    OperationConflictError,
    Store,
    WriteOptions,
    WriteResult,
)
from tests.helpers import CountingEmbedder, rows_containing

FIRST_TIME = WriteOptions(check_replays=False)  # no replay look-up before embedding


def test_a_refusal_is_kept_and_a_redelivery_answers_the_same(
    fresh_store: Store, fresh_dsn: str
) -> None:
    scope = {"user_id": "ada"}
    early = Operation.build("revise", scope, {"id": "r1", "text": "Ada's secret plan."}, "op-early")
    [refused] = fresh_store.execute([early])
    assert isinstance(refused, NotFoundError)
    fresh_store.session(scope).revise("r1", text="created now", expected_revision=0)

    # Redelivered after the record exists: the same answer, not a late success.
    [again] = fresh_store.execute([early])
    assert isinstance(again, NotFoundError) and again.message == refused.message
    assert fresh_store.session(scope).get("r1").revision == 1  # type: ignore[union-attr]

    kept = fresh_store.receipt("op-early")
    assert kept is not None and kept.error is not None and kept.error["code"] == "not_found"
    assert kept.scope_revision == 0 and kept.records == ()
    assert "op-early" not in [r.operation_id for r in fresh_store.receipts(scope=scope)]
    assert "op-early" in [r.operation_id for r in fresh_store.receipts(scope=scope, refused=True)]
    assert fresh_store.scope_revision(scope) == 1, "a refusal raises no scope revision"
    with psycopg.connect(fresh_dsn) as conn:
        assert rows_containing(conn, "secret plan") == [], "a refusal keeps no text"


def test_many_scopes_commit_in_one_call_each_with_its_own_revisions(fresh_store: Store) -> None:
    ops = []
    for i in range(40):
        for user in ("a", "b", "c"):
            ops.append(Operation.build("remember", {"user_id": user}, {"text": f"{user} note {i}"}))
    results = fresh_store.execute(ops, HashingEmbedder(32))
    assert all(isinstance(r, WriteResult) for r in results)
    for user in ("a", "b", "c"):
        revisions = [
            r.receipt.scope_revision
            for r, op in zip(results, ops, strict=True)  # type: ignore[union-attr]
            if op.scope.user_id == user
        ]
        assert revisions == list(range(1, 41))
        assert fresh_store.scope_revision({"user_id": user}) == 40


def test_one_id_created_by_two_scopes_in_one_batch_is_two_records(fresh_store: Store) -> None:
    """A record id is its scope's (issue 36): each scope of the batch creates its own."""
    a = Operation.build("remember", {"user_id": "a"}, {"text": "a's", "id": "shared"})
    b = Operation.build("remember", {"user_id": "b"}, {"text": "b's", "id": "shared"})
    first, second = fresh_store.execute([a, b])
    assert isinstance(first, WriteResult) and isinstance(second, WriteResult)
    for user, text in (("a", "a's"), ("b", "b's")):
        record = fresh_store.get({"user_id": user}, "shared")
        assert record is not None and (record.text, record.revision) == (text, 1)
        assert fresh_store.scope_revision({"user_id": user}) == 1


def test_one_operation_id_in_two_scopes_is_two_operations(fresh_store: Store) -> None:
    """An operation id identifies an operation within its scope (issue 36): the same id
    in two scopes of one batch is applied once in each, and each repeat replays its own."""
    a = Operation.build("remember", {"user_id": "a"}, {"text": "x"}, "same-id")
    b = Operation.build("remember", {"user_id": "b"}, {"text": "y"}, "same-id")
    first, second = fresh_store.execute([a, b])
    assert isinstance(first, WriteResult) and isinstance(second, WriteResult)
    assert not first.replayed and not second.replayed
    assert first.records[0].id != second.records[0].id  # derived ids are the scope's too
    assert fresh_store.scope_revision({"user_id": "a"}) == 1
    assert fresh_store.scope_revision({"user_id": "b"}) == 1
    again_b, again_a = fresh_store.execute([b, a])
    assert isinstance(again_a, WriteResult) and again_a.replayed
    assert isinstance(again_b, WriteResult) and again_b.replayed
    assert again_a.records[0].text == "x" and again_b.records[0].text == "y"
    # A different request under the id is a conflict in its own scope only.
    other = Operation.build("remember", {"user_id": "a"}, {"text": "z"}, "same-id")
    [conflict] = fresh_store.execute([other])
    assert isinstance(conflict, OperationConflictError)
    assert fresh_store.receipt("same-id", {"user_id": "b"}).scope.user_id == "b"  # type: ignore[union-attr]
    with pytest.raises(OperationAmbiguousError) as ambiguous:
        fresh_store.receipt("same-id")
    assert sorted(s["user_id"] for s in ambiguous.value.scopes) == ["a", "b"]


def test_a_forget_in_one_scope_redacts_nothing_of_the_same_id_in_another(
    fresh_store: Store,
) -> None:
    """Bob's redacted receipt under an id does not answer ada's write under it as a
    replay: ada's is applied, and bob's stays redacted."""
    bob = fresh_store.session({"user_id": "bob"})
    kept = bob.remember("bob's secret", operation_id="chat-7")
    bob.forget(kept.records[0].id)
    ada = Operation.build("remember", {"user_id": "ada"}, {"text": "ada's"}, "chat-7")
    [result] = fresh_store.execute([ada])
    assert isinstance(result, WriteResult) and not result.replayed
    assert result.records[0].text == "ada's"
    assert fresh_store.receipt("chat-7", {"user_id": "bob"}).redacted  # type: ignore[union-attr]
    assert not fresh_store.receipt("chat-7", {"user_id": "ada"}).redacted  # type: ignore[union-attr]


def test_an_empty_batch_raises_only_the_fence(fresh_store: Store) -> None:
    from engram.store import Fence, FencedError

    assert fresh_store.execute([], options=WriteOptions(fences=(Fence("partition:0", 5),))) == []
    assert fresh_store.execute([], options=WriteOptions(fences=(Fence("partition:0", 5),))) == [], (
        "the same token passes"
    )
    with pytest.raises(FencedError):
        fresh_store.execute([], options=WriteOptions(fences=(Fence("partition:0", 4),)))


def test_without_the_replay_look_up_a_replay_is_still_answered_from_its_receipt(
    fresh_store: Store,
) -> None:
    counting = CountingEmbedder(HashingEmbedder(32))
    op = Operation.build("remember", {"user_id": "ada"}, {"text": "Ada prefers tea."}, "op-1")
    [first] = fresh_store.execute([op], counting, options=FIRST_TIME)
    [again] = fresh_store.execute([op], counting, options=FIRST_TIME)
    assert isinstance(first, WriteResult) and isinstance(again, WriteResult)
    assert (first.replayed, again.replayed) == (False, True)
    assert again.receipt == first.receipt
    assert fresh_store.scope_revision({"user_id": "ada"}) == 1
    assert counting.calls == 2  # the price of skipping the look-up: the text embedded again
    fresh_store.execute([op], counting)
    assert counting.calls == 2  # with the look-up, none


def test_without_the_look_up_a_generation_activated_meanwhile_is_used(fresh_store: Store) -> None:
    """The writer remembers the active generation from its last commit; an activation
    since then is found under lock and the batch is embedded again for it."""
    v1 = KeywordEmbedder("keywords-1", ["tea", "coffee"])
    v2 = KeywordEmbedder("keywords-2", ["tea", "coffee", "green"])
    ada = {"user_id": "ada"}
    fresh_store.execute(
        [Operation.build("remember", ada, {"text": "Ada prefers tea."})], v1, options=FIRST_TIME
    )
    fresh_store.session(ada, embedder=v1).reembed(v2)
    counting = CountingEmbedder(v2)
    [result] = fresh_store.execute(
        [Operation.build("remember", ada, {"text": "Ada likes green tea."})],
        counting,
        options=FIRST_TIME,
    )
    assert isinstance(result, WriteResult) and result.conflict_retries == 1
    assert counting.calls == 1  # not called for the stale generation's model
    hits = fresh_store.session(ada, embedder=v2).recall("green")
    assert hits and hits[0].record.text == "Ada likes green tea." and hits[0].match != "lexical"
