"""What changed between two revisions (web/diff.py): pure, no server."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from difflib import SequenceMatcher

import pytest

from engram.store import Link, Record, Scope, Source
from engram.web.diff import (
    _TOKENS,
    MAX_DIFF_STEPS,
    MAX_DIFF_TOKENS,
    Budget,
    FieldChange,
    Segment,
    history_diffs,
    revision_diff,
    word_diff,
)

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
    assert segments is not None
    assert "".join(s.text for s in segments if s.kind != "added") == before
    assert "".join(s.text for s in segments if s.kind != "removed") == after


def test_long_differing_middles_are_declined_without_diffing() -> None:
    words = [f"w{i}" for i in range(MAX_DIFF_TOKENS)]
    before, after = " ".join(words), " ".join(reversed(words))
    budget = Budget()
    assert word_diff("start " + before + " end", "start " + after + " end", budget) is None
    assert budget.spent == 0


def _random_text(seed: int, n_bytes: int) -> str:
    rng = random.Random(seed)
    words, size = [], 0
    while size < n_bytes:
        words.append(rng.choice(["tea", "cake", "Ada", "London", "Paris", "lives", "in", "a"]))
        size += len(words[-1]) + 1
    return " ".join(words)


def _pairs() -> dict[str, tuple[str, str]]:
    rng = random.Random(5)
    return {
        "unrelated 2 KB": (_random_text(1, 2_000), _random_text(2, 2_000)),
        "unrelated 200 KB": (_random_text(1, 200_000), _random_text(2, 200_000)),
        # SequenceMatcher (autojunk off) took 38.8 s and 12.5 s on these 2 KB pairs.
        "repeats": ("a " * 1000, "a b " * 500),
        "two letters": (
            "".join(rng.choice("ab") + "\n" for _ in range(1000)),
            "".join(rng.choice("ab") + " " for _ in range(1000)),
        ),
    }


@pytest.mark.parametrize("name", list(_pairs()))
def test_any_pair_of_texts_costs_at_most_the_budget(name: str) -> None:
    """Pairs that defeat a quadratic diff are diffed or declined within
    ``MAX_DIFF_STEPS`` counted steps: the bound is the algorithm's, not the machine's."""
    before, after = _pairs()[name]
    budget = Budget()
    started = time.perf_counter()
    found = word_diff(before, after, budget)
    assert budget.spent <= MAX_DIFF_STEPS + 2 * MAX_DIFF_TOKENS
    if found is not None:  # shown: then it is right
        assert "".join(s.text for s in found if s.kind != "added") == before
        assert "".join(s.text for s in found if s.kind != "removed") == after
    assert time.perf_counter() - started < 2.0  # generous: the count above is the bound


def test_a_small_edit_in_a_large_text_is_still_shown() -> None:
    before = _random_text(3, 200_000)
    after = before[:100_000] + " Ada moved to Paris. " + before[100_000:]
    budget = Budget()
    found = word_diff(before, after, budget)
    assert found is not None and budget.spent < 1_000
    assert "".join(s.text for s in found if s.kind != "added") == before
    assert "".join(s.text for s in found if s.kind != "removed") == after
    assert "moved to Paris." in "".join(s.text for s in found if s.kind == "added")


def test_the_diff_is_a_shortest_edit_that_rebuilds_both_texts() -> None:
    rng = random.Random(7)
    for _ in range(500):
        a = " ".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        b = " ".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        found = word_diff(a, b)
        assert found is not None
        assert "".join(s.text for s in found if s.kind != "added") == a
        assert "".join(s.text for s in found if s.kind != "removed") == b
        edits = sum(len(_TOKENS.findall(s.text)) for s in found if s.kind != "same")
        matcher = SequenceMatcher(None, _TOKENS.findall(a), _TOKENS.findall(b), autojunk=False)
        kept = sum(block.size for block in matcher.get_matching_blocks())
        assert edits <= len(_TOKENS.findall(a)) + len(_TOKENS.findall(b)) - 2 * kept


def test_a_revision_whose_diff_is_too_large_says_so() -> None:
    diff = revision_diff(
        record(1, text=_random_text(1, 2_000)), record(2, text=_random_text(2, 2_000))
    )
    assert diff.text is None and diff.text_too_large and not diff.unchanged


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
