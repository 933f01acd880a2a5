"""Finding a record in any scope (store/read/find.py): by id or its beginning, tombstones
included, LIKE's metacharacters literal, through the byte-ordered index; by the words of
the current text only, ranked, never by a forgotten record's or an old revision's."""

from __future__ import annotations

import pytest

from engram.store import HashingEmbedder, InvalidRequestError, Store
from engram.store.read.find import _BY_ID, MAX_FIND_TEXT_CHARS, find_by_id, find_by_text, snippet

EMBEDDER = HashingEmbedder(64)


def test_an_id_or_its_beginning_finds_records_of_every_scope_and_tombstones(
    store: Store,
) -> None:
    ada = store.session({"user_id": "find-ada"}, embedder=EMBEDDER)
    bob = store.session({"user_id": "find-bob"}, embedder=EMBEDDER)
    ada.remember("Ada keeps bees.", id="fid-1")
    bob.remember("Bob keeps goats.", id="fid-2")
    bob.retract(bob.remember("Bob kept a parrot.", id="fid-3").records[0].id)
    ada.remember("Ada's door code is 4711.", id="fid-4")
    ada.forget("fid-4")
    store.session({"user_id": "find-eve"}, embedder=EMBEDDER).remember("Eve.", id="fidx")

    found = find_by_id(store.pool, "fid-")
    assert [(h.record_id, h.scope.user_id, h.status) for h in found.hits] == [
        ("fid-1", "find-ada", "active"),
        ("fid-2", "find-bob", "active"),
        ("fid-3", "find-bob", "retracted"),
        ("fid-4", "find-ada", "forgotten"),
    ]
    assert found.hits[0].snippet_text == "Ada keeps bees." and not found.more
    assert found.hits[3].snippet == (), "a forgotten record has no text to show"
    assert [h.record_id for h in find_by_id(store.pool, "fid-2").hits] == ["fid-2"]
    assert find_by_id(store.pool, "fid-9").hits == []
    capped = find_by_id(store.pool, "fid", limit=2)
    assert [h.record_id for h in capped.hits] == ["fid-1", "fid-2"] and capped.more


def test_like_metacharacters_in_a_prefix_are_literal(store: Store) -> None:
    session = store.session({"user_id": "find-meta"}, embedder=EMBEDDER)
    for rid in ("m%1", "mA1", "m_2", "mB2", "m\\3", "mC3"):
        session.remember(f"Record {rid}.", id=rid)
    for prefix, expected in (("m%", ["m%1"]), ("m_", ["m_2"]), ("m\\", ["m\\3"])):
        assert [h.record_id for h in find_by_id(store.pool, prefix).hits] == expected


def test_an_id_prefix_is_a_range_scan_of_the_byte_ordered_index(store: Store) -> None:
    with store.pool.connection() as conn, conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN " + _BY_ID, {"pattern": "ab\\_c%", "n": 51, "clip": 240}
            ).fetchall()
        )
    assert "engram_records_id_c_idx" in plan and "engram_forgotten_id_c_idx" in plan
    assert "::text >= 'ab_c'::text) AND" in plan and "::text < 'ab_d'::text))" in plan


def test_text_finds_current_text_in_every_scope_never_forgotten_or_replaced_text(
    store: Store,
) -> None:
    ada = store.session({"user_id": "find-text-ada"}, embedder=EMBEDDER)
    bob = store.session({"user_id": "find-text-bob"}, embedder=EMBEDDER)
    best = ada.remember("The zebrafish tank is cleaned by zebrafish keepers.").records[0].id
    other = bob.remember("Bob feeds the zebrafish at noon.").records[0].id
    replaced = bob.remember("Bob's zebrafish are called Kip.").records[0].id
    bob.revise(replaced, text="Bob's goldfish are called Kip.")
    gone = ada.remember("Ada's zebrafish secret: quokkaplan.").records[0].id
    ada.forget(gone)

    found = find_by_text(store.pool, "zebrafish")
    assert [h.record_id for h in found.hits] == [best, other], "best ranked first"
    assert {h.scope.user_id for h in found.hits} == {"find-text-ada", "find-text-bob"}
    assert ("zebrafish", True) in found.hits[1].snippet
    assert found.hits[1].snippet_text == "Bob feeds the zebrafish at noon."
    assert find_by_text(store.pool, "quokkaplan").hits == []
    assert find_by_text(store.pool, "Kip zebrafish").hits == [], "only the current text"
    assert [h.record_id for h in find_by_text(store.pool, "goldfish Kip").hits] == [replaced]
    assert find_by_text(store.pool, '"zebrafish at noon"').hits[0].record_id == other
    assert [h.record_id for h in find_by_text(store.pool, "zebrafish -noon").hits] == [best]
    capped = find_by_text(store.pool, "zebrafish", limit=1)
    assert len(capped.hits) == 1 and capped.more


@pytest.mark.parametrize("bad", ["", "   ", "a\x00b", "w" * (MAX_FIND_TEXT_CHARS + 1)])
def test_an_empty_or_too_long_query_is_an_invalid_request(store: Store, bad: str) -> None:
    with pytest.raises(InvalidRequestError):
        find_by_text(store.pool, bad)
    with pytest.raises(InvalidRequestError):
        find_by_id(store.pool, bad if len(bad) < 100 else "i" * 201)


def test_a_snippet_marks_the_matched_words_and_is_bounded() -> None:
    headline = "the \ue000zebrafish\ue001 tank … fed by \ue000zebrafish\ue001 keepers"
    assert snippet(headline) == (
        ("the ", False),
        ("zebrafish", True),
        (" tank … fed by ", False),
        ("zebrafish", True),
        (" keepers", False),
    )
    cut = snippet("x" * 10 + "\ue000" + "y" * 50 + "\ue001" + "z" * 100, limit=40)
    assert cut == (("x" * 10, False), ("y" * 29 + "…", True))
    assert sum(len(text) for text, _ in cut) == 40
