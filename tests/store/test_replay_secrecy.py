"""What a repeat of an operation id reveals of a request: receipts keep a digest keyed
with the store's secret, and once redacted, none; a repeat of a forgotten write is
answered alike whatever it asks."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from engram.store import HashingEmbedder, Operation, OperationConflictError, Store, migrations
from engram.store.write.validation import canonical_json
from tests.fake_llm import ScriptedLLM, events
from tests.helpers import migrated_to

EMBEDDER = HashingEmbedder(64)


def stored_digest(dsn: str, operation_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT request_digest FROM engram_receipts WHERE operation_id = %s", (operation_id,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def secret(dsn: str) -> bytes:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT secret FROM engram_secrets WHERE name = 'request_digest'"
        ).fetchone()
    assert row is not None
    return bytes(row[0])


def remember(scope: dict[str, str], text: str, op_id: str, **more: Any) -> Operation:
    return Operation.build("remember", scope, {"text": text, **more}, op_id)


def test_a_repeat_of_a_forgotten_write_is_answered_alike_whatever_it_asks(
    fresh_store: Store, fresh_dsn: str
) -> None:
    scope = {"user_id": "ada"}
    mem = fresh_store.session(scope, embedder=EMBEDDER)
    first = mem.remember("Ada's diagnosis is lupus.", operation_id="op-secret")
    mem.forget(first.records[0].id)
    revision = fresh_store.scope_revision(scope)

    answers = [
        fresh_store.execute([remember(scope, text, "op-secret")], EMBEDDER)[0]
        for text in ("Ada's diagnosis is lupus.", "Ada's diagnosis is gout.")
    ]
    answers.append(fresh_store.execute([remember(scope, "x", "op-secret", kind="y")])[0])
    assert all(not isinstance(a, Exception) and a.replayed for a in answers)
    assert answers[0] == answers[1] == answers[2]
    # As sent to a producer too, less the count of repeats answered so far.
    sent = [
        {k: v for k, v in a.receipt.as_dict().items() if "replay" not in k}  # type: ignore[union-attr]
        for a in answers
    ]
    assert sent[0] == sent[1] == sent[2]
    assert answers[0].records == ()  # type: ignore[union-attr]
    assert stored_digest(fresh_dsn, "op-secret") == ""  # nothing left to compare
    assert fresh_store.scope_revision(scope) == revision


def test_a_repeat_of_a_duplicate_erased_by_a_forget_is_answered_alike(
    fresh_store: Store,
) -> None:
    scope = {"user_id": "ada"}
    llm = ScriptedLLM(reconcile=events({"event": "NOOP", "id": "0"}))
    mem = fresh_store.session(scope, embedder=EMBEDDER, llm=llm)
    rid = mem.remember("Ada's diagnosis is lupus.").records[0].id
    mem.remember("Ada has lupus.", operation_id="op-noop")
    mem.forget(rid)
    right, wrong = (
        fresh_store.execute([remember(scope, text, "op-noop")], EMBEDDER, llm=llm)[0]
        for text in ("Ada has lupus.", "Ada has gout.")
    )
    assert right == wrong and right.replayed  # type: ignore[union-attr]
    assert llm.calls == 1  # a repeat makes no model call, whatever it asks


def test_a_repeat_after_a_forget_in_the_same_batch_is_answered_alike(
    fresh_store: Store,
) -> None:
    scope = {"user_id": "ada"}
    mem = fresh_store.session(scope, embedder=EMBEDDER)
    rid = mem.remember("Ada's diagnosis is lupus.", operation_id="op-batch").records[0].id
    results = fresh_store.execute(
        [
            Operation.build("forget", scope, {"id": rid}),
            remember(scope, "Ada's diagnosis is gout.", "op-batch"),
        ],
        EMBEDDER,
    )
    assert not isinstance(results[1], Exception) and results[1].replayed


def test_the_stored_digest_needs_the_stores_secret(fresh_store: Store, fresh_dsn: str) -> None:
    scope = {"user_id": "ada"}
    op = remember(scope, "Ada's diagnosis is lupus.", "op-keyed")
    fresh_store.execute([op], EMBEDDER)
    plain = hashlib.sha256(
        canonical_json(
            {"kind": op.kind, "scope": op.scope.as_dict(), "request": op.request.to_dict()}
        ).encode()
    ).hexdigest()
    assert plain == op.digest  # what receipts stored before migration 007
    key = secret(fresh_dsn)
    assert len(key) == 32
    stored = stored_digest(fresh_dsn, "op-keyed")
    assert stored != plain
    assert stored == hmac.new(key, plain.encode(), hashlib.sha256).hexdigest()


def test_two_stores_have_different_secrets(postgres: Any) -> None:
    keys = []
    for name in ("f_secret_one", "f_secret_two"):
        with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        Store.connect(postgres.dsn(name)).close()
        keys.append(secret(postgres.dsn(name)))
    assert keys[0] != keys[1]


def test_replays_and_conflicts_of_live_records_are_as_before(store: Store, dsn: str) -> None:
    scope = {"user_id": "replay-live"}
    first = store.execute([remember(scope, "Ada likes tea.", "op-live")], EMBEDDER)[0]
    again = store.execute([remember(scope, "Ada likes tea.", "op-live")], EMBEDDER)[0]
    assert not isinstance(again, Exception) and again.replayed
    assert again.receipt == first.receipt  # type: ignore[union-attr]
    assert [r.text for r in again.records] == ["Ada likes tea."]
    revision = store.scope_revision(scope)
    [conflict] = store.execute([remember(scope, "Ada likes coffee.", "op-live")], EMBEDDER)
    assert isinstance(conflict, OperationConflictError)
    assert store.scope_revision(scope) == revision
    assert len(store.receipts(scope=scope)) == 1
    assert stored_digest(dsn, "op-live") != ""


def test_receipts_committed_before_the_secret_still_replay(empty_dsn: str) -> None:
    scope = {"user_id": "ada"}
    kept = remember(scope, "Ada likes tea.", "op-old")
    erased = remember(scope, "Ada's diagnosis is lupus.", "op-old-erased")
    migrated_to(empty_dsn, 6)
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute(
            "INSERT INTO engram_scopes (key, user_id, revision) VALUES (%s, 'ada', 2) RETURNING id",
            (kept.scope.key,),
        ).fetchone()
        assert row is not None
        for op, revision, redacted in ((kept, 1, False), (erased, 2, True)):
            conn.execute(
                "INSERT INTO engram_receipts (operation_id, scope_id, kind, request_digest,"
                " scope_revision, committed_at, request, redacted)"
                " VALUES (%s, %s, 'remember', %s, %s, %s, %s, %s)",
                (
                    op.operation_id,
                    row[0],
                    op.digest,  # plain, as before migration 007
                    revision,
                    datetime.now(UTC),
                    None if redacted else Jsonb(op.request.to_dict()),
                    redacted,
                ),
            )
    with Store.connect(empty_dsn) as store:
        assert (
            stored_digest(empty_dsn, "op-old")
            == hmac.new(secret(empty_dsn), kept.digest.encode(), hashlib.sha256).hexdigest()
        )
        [replay] = store.execute([kept], EMBEDDER)
        assert not isinstance(replay, Exception) and replay.replayed
        [conflict] = store.execute([remember(scope, "Ada likes coffee.", "op-old")], EMBEDDER)
        assert isinstance(conflict, OperationConflictError)
        right, wrong = (
            store.execute([op], EMBEDDER)[0]
            for op in (erased, remember(scope, "Ada's diagnosis is gout.", "op-old-erased"))
        )
        assert right == wrong and right.replayed  # type: ignore[union-attr]
        assert store.scope_revision(scope) == 2


@pytest.mark.parametrize("key", [b"k" * 32, bytes(range(32))])
def test_the_migrations_hmac_is_python_s(fresh_dsn: str, key: bytes) -> None:
    """Migration 007 re-keys in SQL what the writer keys in Python: the same HMAC."""
    sql = dict(migrations.available())[7]
    start = sql.index("CREATE FUNCTION pg_temp.engram_hmac")
    function = sql[start : sql.index("$$;", start) + 3]
    with psycopg.connect(fresh_dsn) as conn:
        conn.execute(function.encode())
        row = conn.execute(
            "SELECT encode(pg_temp.engram_hmac(%s, convert_to(%s, 'UTF8')), 'hex')",
            (key, "ab" * 32),
        ).fetchone()
    assert row == (hmac.new(key, ("ab" * 32).encode(), hashlib.sha256).hexdigest(),)
