"""Filtering records by metadata: the filter read strictly (no server), then its SQL
on a real PostgreSQL, in a listing and inside recall's candidate lists."""

from __future__ import annotations

from typing import Any

import pytest

from engram.store import HashingEmbedder, InvalidRequestError, Operation, Store
from engram.store.limits import CANDIDATES_PER_LIST
from engram.store.read.metadata_filter import Condition, MetadataFilter


def test_a_document_filter_becomes_conditions() -> None:
    parsed = MetadataFilter.parse(
        {"color": "red", "score": {"$gt": 3, "$lte": 9}, "meta": {"lang": "en"}, "tags": ["x"]},
        under=("item",),
    )
    assert parsed.conditions == (
        Condition(("item", "color"), "eq", "red"),
        Condition(("item", "score"), "gt", 3),
        Condition(("item", "score"), "lte", 9),
        Condition(("item", "meta", "lang"), "eq", "en"),
        Condition(("item", "tags"), "eq", ["x"]),
    )
    assert MetadataFilter.parse(None).conditions == ()


@pytest.mark.parametrize(
    ("flt", "says"),
    [
        ("red", "object"),
        ({"a": {"$regex": "x"}}, "unknown filter operator"),
        ({"a": {"$gt": True}}, "number or a string"),
        ({"a": {"$lt": [1]}}, "number or a string"),
        ({"a": {"$gt": float("nan")}}, "finite"),
        ({"a": "x\x00"}, "NUL"),
    ],
)
def test_a_bad_filter_is_refused(flt: Any, says: str) -> None:
    with pytest.raises(InvalidRequestError, match=says):
        MetadataFilter.parse(flt)


def _remember(store: Store, scope: dict, texts_and_metadata: list[tuple[str, dict]]) -> None:
    ops = [
        Operation.build("remember", scope, {"text": t, "metadata": m, "supersede": "add"})
        for t, m in texts_and_metadata
    ]
    store.execute(ops, HashingEmbedder(64))


def test_numbers_compare_as_numbers_and_strings_as_strings(store: Store, scope: dict) -> None:
    _remember(store, scope, [(f"n {n}", {"n": n}) for n in (2, 9, 10, 100)] + [("s", {"n": "10"})])

    def texts(flt: dict) -> set[str]:
        found = store.records(scope, metadata=MetadataFilter.parse(flt), limit=100)
        return {r.text for r in found}

    assert texts({"n": {"$gt": 9}}) == {"n 10", "n 100"}  # as text, "10" < "9"
    assert texts({"n": {"$gte": 9, "$lt": 100}}) == {"n 9", "n 10"}
    assert texts({"n": 10}) == {"n 10"}
    assert texts({"n": {"$ne": 10}}) == {"n 2", "n 9", "n 100", "s"}
    assert texts({"n": {"$gt": "1"}}) == {"s"}
    assert texts({"other": {"$ne": 1}}) == texts({})


def test_recall_takes_its_candidates_among_the_filtered_records(store: Store, scope: dict) -> None:
    """More records than a list's candidates share the words: the filter is applied
    before the lists are cut, so the filtered records are all found."""
    many = CANDIDATES_PER_LIST + 20
    _remember(
        store,
        scope,
        [
            (f"the garden note {i}", {"tag": "wanted" if i % 20 == 0 else "other"})
            for i in range(many)
        ],
    )
    hits = store.recall(
        scope,
        "garden note",
        embedder=HashingEmbedder(64),
        top_k=100,
        metadata=MetadataFilter.parse({"tag": "wanted"}),
    )
    assert sorted(h.record.text for h in hits) == sorted(
        f"the garden note {i}" for i in range(0, many, 20)
    )


def _alias_loops(plan: dict[str, Any], alias: str) -> list[int]:
    """How many times each scan of ``alias`` ran, over the whole plan tree."""
    own = [plan["Actual Loops"]] if plan.get("Alias") == alias else []
    return own + [n for child in plan.get("Plans", []) for n in _alias_loops(child, alias)]


def test_a_filtered_recall_reads_the_filtered_records_once(store: Store, scope: dict) -> None:
    """The records meeting the filter are read once per recall, whatever the number of
    candidates: asked in place, the planner ran the filter as a semi join that read the
    scope's current revisions again for every candidate (issue 37)."""
    from engram.store import Scope
    from engram.store.read.recall import _statement, recall_context

    _remember(
        store,
        scope,
        [(f"the garden note {i}", {"ns": "a" if i % 2 else "b"}) for i in range(300)],
    )
    embedder = HashingEmbedder(64)
    flt = MetadataFilter.parse({"ns": "a"})
    with store.pool.connection() as conn:
        conn.execute("ANALYZE engram_revisions")
        q = recall_context(conn, Scope.of(scope).key).query(
            "garden note", embedder.embed(["garden note"])[0], 10, metadata=flt
        )
        statement = _statement(q)
        assert statement is not None
        sql, params = statement
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
        assert row is not None
        loops = _alias_loops(row[0][0]["Plan"], "m")
        hits = store.recall(scope, "garden note", embedder=embedder, top_k=10, metadata=flt)
    assert loops == [1]
    assert len(hits) == 10
    assert all(h.record.metadata == {"ns": "a"} for h in hits)
