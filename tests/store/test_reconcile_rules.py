"""Seed 000's origin rules, as the actions a reconciliation answer resolves to: pure."""

from __future__ import annotations

import pytest

from engram.store.errors import ModelOutputError
from engram.store.values import Link, Source
from engram.store.write.answers import Event
from engram.store.write.reconcile import (
    Candidate,
    Create,
    Decision,
    Fact,
    Keep,
    Named,
    Proposed,
    Retire,
    Update,
    add_all,
    resolve,
)

ASSERTED = Candidate("rec-a", 3, "asserted", "Ada lives in London.")
INFERRED = Candidate("rec-i", 2, "inferred", "Ada seems to like tea.")
HOST = (Source("host", "sha256:1"),)
USER = (Source("user", "sha256:2", message_id="m1"),)
FACT = Fact("Ada moved to Paris.", HOST, "semantic", 0.5)


def update(target: int, text: str = "New text.") -> Event:
    return Event("UPDATE", target, text)


# An asserted write's text in the host's own words (trimmed, case aside).
HOST_WORDS = " ada MOVED to Paris. "


@pytest.mark.parametrize(
    "origin, target, expected",
    [
        # same origin: a new revision of the record
        ("asserted", 0, [Update("rec-a", 3, "Ada moved to Paris.", HOST)]),
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
                Create(
                    "Ada moved to Paris.", HOST, "semantic", 0.5, (Link("supersedes", "rec-i"),)
                ),
            ],
        ),
    ],
)
def test_update_by_origin(origin: str, target: int, expected: list[object]) -> None:
    text = HOST_WORDS if origin == "asserted" else "New text."
    assert list(resolve([update(target, text)], [ASSERTED, INFERRED], [FACT], origin)) == expected


@pytest.mark.parametrize(
    "target, expected",
    [
        # the host's record is not revised with the model's words: it is said about
        (0, [Create("New text.", HOST, "semantic", 0.5, (Link("about", "rec-a"),), "inferred")]),
        # an inferred record is revised: the revision stays inferred
        (1, [Update("rec-i", 2, "New text.", HOST)]),
    ],
)
def test_an_asserted_write_asserts_only_the_hosts_words(
    target: int, expected: list[object]
) -> None:
    """A text the model wrote is inferred, citing the request's sources."""
    assert list(resolve([update(target)], [ASSERTED, INFERRED], [FACT], "asserted")) == expected
    assert resolve([Event("ADD", None, "Ada is in Paris now.")], [], [FACT], "asserted") == (
        Create("Ada is in Paris now.", HOST, "semantic", 0.5, (), "inferred"),
    )
    assert resolve([Event("ADD", None, HOST_WORDS)], [], [FACT], "asserted") == (
        Create("Ada moved to Paris.", HOST, "semantic", 0.5),
    )


def test_delete_by_origin_and_delete_plus_add() -> None:
    """A model retracts inferred records only: its DELETE of an asserted record, whatever
    the write's origin, is a proposal for the host, and the ADD supersedes nothing of it."""
    candidates = [ASSERTED, INFERRED]
    delete_both = [Event("DELETE", 0, None), Event("DELETE", 1, None), Event("ADD", None, "X.")]
    for origin in ("inferred", "asserted"):
        actions = resolve(delete_both, candidates, [FACT], origin)
        assert list(actions) == [
            Proposed("rec-a", 3),
            Retire("rec-i", 2),
            Create(
                "X.",
                HOST,
                "semantic",
                0.5,
                (Link("supersedes", "rec-i"),),
                "inferred" if origin == "asserted" else None,
            ),
        ]
        assert Decision(actions).targets == ["rec-i"]  # nothing bound to rec-a's revision
        assert [p.id for p in Decision(actions).proposed] == ["rec-a"]


def test_duplicates_are_skipped_trimmed_and_case_insensitive() -> None:
    actions = resolve(
        [
            Event("ADD", None, "  ADA LIVES IN LONDON. "),
            Event("ADD", None, "Ada likes chess."),
            Event("ADD", None, "ada likes chess."),
        ],
        [ASSERTED],
        [Fact("Ada likes chess.", HOST, "semantic", 0.5)],
        "asserted",
    )
    assert list(actions) == [Keep("rec-a", 3), Create("Ada likes chess.", HOST, "semantic", 0.5)]


def test_an_add_of_the_text_of_a_record_this_answer_retracts_is_no_duplicate() -> None:
    actions = resolve(
        [Event("DELETE", 0, None), Event("ADD", None, INFERRED.text)],
        [INFERRED],
        [FACT],
        "asserted",
    )
    assert [type(a).__name__ for a in actions] == ["Retire", "Create"]


def test_an_add_of_the_text_of_a_record_only_proposed_for_retraction_is_a_duplicate() -> None:
    """The asserted record stays active: its text written again would repeat it."""
    actions = resolve(
        [Event("DELETE", 0, None), Event("ADD", None, ASSERTED.text)],
        [ASSERTED],
        [FACT],
        "asserted",
    )
    assert list(actions) == [Proposed("rec-a", 3), Keep("rec-a", 3)]


def test_an_update_to_the_same_text_changes_nothing_but_names_the_record() -> None:
    for origin in ("asserted", "inferred"):
        actions = resolve([update(0, " ada lives in london.")], [ASSERTED], [FACT], origin)
        assert actions == (Named("rec-a"),)


def test_records_kept_in_place_of_the_text_are_named() -> None:
    """A NOOP (whatever it names: the parser keeps no id), or an answer that writes no
    text, names every record shown; an ADD of an existing text names its duplicate."""
    shown = [ASSERTED, INFERRED]
    noop = resolve([Event("NOOP", None, None)], shown, [FACT], "asserted")
    assert noop == (Named("rec-a"), Named("rec-i"))
    assert resolve([], shown, [FACT], "asserted") == noop
    retract = resolve([Event("DELETE", 1, None)], shown, [FACT], "asserted")
    assert retract == (Retire("rec-i", 2), Named("rec-a"))
    # A record only proposed for retraction is kept in the text's place as well.
    proposed = resolve([Event("DELETE", 0, None)], shown, [FACT], "asserted")
    assert proposed == (Proposed("rec-a", 3), Named("rec-a"), Named("rec-i"))
    keep = resolve([Event("ADD", None, ASSERTED.text)], shown, [FACT], "asserted")
    assert keep == (Keep("rec-a", 3), Named("rec-i"))
    added = resolve([Event("ADD", None, FACT.text)], shown, [FACT], "asserted")
    assert [type(a).__name__ for a in added] == ["Create"]  # the text is written: no names


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
