"""Reading model answers: pure, no server."""

from __future__ import annotations

import json

import pytest

from store.answers import Event, ProposedFact, parse_events, parse_facts
from store.errors import ModelOutputError


def test_facts_and_their_tags() -> None:
    answer = json.dumps(
        {
            "facts": [
                {"text": "A.", "sources": ["s1", "[s0]", "s1", "s9", "x", 3]},
                {"text": "B.", "sources": [], "kind": "episodic", "importance": 1},
                {"text": "C."},
            ]
        }
    )
    assert parse_facts(answer, 2) == [
        ProposedFact("A.", (1, 0), None, None),
        ProposedFact("B.", (), "episodic", 1.0),
        ProposedFact("C.", (), None, None),
    ]


def test_events_ids_kinds_and_fences() -> None:
    answer = (
        "```json\n"
        + json.dumps(
            {
                "memory": [
                    {"event": "add", "text": "New."},
                    {"event": "UPDATE", "id": 1, "text": "Changed."},
                    {"event": " delete ", "id": " 0 "},
                    {"event": "NOOP", "id": "99"},  # a no-op, whatever it names
                ]
            }
        )
        + "\n```"
    )
    assert parse_events(answer, 2) == [
        Event("ADD", None, "New."),
        Event("UPDATE", 1, "Changed."),
        Event("DELETE", 0, None),
        Event("NOOP", None, None),
    ]


@pytest.mark.parametrize(
    "answer, message",
    [
        ("", "not JSON"),
        ("[]", "'memory' list"),
        ('{"memory": [1]}', "item 0 of the reconciliation answer is not an object"),
        ('{"memory": [{"event": "ADD"}]}', "event 0 text must be a string"),
        ('{"memory": [{"event": "UPDATE", "id": "-1", "text": "x"}]}', "names no record id"),
        ('{"memory": [{"event": "UPDATE", "id": true, "text": "x"}]}', "names no record id"),
        ('{"memory": [{"event": "DELETE", "id": "2"}]}', "not one of the 2"),
        ('{"memory": [{"event": null}]}', "not one of ADD"),
        ('{"memory": [{"event": "ADD", "text": "a\\u0000b"}]}', "NUL"),
    ],
)
def test_malformed_events(answer: str, message: str) -> None:
    with pytest.raises(ModelOutputError, match=message):
        parse_events(answer, 2)


@pytest.mark.parametrize(
    "answer, message",
    [
        ('{"facts": [{"text": "x", "kind": 7}]}', "kind must be a string"),
        ('{"facts": [{"text": "x", "kind": "' + "k" * 65 + '"}]}', "longer than 64"),
        ('{"facts": [{"text": "x", "importance": "high"}]}', "must be a number"),
        ('{"facts": [{"text": "x", "importance": true}]}', "must be a number"),
        ('{"facts": [{"text": "x", "importance": 1.5}]}', "between 0 and 1"),
        ('{"facts": null}', "'facts' list"),
    ],
)
def test_malformed_facts(answer: str, message: str) -> None:
    with pytest.raises(ModelOutputError, match=message):
        parse_facts(answer, 1)
