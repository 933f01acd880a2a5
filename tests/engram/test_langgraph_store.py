"""``EngramStore`` held to LangGraph's own store tests, against a real PostgreSQL, a
real valkey-server and a real stream worker (every put goes through the streams).

Adapted from ``libs/checkpoint-postgres/tests/test_store.py`` (langgraph, 2026):
batch order, the batch get/put/search/list ops, basic ops, list_namespaces,
namespace segment boundaries (search and list), an empty prefix, LIKE
metacharacters, search with filters and pagination, vector search with filters,
pagination and edge cases, index paths and ``index=False``, non-ASCII text,
labels with a trailing newline, TTL. Each test has a scope of its own (the
originals had a database of their own), so "every namespace" means the test's.

Left out, and why:
- ``test_escape_like_literal``, ``test_namespace_match_pattern``,
  ``test_nonnull_migrations``: PostgresStore's private helpers; engram compares
  namespace labels whole (jsonb), with no LIKE pattern or regex to escape.
- ``test_scores``, ``test_embed_with_path`` score equalities, and the exact cosine
  scores of ``CharacterEmbeddings``: engram's search is hybrid recall, scored by
  reciprocal rank fusion (``Hit.relevance``), not one distance; the tests assert
  what is found and in which order instead.
- the ``vector_type``/``distance_type`` parametrisations and
  ``test_vector_store_initialization``: the embedding model and the vector storage
  are engram's (its active generation), not the store's ``index`` config.
- ``test_store_ttl``'s sleeps and the ``omit_expired`` switches: engram never
  returns an expired item (``omit_expired`` is always on, nothing to sweep: the
  jobs prune history); TTL is tested on the store's own clock and expiry times.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time
from typing import Any, TypedDict

import orjson
import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from engram.langgraph import EngramStore, ScopeSpanError
from engram.langgraph import items as lg_items
from engram.store import (
    HashingEmbedder,
    InvalidRequestError,
    RevisionConflictError,
    Scope,
    Store,
)
from engram.store.limits import MAX_METADATA_BYTES, MAX_STORED_METADATA_BYTES
from engram.worker import Producer
from tests.helpers import marker_text, rows_containing
from tests.redis_fixtures import FAST, InProcessWorker, wait_until

MakeStore = Callable[..., EngramStore]


@pytest.fixture
def make_store(
    store: Store, redis_url: str, start_worker: Callable[..., InProcessWorker]
) -> Iterator[MakeStore]:
    """``make_store(scope, **options)``: EngramStores on one real worker."""
    embedder = HashingEmbedder(64)
    producers: list[Producer] = []
    with start_worker(store, embedder):

        def make(scope: dict[str, str], **options: Any) -> EngramStore:
            producer = Producer.from_url(redis_url, partitions=FAST.partitions)
            producers.append(producer)
            return EngramStore(store, producer, scope, embedder=embedder, **options)

        yield make
        for producer in producers:
            producer.close()


@pytest.fixture
def lg(make_store: MakeStore, scope: dict[str, str]) -> EngramStore:
    return make_store(scope)


def test_batch_order(lg: EngramStore) -> None:
    lg.put(("test", "foo"), "key1", {"data": "value1"})
    lg.put(("test", "bar"), "key2", {"data": "value2"})
    ops = [
        GetOp(namespace=("test", "foo"), key="key1"),
        PutOp(namespace=("test", "bar"), key="key2", value={"data": "value2"}),
        SearchOp(namespace_prefix=("test",), filter={"data": "value1"}, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        GetOp(namespace=("test",), key="key3"),
    ]
    results = lg.batch(ops)
    assert len(results) == 5
    assert isinstance(results[0], Item)
    assert results[0].value == {"data": "value1"} and results[0].key == "key1"
    assert results[1] is None
    assert isinstance(results[2], list) and len(results[2]) == 1
    assert isinstance(results[3], list) and len(results[3]) > 0
    assert results[4] is None

    reordered = lg.batch(
        [
            SearchOp(namespace_prefix=("test",), filter=None, limit=5, offset=0),
            GetOp(namespace=("test", "bar"), key="key2"),
            ListNamespacesOp(match_conditions=None, max_depth=None, limit=5, offset=0),
            PutOp(namespace=("test",), key="key3", value={"data": "value3"}),
            GetOp(namespace=("test", "foo"), key="key1"),
        ]
    )
    assert len(reordered) == 5
    assert isinstance(reordered[0], list) and len(reordered[0]) >= 2
    assert isinstance(reordered[1], Item) and reordered[1].value == {"data": "value2"}
    assert isinstance(reordered[2], list) and len(reordered[2]) > 0
    assert reordered[3] is None
    assert isinstance(reordered[4], Item) and reordered[4].value == {"data": "value1"}


def test_batch_get_ops(lg: EngramStore) -> None:
    lg.put(("test",), "key1", {"data": "value1"})
    lg.put(("test",), "key2", {"data": "value2"})
    results = lg.batch(
        [GetOp(("test",), "key1"), GetOp(("test",), "key2"), GetOp(("test",), "key3")]
    )
    assert [r.key if isinstance(r, Item) else r for r in results] == ["key1", "key2", None]


def test_batch_put_ops(lg: EngramStore) -> None:
    results = lg.batch(
        [
            PutOp(("test",), "key1", {"data": "value1"}),
            PutOp(("test",), "key2", {"data": "value2"}),
            PutOp(("test",), "key3", None),
        ]
    )
    assert results == [None, None, None]
    item1, item2 = lg.get(("test",), "key1"), lg.get(("test",), "key2")
    assert item1 and item1.value == {"data": "value1"}
    assert item2 and item2.value == {"data": "value2"}
    assert lg.get(("test",), "key3") is None


def test_the_last_put_of_a_key_in_a_batch_wins(lg: EngramStore) -> None:
    lg.batch([PutOp(("t",), "k", {"n": 1}), PutOp(("t",), "k", {"n": 2})])
    assert lg.get(("t",), "k").value == {"n": 2}  # type: ignore[union-attr]
    assert lg.history(("t",), "k") == [{"n": 2}]


def test_batch_search_ops(lg: EngramStore) -> None:
    for namespace, key, value in [
        (("test", "foo"), "key1", {"data": "value1", "tag": "a"}),
        (("test", "bar"), "key2", {"data": "value2", "tag": "a"}),
        (("test", "baz"), "key3", {"data": "value3", "tag": "b"}),
    ]:
        lg.put(namespace, key, value)
    results = lg.batch(
        [
            SearchOp(("test",), filter={"tag": "a"}, limit=10, offset=0),
            SearchOp(("test",), filter=None, limit=2, offset=0),
            SearchOp(("test", "foo"), filter=None, limit=10, offset=0),
        ]
    )
    assert len(results[0]) == 2 and all(i.value["tag"] == "a" for i in results[0])
    assert len(results[1]) == 2
    assert [i.namespace for i in results[2]] == [("test", "foo")]


def test_batch_list_namespaces_ops(lg: EngramStore) -> None:
    data = [
        (("test", "documents", "public"), "doc1", {"content": "public doc"}),
        (("test", "documents", "private"), "doc2", {"content": "private doc"}),
        (("test", "images", "public"), "img1", {"content": "public image"}),
        (("prod", "documents", "public"), "doc3", {"content": "prod doc"}),
    ]
    for namespace, key, value in data:
        lg.put(namespace, key, value)
    results = lg.batch(
        [
            ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
            ListNamespacesOp(match_conditions=None, max_depth=2, limit=10, offset=0),
            ListNamespacesOp(
                match_conditions=(MatchCondition("suffix", ("public",)),), limit=10, offset=0
            ),
        ]
    )
    assert len(results[0]) == len(data)
    assert results[1] == [("prod", "documents"), ("test", "documents"), ("test", "images")]
    assert sorted(results[2]) == [
        ("prod", "documents", "public"),
        ("test", "documents", "public"),
        ("test", "images", "public"),
    ]


def test_basic_store_ops(lg: EngramStore) -> None:
    namespace = ("test", "documents")
    lg.put(namespace, "doc1", {"title": "Test Document", "content": "Hello, World!"})
    item = lg.get(namespace, "doc1")
    assert item and item.namespace == namespace and item.key == "doc1"
    assert item.value == {"title": "Test Document", "content": "Hello, World!"}

    lg.put(namespace, "doc1", {"title": "Updated Document", "content": "Hello, Updated!"})
    updated = lg.get(namespace, "doc1")
    assert updated and updated.value == {"title": "Updated Document", "content": "Hello, Updated!"}
    assert updated.updated_at > item.updated_at
    assert updated.created_at == item.created_at
    assert lg.get(("test", "other_documents"), "doc1") is None

    lg.delete(namespace, "doc1")
    assert lg.get(namespace, "doc1") is None


def test_list_namespaces(lg: EngramStore) -> None:
    namespaces = [
        ("test", "documents", "public"),
        ("test", "documents", "private"),
        ("test", "images", "public"),
        ("test", "images", "private"),
        ("prod", "documents", "public"),
        ("prod", "documents", "private"),
    ]
    for namespace in namespaces:
        lg.put(namespace, "dummy", {"content": "dummy"})
    assert sorted(lg.list_namespaces()) == sorted(namespaces)
    assert len(lg.list_namespaces(prefix=("test",))) == 4
    assert all(ns[-1] == "public" for ns in lg.list_namespaces(suffix=("public",)))
    assert len(lg.list_namespaces(suffix=("public",))) == 3
    assert all(len(ns) <= 2 for ns in lg.list_namespaces(max_depth=2))
    first, rest = lg.list_namespaces(limit=3), lg.list_namespaces(limit=10, offset=3)
    assert len(first) == 3 and len(rest) == 3 and not set(first) & set(rest)
    assert lg.list_namespaces(prefix=("test", "*", "public")) == [
        ("test", "documents", "public"),
        ("test", "images", "public"),
    ]
    for namespace in namespaces:
        lg.delete(namespace, "dummy")
    assert lg.list_namespaces() == []


def _namespaces(lg: EngramStore, prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
    return {item.namespace for item in lg.search(prefix, limit=100)}


def test_search_namespace_segment_boundary(lg: EngramStore) -> None:
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foo", "child", "deep"),
        ("foobar",),
        ("foobar", "baz"),
        ("foo2",),
    ]:
        lg.put(namespace, "k", {"v": 1})
    assert _namespaces(lg, ("foo",)) == {("foo",), ("foo", "child"), ("foo", "child", "deep")}
    assert _namespaces(lg, ("foobar",)) == {("foobar",), ("foobar", "baz")}
    assert _namespaces(lg, ("foo", "child")) == {("foo", "child"), ("foo", "child", "deep")}
    assert _namespaces(lg, ("foo2",)) == {("foo2",)}
    assert _namespaces(lg, ("fo",)) == set()


def test_search_empty_prefix_is_unconstrained(lg: EngramStore) -> None:
    for namespace in [("a",), ("b", "c"), ("d", "e", "f")]:
        lg.put(namespace, "k", {"v": 1})
    assert _namespaces(lg, ()) == {("a",), ("b", "c"), ("d", "e", "f")}


def test_search_namespace_like_metacharacters(lg: EngramStore) -> None:
    for namespace in [
        ("user_1",),
        ("user_1", "child"),
        ("userX1",),
        ("a%b",),
        ("axxb",),
        ("back\\slash",),
        ("back\\\\slash",),
    ]:
        lg.put(namespace, "k", {"v": 1})
    assert _namespaces(lg, ("user_1",)) == {("user_1",), ("user_1", "child")}
    assert _namespaces(lg, ("a%b",)) == {("a%b",)}
    assert _namespaces(lg, ("back\\slash",)) == {("back\\slash",)}
    assert set(lg.list_namespaces(prefix=("user_1",))) == {("user_1",), ("user_1", "child")}


def test_list_namespaces_segment_boundary(lg: EngramStore) -> None:
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foobar",),
        ("foobar", "baz"),
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
        ("uid", "a", "b", "alice"),
    ]:
        lg.put(namespace, "k", {"v": 1})
    assert set(lg.list_namespaces(prefix=("foo",), limit=100)) == {("foo",), ("foo", "child")}
    assert set(lg.list_namespaces(suffix=("alice",), limit=100)) == {
        ("uid", "users", "alice"),
        ("uid", "a", "b", "alice"),
    }
    assert set(lg.list_namespaces(prefix=("uid", "*", "alice"), limit=100)) == {
        ("uid", "users", "alice")
    }
    assert set(lg.list_namespaces(prefix=("uid",), limit=100)) == {
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
        ("uid", "a", "b", "alice"),
    }


def test_search(lg: EngramStore) -> None:
    data = [
        (
            ("test", "docs"),
            "doc1",
            {"title": "First Doc", "author": "Alice", "tags": ["important"]},
        ),
        (("test", "docs"), "doc2", {"title": "Second Doc", "author": "Bob", "tags": ["draft"]}),
        (("test", "images"), "img1", {"title": "Image 1", "author": "Alice", "tags": ["final"]}),
    ]
    for namespace, key, value in data:
        lg.put(namespace, key, value)
    assert len(lg.search(("test",))) == 3
    docs = lg.search(("test", "docs"))
    assert len(docs) == 2 and all(i.namespace == ("test", "docs") for i in docs)
    alice = lg.search(("test",), filter={"author": "Alice"})
    assert {i.key for i in alice} == {"doc1", "img1"}
    assert len(lg.search(("test",), limit=2)) == 2
    assert len(lg.search(("test",), offset=2)) == 1
    # Newest first, as LangGraph lists: pages follow one another.
    pages = [i.key for n in range(3) for i in lg.search(("test",), limit=1, offset=n)]
    assert pages == ["img1", "doc2", "doc1"]
    for namespace, key, _ in data:
        lg.delete(namespace, key)
    assert lg.search(("test",)) == []


def test_numbers_compare_as_numbers(lg: EngramStore) -> None:
    """LangGraph issue #7684: PostgresStore compares the value's numbers as text, so
    10 is not greater than 9 there. Here it is."""
    for n in (2, 9, 10, 100, 9.5):
        lg.put(("scores",), f"k{n}", {"score": n, "name": f"n{n}"})
    lg.put(("scores",), "text", {"score": "99", "name": "text"})

    def keys(flt: dict[str, Any]) -> set[str]:
        return {i.key for i in lg.search(("scores",), filter=flt, limit=100)}

    assert keys({"score": {"$gt": 9}}) == {"k10", "k100", "k9.5"}
    assert keys({"score": {"$gte": 9}}) == {"k9", "k10", "k100", "k9.5"}
    assert keys({"score": {"$lt": 10}}) == {"k2", "k9", "k9.5"}
    assert keys({"score": {"$lte": 10, "$gt": 2}}) == {"k9", "k10", "k9.5"}
    assert keys({"score": 10}) == {"k10"}
    assert keys({"score": {"$eq": 10.0}}) == {"k10"}
    assert keys({"score": {"$ne": 10}}) == {"k2", "k9", "k100", "k9.5", "text"}
    # a string compares with strings only, by code point
    assert keys({"score": {"$gt": "9"}}) == {"text"}
    assert keys({"missing": {"$ne": 1}}) == keys({})


def test_nested_and_list_equality(lg: EngramStore) -> None:
    lg.put(("n",), "a", {"meta": {"lang": "en", "level": 2}, "tags": ["x", "y"]})
    lg.put(("n",), "b", {"meta": {"lang": "fr", "level": 2}, "tags": ["x"]})

    def keys(flt: dict[str, Any]) -> set[str]:
        return {i.key for i in lg.search(("n",), filter=flt)}

    assert keys({"meta": {"lang": "en"}}) == {"a"}
    assert keys({"meta": {"level": 2}}) == {"a", "b"}
    assert keys({"meta": {"level": {"$gt": 1}, "lang": "fr"}}) == {"b"}
    assert keys({"tags": ["x"]}) == {"b"}


def test_vector_search_with_filters(lg: EngramStore) -> None:
    for key, value in [
        ("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
        ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
        ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
        ("doc4", {"text": "blue car", "color": "blue", "score": 3.5}),
    ]:
        lg.put(("test",), key, value)
    results = lg.search(("test",), query="apple", filter={"color": "red"})
    assert [r.key for r in results][:1] == ["doc1"] and len(results) <= 2
    results = lg.search(("test",), query="car", filter={"color": "red"})
    assert [r.key for r in results][:1] == ["doc2"]
    results = lg.search(("test",), query="blue", filter={"score": {"$gt": 3.2}})
    assert results[0].key == "doc4" and {r.key for r in results} <= {"doc1", "doc3", "doc4"}
    results = lg.search(("test",), query="apple", filter={"score": {"$gte": 4.0}, "color": "green"})
    assert [r.key for r in results] == ["doc3"]
    assert all(r.score is not None and 0 < r.score <= 1 for r in results)


def test_vector_search_pagination(lg: EngramStore) -> None:
    for i in range(5):
        lg.put(("test",), f"doc{i}", {"text": f"test document number {i}"})
    page1 = lg.search(("test",), query="test", limit=2)
    page2 = lg.search(("test",), query="test", limit=2, offset=2)
    assert len(page1) == 2 and len(page2) == 2
    assert not {r.key for r in page1} & {r.key for r in page2}
    assert len(lg.search(("test",), query="test", limit=10)) == 5


def test_vector_search_edge_cases(lg: EngramStore) -> None:
    lg.put(("test",), "doc1", {"text": "test document"})
    assert len(lg.search(("test",), query="")) == 1
    assert len(lg.search(("test",), query=None)) == 1
    assert len(lg.search(("test",), query="test " * 100)) == 1
    assert len(lg.search(("test",), query="test!@#$%^&*()")) == 1


def test_index_paths_and_index_false(lg: EngramStore, store: Store, scope: dict) -> None:
    """The record's text is what search reads: the index paths' texts (LangGraph's
    path syntax), the whole value by default, a placeholder for ``index=False``."""
    lg.put(("test",), "doc3", {"key0": "aaa", "key1": "bbb", "key2": "ccc"}, index=["key0", "key1"])
    lg.put(("test",), "doc4", {"key0": "eee", "key1": "bbb", "key3": "ggg"}, index=["key1", "key3"])
    lg.put(
        ("test",),
        "nested",
        {"a": {"b": "deep"}, "list": ["first", "second"]},
        index=["a.b", "list[0]"],
    )
    lg.put(("test",), "whole", {"text": "zebra"})
    lg.put(("test",), "doc5", {"key0": "hhh", "key1": "iii"}, index=False)

    def text(key: str) -> str:
        record = store.get(scope, lg_items.record_id(Scope.of(scope), ("test",), key))
        assert record is not None
        return record.text

    assert text("doc3") == "aaa\nbbb"
    assert text("nested") == "deep\nfirst"
    assert text("whole") == '{"text": "zebra"}'
    assert text("doc5") == lg_items.UNINDEXED_TEXT
    assert lg.search(("test",), query="aaa")[0].key == "doc3"
    assert lg.search(("test",), query="ggg")[0].key == "doc4"
    assert {r.key for r in lg.search(("test",), query="bbb")[:2]} == {"doc3", "doc4"}
    assert all(r.key != "doc5" for r in lg.search(("test",), query="hhh", limit=100))
    # not searchable by query, but listed, and got
    listed = lg.search(("test",), limit=100)
    assert "doc5" in {r.key for r in listed} and all(r.score is None for r in listed)
    assert lg.get(("test",), "doc5").value == {"key0": "hhh", "key1": "iii"}  # type: ignore[union-attr]


def test_non_ascii(lg: EngramStore) -> None:
    texts = ["这是中文", "これは日本語です", "이건 한국어야", "Это русский", "यह रूसी है"]
    for i, text in enumerate(texts, 1):
        lg.put(("user_123", "memories"), str(i), {"text": text})
    for i, text in enumerate(texts, 1):
        assert lg.search(("user_123", "memories"), query=text)[0].key == str(i)
    lg.put(("日本", "ü"), "ключ", {"v": "é"})
    assert lg.get(("日本", "ü"), "ключ").value == {"v": "é"}  # type: ignore[union-attr]
    assert lg.list_namespaces(prefix=("日本",)) == [("日本", "ü")]


def test_datetimes_in_a_value_are_kept_as_orjson_writes_them(
    lg: EngramStore, store: Store, scope: dict
) -> None:
    """A datetime, date, time or UUID in a value is kept as its ISO 8601 (or UUID) text,
    as orjson writes it (LangGraph's stores read values with orjson); it comes back as
    that string, and search finds the item. What JSON cannot hold is a typed refusal
    that writes nothing."""
    value = {
        "text": "Ada's dentist appointment",
        "at": datetime(2026, 12, 7, 9, 30, tzinfo=UTC),
        "on": date(2026, 12, 7),
        "nested": [{"seen": datetime(2026, 1, 2, 3, 4, 5, 6)}, time(9, 30)],
        "id": uuid.UUID(int=7),
    }
    lg.put(("events",), "dentist", value)
    kept = lg.get(("events",), "dentist")
    assert kept is not None and kept.value == orjson.loads(orjson.dumps(value))
    assert kept.value["at"] == "2026-12-07T09:30:00+00:00"
    assert lg.search(("events",), query="dentist appointment")[0].key == "dentist"
    before = store.scope_revision(scope)
    for bad in ({"tags": {"a", "b"}}, {"blob": b"x"}, {"ratio": float("nan")}):
        with pytest.raises(InvalidRequestError, match="value"):
            lg.put(("events",), "bad", bad)
    assert store.scope_revision(scope) == before
    assert lg.get(("events",), "bad") is None


def test_namespace_labels_with_trailing_newline(lg: EngramStore) -> None:
    lg.put(("users", "alice"), "k", {"v": 1})
    lg.put(("users", "alice\n"), "k", {"v": 2})
    assert set(lg.list_namespaces(suffix=("alice",), limit=100)) == {("users", "alice")}
    assert set(lg.list_namespaces(prefix=("users", "alice"), limit=100)) == {("users", "alice")}
    assert [i.value for i in lg.search(("users", "alice"))] == [{"v": 1}]
    assert [i.value for i in lg.search(("users", "alice\n"))] == [{"v": 2}]


def test_labels_are_checked_in_batch_too(lg: EngramStore) -> None:
    """A label with a period could address another namespace once joined: refused
    even in ops given to batch directly, before anything is written."""
    with pytest.raises(InvalidNamespaceError):
        lg.batch([PutOp(("ok",), "k", {"v": 1}), PutOp(("a.b",), "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError):
        lg.batch([PutOp(("langgraph",), "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError):
        lg.batch([SearchOp(("a", ""))])
    assert lg.get(("ok",), "k") is None


# -- engram's revisions, conflicts, read-your-writes -----------------------------------


def test_every_put_is_a_revision_and_delete_retracts(
    lg: EngramStore, store: Store, scope: dict
) -> None:
    lg.put(("prefs",), "food", {"likes": "tea"})
    lg.put(("prefs",), "food", {"likes": "green tea"})
    lg.delete(("prefs",), "food")
    lg.delete(("prefs",), "food")  # nothing to retract: no write
    lg.put(("prefs",), "food", {"likes": "coffee"})
    assert lg.history(("prefs",), "food") == [
        {"likes": "tea"},
        {"likes": "green tea"},
        None,
        {"likes": "coffee"},
    ]
    rid = lg_items.record_id(Scope.of(scope), ("prefs",), "food")
    kinds = [r.kind for r in reversed(store.receipts(scope=scope, record_id=rid))]
    assert kinds == ["remember", "revise", "retract", "revise"]
    assert all(r.requested_by == "langgraph" for r in store.receipts(scope=scope))


def test_forget_erases_and_the_key_stays_forgotten(lg: EngramStore) -> None:
    lg.put(("prefs",), "secret", {"pin": "1234"})
    receipt = lg.forget(("prefs",), "secret")
    assert receipt.kind == "forget" and receipt.revisions == (1,)
    assert lg.get(("prefs",), "secret") is None
    assert lg.history(("prefs",), "secret") == []
    with pytest.raises(RevisionConflictError, match="forgotten"):
        lg.put(("prefs",), "secret", {"pin": "0000"})


def _document(size: int, marker: str = "") -> dict[str, Any]:
    """A document of ``size`` characters of body: prose with quotes, backslashes,
    newlines, tabs, control characters and non-ASCII, all of which JSON escapes or
    encodes at more than a byte, and ``marker`` once in its title and its body."""
    piece = 'Ada said "Lyon" \\ 里昂 — naïve\tcafé\n\x01 '
    body = (piece * (size // len(piece) + 1))[:size]
    return {
        "title": f"Report on Lyon {marker}".strip(),
        "body": body[: size // 2] + marker + body[size // 2 :],
        "pages": list(range(50)),
    }


def test_a_document_value_round_trips_put_get_search_exactly(lg: EngramStore) -> None:
    """A value far over the 16,000 bytes the doors take as metadata (a 200 KB document,
    over 300 KB as JSON) is put, revised, got and found by search exactly as given:
    the LangGraph store asks for MAX_STORED_METADATA_BYTES and the worker takes it."""
    doc = _document(200_000)
    assert len(lg_items.json_value(doc)["body"].encode()) > 200_000
    lg.put(("docs",), "report", doc, index=["title"])
    got = lg.get(("docs",), "report")
    assert got is not None and got.value == doc
    revised = {**doc, "body": doc["body"][::-1]}
    lg.put(("docs",), "report", revised, index=["title"])  # a revise carries it too
    assert lg.get(("docs",), "report").value == revised  # type: ignore[union-attr]
    [found] = lg.search(("docs",), query="report on Lyon")
    assert found.key == "report" and found.value == revised
    assert [i.value for i in lg.search(("docs",))] == [revised]
    assert lg.history(("docs",), "report") == [doc, revised]


def test_a_value_over_the_bound_is_refused_and_nothing_is_written(
    lg: EngramStore, store: Store, scope: dict, redis_url: str
) -> None:
    """A value whose item is over MAX_STORED_METADATA_BYTES is an InvalidRequestError
    naming the bound, on a new key and on a known one, and nothing is written; the
    doors' bound (16,000 bytes, a Producer's default) is unchanged."""
    lg.put(("docs",), "known", {"v": 1})
    before = store.scope_revision(scope)
    too_big = _document(MAX_STORED_METADATA_BYTES)  # every character a byte or more
    for key in ("new", "known"):
        with pytest.raises(
            InvalidRequestError, match=f"an item is larger than {MAX_STORED_METADATA_BYTES} bytes"
        ):
            lg.put(("docs",), key, too_big, index=False)
    assert store.scope_revision(scope) == before
    assert lg.get(("docs",), "new") is None
    assert lg.get(("docs",), "known").value == {"v": 1}  # type: ignore[union-attr]
    door = f"larger than {MAX_METADATA_BYTES}"
    with (
        Producer.from_url(redis_url, partitions=FAST.partitions) as producer,
        pytest.raises(InvalidRequestError, match=door),
    ):
        producer.remember(scope, "a note", metadata={"blob": "x" * MAX_METADATA_BYTES})
    assert store.scope_revision(scope) == before


def test_forgetting_a_document_leaves_its_text_in_no_table(lg: EngramStore, dsn: str) -> None:
    """A forget of a document-sized item (two revisions) leaves its text in no table:
    not in the records, revisions, full-text index, vectors' rows nor receipts."""
    marker = marker_text()
    lg.put(("docs",), "secret", _document(100_000, marker), index=["title"])
    lg.put(("docs",), "secret", _document(120_000, marker), index=["title"])
    with psycopg.connect(dsn) as conn:
        assert rows_containing(conn, marker), "the scan finds the text before the forget"
    lg.forget(("docs",), "secret")
    with psycopg.connect(dsn) as conn:
        assert rows_containing(conn, marker) == []
    assert lg.get(("docs",), "secret") is None


def test_another_scope_holding_a_keys_id_never_blocks_the_key(
    make_store: MakeStore, store: Store, redis_url: str, scope: dict
) -> None:
    """A record id is its scope's (issue 36 item 3): an item's id is computable by
    anyone (``lg_`` and a hash of scope, namespace and key), yet ada holding, or having
    forgotten, the id of bob's future key neither blocks bob's put nor reaches it:
    each scope's record of that id is its own."""
    ada, bob = {"user_id": f"{scope['user_id']}-ada"}, {"user_id": f"{scope['user_id']}-bob"}
    diagnosis = lg_items.record_id(Scope.of(bob), ("notes",), "diagnosis")
    plan = lg_items.record_id(Scope.of(bob), ("notes",), "plan")
    with Producer.from_url(redis_url, partitions=FAST.partitions) as producer:
        producer.remember(ada, "Ada's squat.", id=diagnosis).wait(10)
        producer.remember(ada, "Ada's other squat.", id=plan).wait(10)
        producer.forget(ada, plan).wait(10)
    bobs = make_store(bob)
    bobs.put(("notes",), "diagnosis", {"text": "flu"})
    bobs.put(("notes",), "plan", {"text": "rest"})
    assert bobs.get(("notes",), "diagnosis").value == {"text": "flu"}  # type: ignore[union-attr]
    assert bobs.get(("notes",), "plan").value == {"text": "rest"}  # type: ignore[union-attr]
    adas = store.get(ada, diagnosis)
    assert adas is not None and adas.text == "Ada's squat." and adas.revision == 1
    assert store.get(ada, plan) is None and store.history(ada, plan) == []
    assert [r.revision for r in store.history(bob, diagnosis)] == [1]


def test_a_concurrent_writer_is_never_silently_overwritten(
    make_store: MakeStore, scope: dict
) -> None:
    """Two store objects on one scope: the one that saw an old revision still wins
    (LangGraph's last writer wins), and the history keeps the write it followed."""
    a, b = make_store(scope), make_store(scope)
    a.put(("shared",), "k", {"v": "a1"})
    assert b.get(("shared",), "k").value == {"v": "a1"}  # type: ignore[union-attr]
    a.put(("shared",), "k", {"v": "a2"})
    b.put(("shared",), "k", {"v": "b"})  # planned on revision 1: conflicts, sent again
    assert a.get(("shared",), "k").value == {"v": "b"}  # type: ignore[union-attr]
    assert a.history(("shared",), "k") == [{"v": "a1"}, {"v": "a2"}, {"v": "b"}]
    a.delete(("shared",), "k")
    b.delete(("shared",), "k")  # b saw it live: its retract conflicts, then finds it gone
    assert b.history(("shared",), "k")[-1] is None


def test_a_get_after_a_put_sees_it(make_store: MakeStore, scope: dict) -> None:
    """Read-your-writes through the streams: each put returns after its receipt."""
    lg = make_store(scope)
    for n in range(20):
        lg.put(("ryw",), "k", {"n": n})
        assert lg.get(("ryw",), "k").value == {"n": n}  # type: ignore[union-attr]
        assert [i.value for i in lg.search(("ryw",))] == [{"n": n}]


# -- TTL ---------------------------------------------------------------------------------


def _expires(store: Store, scope: dict, namespace: tuple[str, ...], key: str) -> Any:
    record = store.get(
        scope, lg_items.record_id(Scope.of(scope), namespace, key), include_expired=True
    )
    assert record is not None
    return record.expires_at


def test_ttl_is_engrams_and_a_read_refreshes_it(lg: EngramStore, store: Store, scope: dict) -> None:
    lg.put(("ttl",), "k", {"v": 1}, ttl=0.2)  # 12 s: a refresh is due after 1.2 s
    first = _expires(store, scope, ("ttl",), "k")
    assert first is not None
    # A read refreshes the expiry once a tenth of the TTL (at least a second) has passed.
    lg.get(("ttl",), "k", refresh_ttl=False)
    assert _expires(store, scope, ("ttl",), "k") == first
    lg.get(("ttl",), "k")  # too soon: no refresh
    assert _expires(store, scope, ("ttl",), "k") == first
    wait_until(
        lambda: lg.get(("ttl",), "k") and _expires(store, scope, ("ttl",), "k") > first,
        timeout=10,
        what="a read to refresh the TTL",
    )
    second = _expires(store, scope, ("ttl",), "k")
    wait_until(
        lambda: lg.search(("ttl",)) and _expires(store, scope, ("ttl",), "k") > second,
        timeout=10,
        what="a search to refresh the TTL",
    )
    # the refreshes are revisions, but not values of their own
    assert lg.history(("ttl",), "k") == [{"v": 1}]


def test_an_expired_item_is_gone_and_its_key_can_be_put_again(lg: EngramStore) -> None:
    lg.put(("ttl",), "short", {"v": 1}, ttl=0.002)  # 120 ms
    lg.put(("ttl",), "long", {"v": 2})
    wait_until(lambda: lg.get(("ttl",), "short") is None, timeout=10, what="the expiry")
    assert [i.key for i in lg.search(("ttl",))] == ["long"]
    lg.delete(("ttl",), "short")  # gone already: nothing to do
    lg.put(("ttl",), "short", {"v": 3})  # revives the record, with no expiry now
    assert lg.get(("ttl",), "short").value == {"v": 3}  # type: ignore[union-attr]
    assert lg.history(("ttl",), "short") == [{"v": 1}, {"v": 3}]


def test_default_ttl_from_the_config(make_store: MakeStore, store: Store, scope: dict) -> None:
    lg = make_store(scope, ttl={"default_ttl": 5, "refresh_on_read": False})
    lg.put(("ttl",), "k", {"v": 1})
    assert _expires(store, scope, ("ttl",), "k") is not None
    lg.put(("ttl",), "k2", {"v": 1}, ttl=None)
    assert _expires(store, scope, ("ttl",), "k2") is None


# -- namespaces and scopes -------------------------------------------------------------


def test_namespaces_map_to_scopes(make_store: MakeStore, store: Store, scope: dict) -> None:
    ada, bob = f"ada-{uuid.uuid4().hex[:8]}", f"bob-{uuid.uuid4().hex[:8]}"
    lg = make_store(scope, scopes=[(("memories", "{user_id}"), {"user_id": "{user_id}"})])
    lg.put(("memories", ada), "food", {"likes": "tea"})
    lg.put(("memories", ada, "work"), "job", {"is": "engineer"})
    lg.put(("memories", bob), "food", {"likes": "coffee"})
    lg.put(("app",), "settings", {"theme": "dark"})

    assert lg.scope_of(("memories", ada)) == Scope(user_id=ada)
    assert [r.metadata["langgraph"]["key"] for r in store.records({"user_id": bob})] == ["food"]
    assert len(store.records({"user_id": ada})) == 2
    assert [r.metadata["langgraph"]["key"] for r in store.records(scope)] == ["settings"]

    assert {i.key for i in lg.search(("memories", ada))} == {"food", "job"}
    assert [i.value for i in lg.search(("memories", bob), query="coffee")] == [{"likes": "coffee"}]
    assert lg.list_namespaces(prefix=("memories", ada)) == [
        ("memories", ada),
        ("memories", ada, "work"),
    ]
    assert [i.key for i in lg.search(("app",))] == ["settings"]
    # A prefix that reaches several scopes is refused, saying how to narrow it.
    with pytest.raises(ScopeSpanError, match="several scopes"):
        lg.search(("memories",))
    with pytest.raises(ScopeSpanError):
        lg.list_namespaces()
    with pytest.raises(ScopeSpanError):
        lg.list_namespaces(prefix=("memories", "*"))


# -- async, and a real graph ------------------------------------------------------------


def test_async_methods(lg: EngramStore) -> None:
    async def run() -> None:
        await lg.aput(("a",), "k", {"v": 1})
        item = await lg.aget(("a",), "k")
        assert item is not None and item.value == {"v": 1}
        assert [i.key for i in await lg.asearch(("a",))] == ["k"]
        assert await lg.alist_namespaces() == [("a",)]
        await lg.adelete(("a",), "k")
        assert await lg.aget(("a",), "k") is None

    asyncio.run(run())


class _State(TypedDict):
    user: str
    fact: str
    recalled: list[str]


def test_a_state_graph_keeps_its_memory_in_engram(make_store: MakeStore, scope: dict) -> None:
    def remember(state: _State, *, store: BaseStore) -> dict[str, Any]:
        store.put(("memories", state["user"]), uuid.uuid4().hex, {"fact": state["fact"]})
        return {}

    def recall(state: _State, *, store: BaseStore) -> dict[str, Any]:
        found = store.search(("memories", state["user"]), query=state["fact"], limit=5)
        return {"recalled": [i.value["fact"] for i in found]}

    builder = StateGraph(_State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    user = f"ada-{uuid.uuid4().hex[:8]}"
    with make_store(scope, scopes=[(("memories", "{user}"), {"user_id": "{user}"})]) as lg:
        graph = builder.compile(store=lg)
        first = graph.invoke({"user": user, "fact": "Ada drinks green tea", "recalled": []})
        assert first["recalled"] == ["Ada drinks green tea"]
        second = graph.invoke({"user": user, "fact": "Ada lives in Lyon", "recalled": []})
        assert second["recalled"][0] == "Ada lives in Lyon"
        assert set(second["recalled"]) == {"Ada drinks green tea", "Ada lives in Lyon"}
        assert len(lg.list_namespaces(prefix=("memories", user))) == 1


def test_from_env_finds_the_servers_as_every_engram_command_does(
    store: Store,
    dsn: str,
    redis_url: str,
    start_worker: Callable[..., InProcessWorker],
    scope: dict,
) -> None:
    env = {"DATABASE_URL": dsn, "REDIS_URL": redis_url, "ENGRAM_PARTITIONS": str(FAST.partitions)}
    with (
        start_worker(store, HashingEmbedder(64)),
        EngramStore.from_env(scope=scope, env=env) as lg,
    ):
        lg.put(("notes",), "n1", {"text": "the boiler is serviced in May"})
        # the query is embedded with the active generation's model, found by its id
        assert [i.key for i in lg.search(("notes",), query="boiler service")] == ["n1"]
