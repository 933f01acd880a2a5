"""Scoped access tokens in the store: only a hash is kept, a revoked or expired token
verifies as nothing, the read log holds ids and revisions only, and a token's
operations are authenticated on their receipts."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from engram.store import Operation, Store
from engram.store.errors import InvalidRequestError, TokenNameTakenError
from engram.store.tokens import CAPABILITIES, Grant


def test_a_token_is_shown_once_and_only_its_hash_is_kept(store: Store) -> None:
    secret, grant = store.tokens.create("agent-hash", {"user_id": "ada"}, by="grace")
    assert re.fullmatch(r"egt_[A-Za-z0-9_-]{43}", secret)
    assert grant.scope == {"user_id": "ada"} and grant.can == frozenset(CAPABILITIES)
    with store.pool.connection() as conn:
        stored = conn.execute(
            "SELECT t::text, secret_sha256 FROM engram_tokens t WHERE name = 'agent-hash'"
        ).fetchone()
    assert stored is not None
    assert secret not in stored[0] and secret[4:] not in stored[0]
    assert bytes(stored[1]) == hashlib.sha256(secret.encode()).digest()
    listed = {t.name: t for t in store.tokens.list()}["agent-hash"]
    assert secret not in repr(listed) and listed.created_by == "grace"


def test_verify_answers_a_live_token_and_notes_its_use(store: Store) -> None:
    secret, grant = store.tokens.create("agent-verify", {"user_id": "v"}, ["recall"], by="op")
    assert store.tokens.get("agent-verify").last_used_at is None  # type: ignore[union-attr]
    found = store.tokens.verify(secret)
    assert found == grant and found.allows("recall") and not found.allows("forget")
    assert store.tokens.get("agent-verify").last_used_at is not None  # type: ignore[union-attr]
    assert store.tokens.verify(secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None
    assert store.tokens.verify("egt_short") is None and store.tokens.verify("") is None


def test_a_revoked_or_expired_token_verifies_as_nothing(store: Store) -> None:
    secret, _ = store.tokens.create("agent-revoked", {"user_id": "r"}, by="op")
    assert store.tokens.revoke("agent-revoked", by="grace") is True
    assert store.tokens.verify(secret) is None
    assert store.tokens.revoke("agent-revoked", by="grace") is False
    expiring, _ = store.tokens.create("agent-expired", {"user_id": "e"}, by="op", expires_in_s=60)
    assert store.tokens.verify(expiring) is not None
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE engram_tokens SET expires_at = now() - interval '1 s'"
            " WHERE name = 'agent-expired'"
        )
    assert store.tokens.verify(expiring) is None
    actions = [(e.requested_by, e.action) for e in store.audit.about("token:agent-revoked")]
    assert actions == [("op", "token.create"), ("grace", "token.revoke")]


def test_bad_names_scopes_and_capabilities_are_refused_and_change_nothing(store: Store) -> None:
    before = len(store.tokens.list())
    for name, scope, can, expires in (
        ("", {"user_id": "x"}, CAPABILITIES, None),
        ("x" * 65, {"user_id": "x"}, CAPABILITIES, None),
        ("line\nbreak", {"user_id": "x"}, CAPABILITIES, None),
        ("ok", {}, CAPABILITIES, None),
        ("ok", {"tenant": "x"}, CAPABILITIES, None),
        ("ok", {"user_id": "x"}, ["recall", "sudo"], None),
        ("ok", {"user_id": "x"}, [], None),
        ("ok", {"user_id": "x"}, "recall", None),
        ("ok", {"user_id": "x"}, CAPABILITIES, -1),
        ("ok", {"user_id": "x"}, CAPABILITIES, float("inf")),
    ):
        with pytest.raises(InvalidRequestError):
            store.tokens.create(name, scope, can, expires, by="op")
    assert len(store.tokens.list()) == before
    store.tokens.create("agent-taken", {"user_id": "x"}, by="op")
    with pytest.raises(TokenNameTakenError):
        store.tokens.create("agent-taken", {"user_id": "y"}, by="op")


def test_a_token_covers_its_exact_scope_only(store: Store) -> None:
    _, grant = store.tokens.create("agent-exact", {"user_id": "ada"}, by="op")
    assert grant.covers({"user_id": "ada"})
    assert not grant.covers({"user_id": "ada", "chat_id": "c1"})
    assert not grant.covers({"user_id": "bob"})


def test_the_read_log_holds_ids_and_revisions_only(store: Store) -> None:
    _, grant = store.tokens.create("agent-reader", {"user_id": "log"}, by="op")
    store.tokens.log_reads(grant, "get", [("rec-1", 2)])
    store.tokens.log_reads(grant, "history", [("rec-1", 1), ("rec-1", 2)])
    store.tokens.log_reads(grant, "recall", [])  # nothing returned: nothing logged
    with pytest.raises(InvalidRequestError):
        store.tokens.log_reads(grant, "find", [("rec-1", 1)])
    (summary,) = store.tokens.reads_of_record({"user_id": "log"}, "rec-1")
    assert store.tokens.reads_of_record({"user_id": "other"}, "rec-1") == []
    assert (summary.token, summary.reads, summary.revisions) == ("agent-reader", 2, (1, 2))
    entries = store.tokens.reads_by_token("agent-reader")
    assert {(e.tool, e.record_id, e.revision) for e in entries} == {
        ("get", "rec-1", 2),
        ("history", "rec-1", 1),
        ("history", "rec-1", 2),
    }
    with store.pool.connection() as conn:
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'engram_token_reads' ORDER BY ordinal_position"
        ).fetchall()
    assert [c[0] for c in columns] == ["id", "token_id", "at", "tool", "record_id", "revision"]


def test_prune_removes_old_read_log_rows(store: Store) -> None:
    _, grant = store.tokens.create("agent-old-reads", {"user_id": "p"}, by="op")
    store.tokens.log_reads(grant, "get", [("old", 1)])
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE engram_token_reads SET at = now() - interval '40 days' WHERE record_id = 'old'"
        )
    store.tokens.log_reads(grant, "get", [("new", 1)])
    assert store.tokens.prune_reads(datetime.now(UTC) - timedelta(days=30)) == 1
    assert [e.record_id for e in store.tokens.reads_by_token("agent-old-reads")] == ["new"]


def test_a_vouched_operation_is_authenticated_on_its_receipt(store: Store, embedder) -> None:  # type: ignore[no-untyped-def]
    scope = {"user_id": "vouched"}
    _, grant = store.tokens.create("agent-writer", scope, by="op")
    assert isinstance(grant, Grant)
    actor = store.tokens.vouch(grant, "vouched:1")
    assert actor == "token:agent-writer"
    mine = Operation.build("remember", scope, {"text": "a"}, "vouched:1", requested_by=actor)
    # A producer naming the token without the server's word stays claimed.
    forged = Operation.build("remember", scope, {"text": "b"}, "vouched:2", requested_by=actor)
    store.execute([mine, forged], embedder)
    assert store.receipt("vouched:1").authenticated  # type: ignore[union-attr]
    assert store.receipt("vouched:1").as_dict()["authenticated"] is True  # type: ignore[union-attr]
    assert not store.receipt("vouched:2").authenticated  # type: ignore[union-attr]
    assert store.tokens.made(grant, "vouched:1") and not store.tokens.made(grant, "vouched:2")


def test_verify_notes_a_use_at_most_once_a_minute(store: Store, dsn: str) -> None:
    """A request costs a read: verify writes last_used_at only when it is older than
    LAST_USED_EVERY_S, and a token revoked since is refused at once all the same."""
    secret, _ = store.tokens.create("agent-often", {"user_id": "often"}, by="op")
    assert store.tokens.verify(secret) is not None
    first = store.tokens.get("agent-often").last_used_at  # type: ignore[union-attr]
    assert first is not None
    for _ in range(3):
        assert store.tokens.verify(secret) is not None
    assert store.tokens.get("agent-often").last_used_at == first  # type: ignore[union-attr]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE engram_tokens SET last_used_at = last_used_at - interval '61 seconds'"
            " WHERE name = 'agent-often'"
        )
    assert store.tokens.verify(secret) is not None
    later = store.tokens.get("agent-often").last_used_at  # type: ignore[union-attr]
    assert later is not None and later > first
    assert store.tokens.revoke("agent-often", by="op")
    assert store.tokens.verify(secret) is None
