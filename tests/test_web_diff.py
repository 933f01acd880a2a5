"""What changed between two revisions (web/diff.py): pure, no server."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from store import Link, Record, Scope, Source
from web.diff import MAX_DIFF_TOKENS, FieldChange, Segment, history_diffs, revision_diff, word_diff

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def record(revision: int = 1, text: str = "Ada lives in London.", **fields: object) -> Record:
    base = Record(
        id="mem_1",
        revision=revision,
        scope=Scope(user_id="ada"),
        text=text,
        kind="semantic",
        importance=None,
        metadata={},
        origin="asserted",
        sources=(Source(kind="host", digest="sha256:x"),),
        links=(),
        status="active",
        digest="sha256:x",
        operation_id=f"op-{revision}",
        recorded_at=NOW,
        expires_at=None,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_a_word_diff_keeps_what_is_shared_and_marks_the_rest() -> None:
    assert word_diff("Ada lives in London.", "Ada lives in Paris.") == (
        Segment("same", "Ada lives in "),
        Segment("removed", "London."),
        Segment("added", "Paris."),
    )
    assert word_diff("tea", "tea") == (Segment("same", "tea"),)
    assert word_diff("", "new") == (Segment("added", "new"),)
    assert word_diff("Ada likes tea and cake", "Ada likes cake") == (
        Segment("same", "Ada likes "),
        Segment("removed", "tea and "),
        Segment("same", "cake"),
    )


def test_whitespace_and_markup_pass_through_untouched() -> None:
    before, after = "a  <b>\n\tc", "a  <i>\n\tc"
    segments = word_diff(before, after)
    assert "".join(s.text for s in segments if s.kind != "added") == before
    assert "".join(s.text for s in segments if s.kind != "removed") == after


def test_long_texts_fall_back_to_whole_middles_quickly() -> None:
    words = [f"w{i}" for i in range(MAX_DIFF_TOKENS)]
    before = " ".join(words)
    after = " ".join(reversed(words))
    segments = word_diff("start " + before + " end", "start " + after + " end")
    assert segments[0] == Segment("same", "start ")
    assert [s.kind for s in segments] == ["same", "removed", "added", "same"]
    assert segments[-1] == Segment("same", " end")


def test_every_field_that_changed_is_named_with_before_and_after() -> None:
    before = record(1, metadata={"source": "form", "gone": 1}, importance=None)
    after = record(
        2,
        text="Ada lives in Paris.",
        metadata={"source": "chat", "new": [1, 2]},
        importance=0.8,
        status="retracted",
        kind="episodic",
        links=(Link("supersedes", "mem_0"),),
        sources=(Source(kind="user", message_id="m1"),),
        expires_at=NOW + timedelta(days=1),
    )
    diff = revision_diff(before, after)
    assert diff.before == 1 and diff.after == 2 and not diff.unchanged
    assert diff.text is not None and Segment("added", "Paris.") in diff.text
    assert set(diff.changes) == {
        FieldChange("kind", "semantic", "episodic"),
        FieldChange("importance", None, "0.8"),
        FieldChange("status", "active", "retracted"),
        FieldChange("expires_at", None, (NOW + timedelta(days=1)).isoformat()),
        FieldChange("metadata.gone", "1", None),
        FieldChange("metadata.new", None, "[1, 2]"),
        FieldChange("metadata.source", "form", "chat"),
        FieldChange("link", None, "supersedes mem_0"),
        FieldChange("source", '{"digest": "sha256:x", "kind": "host"}', None),
        FieldChange("source", None, '{"kind": "user", "message_id": "m1"}'),
    }


def test_a_retract_changes_only_the_status() -> None:
    diff = revision_diff(record(1), record(2, status="retracted"))
    assert diff.text is None and diff.changes == (FieldChange("status", "active", "retracted"),)


def test_history_pairs_each_stored_revision_with_the_one_before() -> None:
    kept = [record(5, text="c"), record(1, text="a"), record(2, text="b")]  # 3, 4 pruned
    assert [(d.before, d.after) for d in history_diffs(kept)] == [(1, 2), (2, 5)]
    assert history_diffs([record(1)]) == []
