"""The operator's reads (``Store.browse``): keyset pages of every list, strict cursors."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from engram.store import (
    HashingEmbedder,
    InvalidCursorError,
    InvalidRequestError,
    Operation,
    ReceiptFilter,
    Store,
    WriteResult,
)
from engram.store.read.paging import MAX_PAGE_SIZE

EMBEDDER = HashingEmbedder(32)


def remember(store: Store, scope: dict[str, str], text: str, **kw: object) -> str:
    [result] = store.execute([Operation.build("remember", scope, {"text": text, **kw})], EMBEDDER)
    assert isinstance(result, WriteResult)
    return result.records[0].id


def all_pages(fetch, limit: int = 2) -> list:  # type: ignore[no-untyped-def]
    items, cursor = [], None
    while True:
        page = fetch(cursor=cursor, limit=limit)
        items += page.items
        if page.next is None:
            return items
        cursor = page.next


def test_scopes_page_by_key_with_counts_and_last_write(fresh_store: Store) -> None:
    for user in ("ada", "adam", "bob", "b_b", "b%b"):
        remember(fresh_store, {"user_id": user}, f"{user} likes tea.")
    gone = remember(fresh_store, {"user_id": "ada"}, "Ada's second note.")
    fresh_store.session({"user_id": "ada"}, embedder=EMBEDDER).forget(gone)

    rows = all_pages(fresh_store.browse.scopes)
    assert [r.scope.user_id for r in rows] == sorted(["ada", "adam", "bob", "b_b", "b%b"])
    ada = next(r for r in rows if r.scope.user_id == "ada")
    assert (ada.records, ada.forgotten, ada.revision) == (1, 1, 3)
    assert ada.last_write is not None and ada.last_write <= datetime.now(UTC)
    assert fresh_store.browse.scope(ada.id) == ada

    prefix = fresh_store.browse.scopes({"user_id": "ada"})
    assert [r.scope.user_id for r in prefix.items] == ["ada", "adam"]
    exact = fresh_store.browse.scopes({"user_id": "ada"}, exact=True)
    assert [r.scope.user_id for r in exact.items] == ["ada"]
    # LIKE's wildcards in a value are plain characters.
    assert [r.scope.user_id for r in fresh_store.browse.scopes({"user_id": "b_"}).items] == ["b_b"]
    assert [r.scope.user_id for r in fresh_store.browse.scopes({"user_id": "b%"}).items] == ["b%b"]


def test_scope_filters_are_checked(fresh_store: Store) -> None:
    with pytest.raises(InvalidRequestError, match="unknown scope field"):
        fresh_store.browse.scopes({"email": "x"})
    with pytest.raises(InvalidRequestError, match="NUL"):
        fresh_store.browse.scopes({"user_id": "a\x00"})
    with pytest.raises(InvalidRequestError, match="page holds"):
        fresh_store.browse.scopes(limit=MAX_PAGE_SIZE + 1)


def test_records_by_status_newest_first_and_pages_do_not_shift(fresh_store: Store) -> None:
    scope = {"user_id": "ada"}
    ids = [remember(fresh_store, scope, f"note {i}") for i in range(5)]
    session = fresh_store.session(scope, embedder=EMBEDDER)
    session.retract(ids[1])
    remember(fresh_store, scope, "short lived", ttl_ms=1)
    time.sleep(0.01)
    scope_id = fresh_store.scope_id(scope)
    assert scope_id is not None

    def texts(status: str) -> list[str]:
        return [
            i.record.text
            for i in all_pages(
                lambda **kw: fresh_store.browse.records(scope_id, status, **kw)  # type: ignore[arg-type]
            )
        ]

    assert texts("active") == ["note 4", "note 3", "note 2", "note 0"]
    assert texts("retracted") == ["note 1"]
    assert texts("expired") == ["short lived"]
    assert sorted(texts("all")) == sorted([f"note {i}" for i in range(5)] + ["short lived"])
    expired = fresh_store.browse.records(scope_id, "expired").items[0]
    assert expired.expired and expired.record.status == "active"

    # A write between two pages does not repeat or skip a record of the later pages.
    first = fresh_store.browse.records(scope_id, "active", limit=2)
    remember(fresh_store, scope, "written meanwhile")
    rest = fresh_store.browse.records(scope_id, "active", cursor=first.next, limit=10)
    assert [i.record.text for i in first.items + rest.items] == [
        "note 4",
        "note 3",
        "note 2",
        "note 0",
    ]


def test_superseded_by_and_links_on_a_page(fresh_store: Store) -> None:
    scope = {"user_id": "ada"}
    old = remember(fresh_store, scope, "Ada lives in London.")
    new = remember(
        fresh_store, scope, "Ada lives in Paris.", links=[{"relation": "supersedes", "id": old}]
    )
    scope_id = fresh_store.scope_id(scope)
    assert scope_id is not None
    by_id = {i.record.id: i.record for i in fresh_store.browse.records(scope_id).items}
    assert by_id[old].superseded_by == (new,)
    item = fresh_store.browse.record(scope_id, old)
    assert item is not None and item.record.superseded_by == (new,)


def test_a_scope_as_of_a_past_time(fresh_store: Store) -> None:
    scope = {"user_id": "ada"}
    rid = remember(fresh_store, scope, "Ada lives in London.")
    session = fresh_store.session(scope, embedder=EMBEDDER)
    before = datetime.now(UTC)
    time.sleep(0.01)
    session.revise(rid, text="Ada lives in Paris.")
    later = remember(fresh_store, scope, "Ada has a cat.")
    scope_id = fresh_store.scope_id(scope)
    assert scope_id is not None

    then = fresh_store.browse.records_as_of(scope_id, before)
    assert [(i.record.id, i.record.revision, i.record.text) for i in then.items] == [
        (rid, 1, "Ada lives in London.")
    ]
    now = all_pages(
        lambda **kw: fresh_store.browse.records_as_of(scope_id, datetime.now(UTC), **kw), limit=1
    )
    assert [(i.record.id, i.record.revision) for i in now] == [(later, 1), (rid, 2)]
    with pytest.raises(InvalidRequestError, match="time zone"):
        fresh_store.browse.records_as_of(scope_id, datetime.now())


def test_a_record_its_history_and_its_tombstone(fresh_store: Store) -> None:
    scope = {"user_id": "ada"}
    rid = remember(fresh_store, scope, "Ada lives in London.")
    session = fresh_store.session(scope, embedder=EMBEDDER)
    session.revise(rid, text="Ada lives in Paris.")
    session.retract(rid)
    scope_id = fresh_store.scope_id(scope)
    assert scope_id is not None
    item = fresh_store.browse.record(scope_id, rid)
    assert item is not None and (item.record.revision, item.record.status) == (3, "retracted")
    history = fresh_store.browse.history(scope_id, rid)
    assert [(r.revision, r.status, r.text) for r in history] == [
        (1, "active", "Ada lives in London."),
        (2, "active", "Ada lives in Paris."),
        (3, "retracted", "Ada lives in Paris."),
    ]
    assert fresh_store.browse.tombstone(scope_id, rid) is None
    [forgot] = fresh_store.execute(
        [Operation.build("forget", scope, {"id": rid}, "forget-1", requested_by="grace")]
    )
    assert isinstance(forgot, WriteResult)
    assert fresh_store.browse.record(scope_id, rid) is None
    assert fresh_store.browse.history(scope_id, rid) == []
    tomb = fresh_store.browse.tombstone(scope_id, rid)
    assert tomb is not None
    assert (tomb.record_id, tomb.operation_id, tomb.requested_by) == (rid, "forget-1", "grace")
    assert tomb.scope_id == item.scope_id
    assert fresh_store.browse.tombstones(item.scope_id).items == [tomb]


def test_receipt_filters(fresh_store: Store) -> None:
    ada, bob = {"user_id": "ada"}, {"user_id": "bob"}
    start = datetime.now(UTC)
    rid = remember(fresh_store, ada, "Ada lives in London.")
    remember(fresh_store, bob, "Bob lives in Rome.")
    again = Operation.build("remember", ada, {"text": "Ada has a cat."}, "op-cat")
    fresh_store.execute([again], EMBEDDER)
    fresh_store.execute([again], EMBEDDER)  # a replay
    stale = Operation.build("revise", ada, {"id": rid, "text": "x", "expected_revision": 9})
    fresh_store.execute([stale], EMBEDDER)  # a refusal
    forget = Operation.build("forget", ada, {"id": rid}, "forget-ada", requested_by="grace")
    fresh_store.execute([forget], EMBEDDER)
    ada_id = fresh_store.scope_id(ada)

    def ops(**filters: object) -> list[str]:
        where = ReceiptFilter(**filters)  # type: ignore[arg-type]
        return [
            i.receipt.operation_id
            for i in all_pages(lambda **kw: fresh_store.browse.receipts(where, **kw))
        ]

    every = ops()
    assert len(every) == 5 and every[0] == "forget-ada"  # newest first, refusal included
    assert set(ops(scope_id=ada_id)) == set(every) - set(ops(scope_id=ada_id + 1))  # type: ignore[operator]
    assert ops(kind="forget") == ["forget-ada"]
    assert ops(replayed=True) == ["op-cat"]
    assert ops(refused=True) == [stale.operation_id]
    assert stale.operation_id not in ops(refused=False)
    assert len(ops(redacted=True)) == 1  # the remember that wrote the forgotten record
    assert ops(requested_by="grace") == ["forget-ada"]
    # The receipts that wrote or erased it, and the refusal of the revise that named it.
    assert ops(record_id=rid)[0] == "forget-ada" and len(ops(record_id=rid)) == 3
    assert stale.operation_id in ops(record_id=rid)
    assert ops(since=datetime.now(UTC)) == []
    assert ops(until=start) == []
    receipt = fresh_store.browse.receipt("op-cat")
    assert receipt is not None and receipt.receipt.replays == 1
    assert receipt.receipt.last_replayed_at is not None
    with pytest.raises(InvalidRequestError, match="kind must be one of"):
        ReceiptFilter(kind="drop table")
    with pytest.raises(InvalidRequestError, match="time zone"):
        ReceiptFilter(since=datetime.now())


def test_requested_by_is_kept_and_is_not_part_of_the_request(fresh_store: Store) -> None:
    scope = {"user_id": "ada"}
    op = Operation.build(
        "remember", scope, {"text": "Ada likes tea."}, "op-1", requested_by="grace"
    )
    assert op.to_dict()["requested_by"] == "grace"
    assert Operation.from_dict(op.to_dict()) == op
    other = Operation.build("remember", scope, {"text": "Ada likes tea."}, "op-1")
    assert other.digest == op.digest
    [first] = fresh_store.execute([op], EMBEDDER)
    [second] = fresh_store.execute([other], EMBEDDER)
    assert isinstance(first, WriteResult) and isinstance(second, WriteResult)
    assert second.replayed and second.receipt.requested_by == "grace"
    assert first.receipt.as_dict()["requested_by"] == "grace"
    with pytest.raises(InvalidRequestError, match="requested_by"):
        Operation.build("remember", scope, {"text": "x"}, requested_by="")


def test_a_replayed_refusal_is_counted_too(fresh_store: Store) -> None:
    scope = {"user_id": "ada"}
    op = Operation.build("retract", scope, {"id": "missing"}, "op-missing")
    fresh_store.execute([op], EMBEDDER)
    fresh_store.execute([op], EMBEDDER)
    fresh_store.execute([op], EMBEDDER)
    item = fresh_store.browse.receipt("op-missing")
    assert item is not None and item.receipt.error is not None
    assert item.receipt.replays == 2


def test_generations_with_vector_counts(fresh_store: Store) -> None:
    scope = {"user_id": "ada"}
    for i in range(3):
        remember(fresh_store, scope, f"note {i}")
    fresh_store.session(scope, embedder=EMBEDDER).reembed(HashingEmbedder(16))
    gens = fresh_store.browse.generations().items
    assert [(g.generation.status, g.generation.dims, g.vectors) for g in gens] == [
        ("active", 16, 3),
        ("retired", 32, 0),
    ]
    assert [g.generation.id for g in all_pages(fresh_store.browse.generations, 1)] == [
        g.generation.id for g in gens
    ]


def test_audit_entries_are_content_free_and_paged(fresh_store: Store) -> None:
    fresh_store.audit.record("grace", "dead_letter.retry", "1700000000000-0", {"partition": 3})
    fresh_store.audit.record("local", "dead_letter.discard", "1700000000001-0")
    entries = all_pages(fresh_store.audit.page, 1)
    assert [(e.requested_by, e.action, e.detail) for e in entries] == [
        ("local", "dead_letter.discard", {}),
        ("grace", "dead_letter.retry", {"partition": 3}),
    ]
    with pytest.raises(InvalidRequestError, match="must be one of"):
        fresh_store.audit.record("grace", "drop", "x")
    with pytest.raises(InvalidRequestError, match="id, number or flag"):
        fresh_store.audit.record("grace", "reembed.start", "x", {"text": "y" * 500})


def _payload(body: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


def _other_last(text: str) -> str:
    return text[:-1] + ("B" if text.endswith("A") else "A")


def test_a_cursor_this_store_did_not_sign_is_refused(store: Store) -> None:
    from engram.store.read.cursors import Cursors

    scope = {"user_id": "signed"}
    for i in range(3):
        store.execute([Operation.build("remember", scope, {"text": f"n{i}"})], EMBEDDER)
    scope_id = store.scope_id(scope)
    assert scope_id is not None
    token = store.browse.records(scope_id, limit=1).next
    assert token is not None and store.browse.records(scope_id, cursor=token).items
    payload, signature = token.split(".")
    # The same position, signed by another process's key: well-formed, not ours.
    position = store.cursors.decode(token, "records", (datetime, str))
    other = Cursors(b"another key, another server").encode("records", position)
    for forged in (
        payload,  # no signature
        f"{payload}.{_other_last(signature)}",
        f"{_other_last(payload)}.{signature}",
        other,
        f"{_payload(['records', [{'t': '2030-01-01T00:00:00+00:00'}, 'x']])}.{signature}",
    ):
        with pytest.raises(InvalidCursorError, match="not handed out by this server"):
            store.browse.records(scope_id, cursor=forged)


@pytest.mark.parametrize(
    "payload",
    [
        "not base64!",
        _payload(["records", ["2026-01-01T00:00:00+00:00", "x"]]),  # time not tagged
        _payload(["receipts", [{"t": "2026-01-01T00:00:00+00:00"}, "x"]]),  # another list's
        _payload(["records", [{"t": "2026-01-01T00:00:00"}, "x"]]),  # no time zone
        _payload(["records", [{"t": "yesterday"}, "x"]]),
        _payload(["records", [{"t": "2026-01-01T00:00:00+00:00"}, 5]]),
        _payload(["records", [{"t": "2026-01-01T00:00:00+00:00"}]]),
        _payload(["records", [{"t": "2026-01-01T00:00:00+00:00"}, "x\u0000"]]),
        _payload({"records": 1}),
        base64.urlsafe_b64encode(b"\xff\xfe").decode().rstrip("="),
    ],
)
def test_a_signed_cursor_is_still_read_strictly(store: Store, payload: str) -> None:
    """Even one signed with our key (a key that leaked, a bug): values are typed, never SQL."""
    token = f"{payload}.{store.cursors._sign(payload)}"
    with pytest.raises(InvalidCursorError) as info:
        store.browse.records(1, cursor=token)
    assert info.value.status == 400 and info.value.code == "invalid_request"


@pytest.mark.parametrize("token", ["", "a" * 20000, "."])
def test_an_empty_or_huge_cursor_is_refused(store: Store, token: str) -> None:
    with pytest.raises(InvalidCursorError):
        store.browse.records(1, cursor=token)


def test_cursor_values_survive_a_round_trip(store: Store) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC) + timedelta(hours=0)
    token = store.cursors.encode("records", (at, "mem_é/?&"))
    assert store.cursors.decode(token, "records", (datetime, str)) == (at, "mem_é/?&")
