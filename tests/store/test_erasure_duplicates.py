"""A write the model judged a duplicate keeps its text only in its receipt: a forget of
the record it duplicates erases it there too, and leaves it in no table."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from engram.store import HashingEmbedder, Operation, Store
from engram.store.read.dump import ReceiptEntry, dump_scope
from tests.fake_llm import ScriptedLLM, events, facts
from tests.helpers import marker_text, rows_containing

EMBEDDER = HashingEmbedder(64)
MARKER = marker_text(17)


def anywhere(conn: psycopg.Connection[Any], marker: str) -> list[str]:
    """Every column of every table holding ``marker``: text, jsonb, arrays, tsvectors
    (``rows_containing``) and bytea."""
    found = rows_containing(conn, marker)
    for table, column in conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'public' AND data_type = 'bytea'"
    ).fetchall():
        count = conn.execute(
            f'SELECT count(*) FROM "{table}" WHERE position(%s::bytea IN "{column}") > 0',
            (marker.encode(),),
        ).fetchone()
        if count and count[0]:
            found.append(f"{table}.{column}")
    return found


def exported(store: Store, scope: dict[str, str]) -> str:
    return json.dumps(
        [
            {"receipt": item.receipt.as_dict(), "request": item.request}
            for item in dump_scope(store, scope)
            if isinstance(item, ReceiptEntry)
        ]
    )


def test_a_forget_erases_the_text_of_every_write_judged_its_duplicate(
    fresh_store: Store, fresh_dsn: str
) -> None:
    scope = {"user_id": "ada"}
    fact = f"Ada's locker code is {MARKER}."
    llm = ScriptedLLM(
        reconcile=[
            events({"event": "NOOP", "id": "0"}),  # a paraphrase: nothing to add
            events({"event": "ADD", "text": fact.upper()}),  # the record's own text: kept
            events({"event": "NOOP"}),  # the extracted fact, a NOOP naming nothing
        ],
        extract=facts({"text": f"Ada uses locker code {MARKER}.", "sources": ["s0"]}),
    )
    mem = fresh_store.session(scope, embedder=EMBEDDER, llm=llm)
    first = mem.remember(fact, supersede="add")
    record = first.records[0]
    other = mem.remember("Ada likes tea.", supersede="add").records[0]
    noop = mem.remember(f"Ada's code for the locker: {MARKER}.")
    keep = mem.remember(f"Remember that Ada's locker code is {MARKER}")
    extract = mem.extract(
        [{"id": "m1", "message": {"role": "user", "content": f"my locker is {MARKER}"}}]
    )
    assert llm.calls == 4 and noop.records == keep.records == extract.records == ()
    with psycopg.connect(fresh_dsn) as conn:
        assert "engram_receipts.request" in anywhere(conn, MARKER)
    # What a receipt wrote is unchanged: the duplicates wrote nothing.
    wrote = fresh_store.receipts(record_id=record.id)
    assert [r.operation_id for r in wrote] == [first.receipt.operation_id]

    forget = mem.forget(record.id)

    with psycopg.connect(fresh_dsn) as conn:
        assert anywhere(conn, MARKER) == []
    assert MARKER not in exported(fresh_store, scope)
    receipts = {r.operation_id: r for r in fresh_store.receipts(scope=scope)}
    for result in (noop, keep, extract):
        stored = receipts[result.receipt.operation_id]
        assert stored.redacted and stored.records == ()
    assert not receipts[forget.receipt.operation_id].redacted
    assert mem.get(other.id).text == "Ada likes tea."  # type: ignore[union-attr]


def test_a_duplicate_whose_record_is_forgotten_while_the_model_answers_keeps_no_text(
    fresh_store: Store, fresh_dsn: str
) -> None:
    scope = {"user_id": "ada"}
    other = fresh_store.session(scope, embedder=EMBEDDER)
    record: dict[str, str] = {}

    def forget_then_answer(prompt: Any) -> str:
        other.forget(record["id"])
        return events({"event": "NOOP", "id": "0"})

    mem = fresh_store.session(
        scope, embedder=EMBEDDER, llm=ScriptedLLM(reconcile=forget_then_answer)
    )
    record["id"] = mem.remember(f"Ada's locker code is {MARKER}.").records[0].id
    late = mem.remember(f"Ada's code for the locker: {MARKER}.")
    assert late.receipt.redacted and late.records == ()
    with psycopg.connect(fresh_dsn) as conn:
        assert anywhere(conn, MARKER) == []


def test_a_forget_in_the_same_batch_erases_the_duplicate_before_it(
    fresh_store: Store, fresh_dsn: str
) -> None:
    scope = {"user_id": "ada"}
    mem = fresh_store.session(scope, embedder=EMBEDDER)
    rid = mem.remember(f"Ada's locker code is {MARKER}.").records[0].id
    llm = ScriptedLLM(reconcile=events({"event": "NOOP"}))
    results = fresh_store.execute(
        [
            Operation.build("remember", scope, {"text": f"Ada's code, {MARKER}."}),
            Operation.build("forget", scope, {"id": rid}),
        ],
        EMBEDDER,
        llm=llm,
    )
    assert llm.calls == 1
    assert [r.receipt.redacted for r in results] == [True, False]  # type: ignore[union-attr]
    with psycopg.connect(fresh_dsn) as conn:
        assert anywhere(conn, MARKER) == []
        # The tombstone names the forget that made it.
        assert conn.execute("SELECT record_id, operation_id FROM engram_forgotten").fetchall() == [
            (rid, results[1].receipt.operation_id)  # type: ignore[union-attr]
        ]
