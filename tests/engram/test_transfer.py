"""Export and import against real servers: a round trip into a fresh database gives the
same records, texts, provenance and revision chains; an import run again changes nothing."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engram.cli import main
from engram.store import HashingEmbedder, Store
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST, InProcessWorker

StartWorker = Callable[..., InProcessWorker]
SCOPE = {"user_id": "ada", "agent_id": "export"}
# What must survive a round trip, per revision (ids, timestamps and operation ids
# are the new home's own).
KEPT = (
    "revision",
    "status",
    "text",
    "kind",
    "importance",
    "metadata",
    "origin",
    "sources",
    "links",
    "digest",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))


def fill(store: Store) -> dict[str, str]:
    """A scope with every kind of history: revised, retracted and restored, extracted
    from messages, linked, expiring, forgotten; and another scope's record."""
    mem = store.session(SCOPE, embedder=HashingEmbedder(64))
    a = (
        mem.remember("Ada lives in London.", importance=0.8, metadata={"from": "form"})
        .records[0]
        .id
    )
    mem.revise(a, text="Ada lives in Paris.", expected_revision=1)
    mem.retract(a, expected_revision=2)
    mem.revise(a, text="Ada lives in Lyon.", metadata={"from": "call"}, expected_revision=3)
    b = (
        mem.extract(
            [
                {"id": "m1", "message": {"role": "user", "content": "I drink tea every morning."}},
                {"id": "m2", "message": {"role": "system", "content": "never read"}},
            ],
            links=[{"relation": "about", "id": a}],
        )
        .records[0]
        .id
    )
    c = mem.remember("Ada's train leaves at 9.", ttl_ms=3_600_000).records[0].id
    d = mem.remember("Ada's old phone number.").records[0].id
    mem.revise(d, links=[{"relation": "supersedes", "id": c}], expected_revision=1)
    gone = mem.remember("Ada's secret, to be forgotten.").records[0].id
    mem.forget(gone)
    store.session({"user_id": "someone else"}, embedder=HashingEmbedder(64)).remember("Not Ada's.")
    return {"a": a, "b": b, "c": c, "d": d, "gone": gone}


def export(monkeypatch: pytest.MonkeyPatch, dsn: str, path: Path) -> list[dict[str, Any]]:
    monkeypatch.setenv("DATABASE_URL", dsn)
    assert main(["export", "--scope", json.dumps(SCOPE), "--output", str(path)]) == 0
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_export_file_is_readable_by_its_owner_only(
    monkeypatch: pytest.MonkeyPatch,
    env: None,
    fresh_store: Store,
    fresh_dsn: str,
    tmp_path: Path,
) -> None:
    """It holds every text of the scope: 0600 from its creation, and an existing file
    written over is narrowed to 0600 before the first byte."""
    fill(fresh_store)
    old_umask = os.umask(0o022)
    try:
        export(monkeypatch, fresh_dsn, tmp_path / "new.jsonl")
        (tmp_path / "old.jsonl").write_text("")
        (tmp_path / "old.jsonl").chmod(0o644)
        assert len(export(monkeypatch, fresh_dsn, tmp_path / "old.jsonl")) > 1
    finally:
        os.umask(old_umask)
    for name in ("new.jsonl", "old.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name


def essentials(lines: list[dict[str, Any]]) -> dict[str, Any]:
    records = {
        line["id"]: [{k: r[k] for k in KEPT} for r in line["revisions"]]
        for line in lines
        if line["type"] == "record"
    }
    tombstones = sorted(line["id"] for line in lines if line["type"] == "tombstone")
    return {"records": records, "tombstones": tombstones}


def test_export_import_export_gives_the_same_records_and_chains(
    monkeypatch: pytest.MonkeyPatch,
    env: None,
    store: Store,
    fresh_store: Store,
    fresh_dsn: str,
    dsn: str,
    start_worker: StartWorker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = fill(store)
    before = export(monkeypatch, dsn, tmp_path / "a.jsonl")
    kinds = [line["type"] for line in before]
    assert kinds[0] == "export" and kinds.count("record") == 4 and kinds.count("tombstone") == 1
    assert kinds.count("receipt") == 10  # every operation of the scope, the forget's included
    assert "Not Ada's." not in (tmp_path / "a.jsonl").read_text()
    assert "secret" not in (tmp_path / "a.jsonl").read_text()  # forgotten: no trace of its text
    chain = essentials(before)["records"][ids["a"]]
    assert [(r["revision"], r["status"], r["text"]) for r in chain] == [
        (1, "active", "Ada lives in London."),
        (2, "active", "Ada lives in Paris."),
        (3, "retracted", "Ada lives in Paris."),
        (4, "active", "Ada lives in Lyon."),
    ]
    capsys.readouterr()

    # An import interrupted after its first lines, then run again in full.
    lines = (tmp_path / "a.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "part.jsonl").write_text("".join(lines[:3]))
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    with start_worker(fresh_store):
        assert main(["import", str(tmp_path / "part.jsonl"), "--wait", "30"]) == 0
        capsys.readouterr()
        assert main(["import", str(tmp_path / "a.jsonl"), "--wait", "30"]) == 0
        summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "engram" and summary["records"] == 4
    assert summary["tombstones"] == 1 and summary["skipped"] == {"receipt": 10}
    assert summary["refused"] == {} and summary["pending"] == 0
    first_part = 4 + 1  # the first two records (4 revisions and 1), replayed
    assert (summary["replayed"], summary["committed"]) == (
        first_part,
        summary["operations"] - first_part,
    )

    after = export(monkeypatch, fresh_dsn, tmp_path / "b.jsonl")
    assert essentials(after) == essentials(before)
    expiring = next(line for line in after if line.get("id") == ids["c"])
    assert expiring["revisions"][-1]["expires_at"] is not None
    # The forgotten id stays forgotten: creating it again is refused.
    with start_worker(fresh_store):
        code = main(
            [
                "enqueue",
                "remember",
                "--scope",
                json.dumps(SCOPE),
                "--request",
                json.dumps({"id": ids["gone"], "text": "Back?"}),
                "--wait",
                "10",
            ]
        )
    assert code == 1 and json.loads(capsys.readouterr().out)["error"]["code"] == "revision_conflict"

    # Run again: every operation is answered from its receipt; nothing changes.
    revision = fresh_store.scope_revision(SCOPE)
    with start_worker(fresh_store):
        code = main(["import", str(tmp_path / "a.jsonl"), "--wait", "30"])
    again = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(again)
    assert again["replayed"] == again["operations"] and again["committed"] == 0
    assert fresh_store.scope_revision(SCOPE) == revision


def test_one_id_in_two_scopes_exports_and_imports_as_two_records(
    monkeypatch: pytest.MonkeyPatch,
    env: None,
    store: Store,
    fresh_store: Store,
    fresh_dsn: str,
    dsn: str,
    start_worker: StartWorker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A record id is its scope's (issue 36 item 3): two scopes' records of one id, and
    one scope's tombstone of an id the other still holds, come back each in its scope."""
    ada = {"user_id": "ada", "agent_id": "twin-ids"}
    bob = {"user_id": "bob", "agent_id": "twin-ids"}
    for scope, who in ((ada, "Ada"), (bob, "Bob")):
        mem = store.session(scope, embedder=HashingEmbedder(64))
        mem.remember(f"{who}'s twin note.", id="twin")
        mem.revise("twin", text=f"{who}'s twin note, revised.", expected_revision=1)
        mem.remember(f"{who}'s other note.", id="twin-gone")
    store.session(bob).forget("twin-gone")

    def export_scope(dsn: str, scope: dict[str, str], path: Path) -> list[dict[str, Any]]:
        monkeypatch.setenv("DATABASE_URL", dsn)
        assert main(["export", "--scope", json.dumps(scope), "--output", str(path)]) == 0
        return [json.loads(line) for line in path.read_text().splitlines()]

    before = {k: export_scope(dsn, s, tmp_path / f"{k}.jsonl") for k, s in (("a", ada), ("b", bob))}
    assert essentials(before["a"])["tombstones"] == []
    assert essentials(before["b"])["tombstones"] == ["twin-gone"]
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    with start_worker(fresh_store):
        for k in ("a", "b"):
            assert main(["import", str(tmp_path / f"{k}.jsonl"), "--wait", "30"]) == 0
            summary = json.loads(capsys.readouterr().out)
            assert summary["refused"] == {} and summary["pending"] == 0, summary
    for k, scope in (("a", ada), ("b", bob)):
        after = export_scope(fresh_dsn, scope, tmp_path / f"{k}-again.jsonl")
        assert essentials(after) == essentials(before[k])
    for scope, who in ((ada, "Ada"), (bob, "Bob")):
        twin = fresh_store.get(scope, "twin")
        assert twin is not None and twin.text == f"{who}'s twin note, revised."
        assert [r.revision for r in fresh_store.history(scope, "twin")] == [1, 2]
    kept = fresh_store.get(ada, "twin-gone")
    assert kept is not None and kept.text == "Ada's other note."
    assert fresh_store.get(bob, "twin-gone") is None


def test_mem0_memories_are_imported_through_the_streams(
    monkeypatch: pytest.MonkeyPatch,
    env: None,
    fresh_store: Store,
    fresh_dsn: str,
    start_worker: StartWorker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    memories = {
        "results": [
            {
                "id": "5f0e6d3c-1",
                "memory": "Likes hiking",
                "hash": "h1",
                "metadata": None,
                "created_at": "2024-07-20T10:00:00-07:00",
                "updated_at": None,
                "user_id": "alex",
            },
            {
                "id": "5f0e6d3c-2",
                "memory": "Allergic to nuts",
                "hash": "h2",
                "metadata": {"category": "health"},
                "created_at": "2024-07-21T10:00:00-07:00",
                "updated_at": "2024-07-22T10:00:00-07:00",
                "user_id": "alex",
            },
        ]
    }
    path = tmp_path / "mem0.json"
    path.write_text(json.dumps(memories))
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    with start_worker(fresh_store):
        assert main(["import", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["format"], summary["committed"]) == ("mem0", 2)
    record = fresh_store.get({"user_id": "alex"}, "5f0e6d3c-2")
    assert record is not None and record.text == "Allergic to nuts"
    assert record.origin == "inferred" and record.metadata["category"] == "health"
    assert record.metadata["mem0"]["updated_at"] == "2024-07-22T10:00:00-07:00"


def test_a_bad_input_line_enqueues_nothing(
    monkeypatch: pytest.MonkeyPatch,
    env: None,
    tmp_path: Path,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "m1", "memory": "fine", "user_id": "a"}\n{"id": "m2"}\n')
    assert main(["import", str(path)]) == 2
    captured = capsys.readouterr()
    assert "line 2" in captured.err and captured.out == ""
    import redis

    client = redis.Redis.from_url(redis_url)
    assert not [k for k in client.scan_iter("engram:ops:*") if client.xlen(k)]
    client.close()
