"""Reading model answers: pure, no server."""

from __future__ import annotations

import json
import re
import time

import pytest

from engram.store.errors import ModelOutputError
from engram.store.write.answers import Event, ProposedFact, parse_events, parse_facts, unfence


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


# The regular expression the fence was read with until it was found to backtrack
# cubically; kept here, on short answers, to show the string operations accept
# what it accepted.
_OLD_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n(.*)\n\s*```\s*$", re.DOTALL)


@pytest.mark.parametrize(
    "answer",
    [
        '```json\n{"memory": []}\n```',
        '```\n{"memory": []}\n```',
        '  \n```json  \r\n{"memory": []}\r\n  ```  \n',
        '```json-5_x\n\n{"memory": []}\n\n```',
        '```json\n{"memory": [{"event": "ADD", "text": "a ``` b"}]}\n```',
        "```\n\n```",
        "```\n```",
        "``````",
        '``` json\n{"memory": []}\n```',
        '```json x\n{"memory": []}\n```',
        '```json\n{"memory": []}\n````',
        '```json\n{"memory": []}```',
        '```json {"memory": []}\n```',
        '{"memory": []}',
        '```json\n{"memory": []}',
        '```json\n{"memory": []}\n```\ntrailing',
    ],
)
def test_a_fence_is_read_as_the_regular_expression_read_it(answer: str) -> None:
    old = _OLD_FENCE.match(answer)
    # the same text, but for blank lines at its ends (whitespace to JSON)
    assert unfence(answer).strip() == (old.group(1) if old else answer).strip()


@pytest.mark.parametrize(
    "answer",
    [
        "```" + "\n" * 50_000 + "x",
        " \n" * 50_000,
        "```json\n" + " \n" * 50_000,
        "```json\n" + " \n" * 50_000 + "x",
        "```json\n" + "\n" * 50_000 + "``` x",
        "```" + "a" * 50_000 + "\n" + " " * 50_000,
    ],
    ids=[
        "newlines",
        "blank-lines",
        "fenced-blank-lines",
        "fenced-blank-lines-x",
        "two-fences",
        "long-tag",
    ],
)
def test_a_hostile_answer_is_refused_at_once(answer: str) -> None:
    # The regular expression took 45 s on 4,000 newlines (cubic): 50,000 would be days.
    started = time.monotonic()
    with pytest.raises(ModelOutputError, match="not JSON"):
        parse_events(answer, 2)
    with pytest.raises(ModelOutputError, match="not JSON"):
        parse_facts(answer, 2)
    assert time.monotonic() - started < 1.0


def test_a_large_fenced_answer_is_read_at_once() -> None:
    answer = "```json\n" + " \n" * 50_000 + '{"memory": []}' + " \n" * 50_000 + "```"
    started = time.monotonic()
    assert parse_events(answer, 2) == []
    assert time.monotonic() - started < 1.0
