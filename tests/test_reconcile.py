"""Seed 000's origin rules, as the actions a reconciliation answer resolves to: pure."""

from __future__ import annotations

import pytest

from store.answers import Event
from store.errors import ModelOutputError
from store.model import Link, Source
from store.reconcile import Candidate, Create, Fact, Keep, Retire, Update, add_all, resolve

ASSERTED = Candidate("rec-a", 3, "asserted", "Ada lives in London.")
INFERRED = Candidate("rec-i", 2, "inferred", "Ada seems to like tea.")
HOST = (Source("host", "sha256:1"),)
USER = (Source("user", "sha256:2", message_id="m1"),)
FACT = Fact("Ada moved to Paris.", HOST, "semantic", 0.5)


def update(target: int, text: str = "New text.") -> Event:
    return Event("UPDATE", target, text)


@pytest.mark.parametrize(
    "origin, target, expected",
    [
        # same origin: a new revision of the record
        ("asserted", 0, [Update("rec-a", 3, "New text.", HOST)]),
        ("inferred", 1, [Update("rec-i", 2, "New text.", HOST)]),
        # an inferred write never revises an asserted record: a new one, about it
        (
            "inferred",
            0,
            [Create("New text.", HOST, "semantic", 0.5, (Link("about", "rec-a"),))],
        ),
        # an asserted write over an inferred record retracts it, and supersedes it
        (
            "asserted",
            1,
            [
                Retire("rec-i", 2),
                Create("New text.", HOST, "semantic", 0.5, (Link("supersedes", "rec-i"),)),
            ],
        ),
    ],
)
def test_update_by_origin(origin: str, target: int, expected: list[object]) -> None:
    assert list(resolve([update(target)], [ASSERTED, INFERRED], [FACT], origin)) == expected


def test_delete_by_origin_and_delete_plus_add() -> None:
    candidates = [ASSERTED, INFERRED]
    delete_both = [Event("DELETE", 0, None), Event("DELETE", 1, None), Event("ADD", None, "X.")]
    inferred = resolve(delete_both, candidates, [FACT], "inferred")
    assert list(inferred) == [  # the asserted record's DELETE is dropped
        Retire("rec-i", 2),
        Create("X.", HOST, "semantic", 0.5, (Link("supersedes", "rec-i"),)),
    ]
    asserted = resolve(delete_both, candidates, [FACT], "asserted")
    assert [type(a).__name__ for a in asserted] == ["Retire", "Retire", "Create"]
    assert asserted[2].links == (  # type: ignore[union-attr]
        Link("supersedes", "rec-a"),
        Link("supersedes", "rec-i"),
    )


def test_duplicates_are_skipped_trimmed_and_case_insensitive() -> None:
    actions = resolve(
        [
            Event("ADD", None, "  ADA LIVES IN LONDON. "),
            Event("ADD", None, "Ada likes chess."),
            Event("ADD", None, "ada likes chess."),
        ],
        [ASSERTED],
        [FACT],
        "asserted",
    )
    assert list(actions) == [Keep("rec-a", 3), Create("Ada likes chess.", HOST, "semantic", 0.5)]


def test_an_add_of_the_text_of_a_record_this_answer_retracts_is_no_duplicate() -> None:
    actions = resolve(
        [Event("DELETE", 0, None), Event("ADD", None, ASSERTED.text)],
        [ASSERTED],
        [FACT],
        "asserted",
    )
    assert [type(a).__name__ for a in actions] == ["Retire", "Create"]


def test_an_update_to_the_same_text_changes_nothing() -> None:
    assert resolve([update(0, " ada lives in london.")], [ASSERTED], [FACT], "asserted") == ()


def test_sources_follow_the_fact_a_text_comes_from() -> None:
    facts = [Fact("Ada likes tea.", HOST), Fact("Ada likes chess.", USER)]
    actions = resolve(
        [Event("ADD", None, "ada likes chess."), Event("ADD", None, "Ada likes tea and chess.")],
        [],
        facts,
        "inferred",
    )
    assert [a.sources for a in actions] == [USER, HOST + USER]  # type: ignore[union-attr]


def test_two_events_on_one_record_are_a_malformed_answer() -> None:
    with pytest.raises(ModelOutputError, match="a second time"):
        resolve([update(0), Event("DELETE", 0, None)], [ASSERTED], [FACT], "asserted")


def test_add_all() -> None:
    facts = [Fact("A.", HOST), Fact(" a. ", USER)]
    assert len(add_all(facts)) == 2
    assert add_all(facts, skip_repeats=True) == (Create("A.", HOST),)
