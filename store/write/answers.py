"""Reading a model's answers, strictly: pure, no I/O.

An answer that cannot be used as a whole (not JSON, not the expected shape, an
unknown event, a record id the model was not shown, a fact that is no valid
memory text) raises ``ModelOutputError``, naming what is wrong and never
quoting the text. The one thing dropped instead is the one seed 000 says how
to handle: source tags that do not exist (a fact citing no known tag cites
every source read).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidRequestError, ModelOutputError
from ..limits import MAX_KIND_CHARS, MAX_MODEL_EVENTS, MAX_MODEL_FACTS, MAX_TEXT_CHARS
from ..values import check_string
from .validation import check_importance

EventKind = Literal["ADD", "UPDATE", "DELETE", "NOOP"]
EVENT_KINDS: tuple[EventKind, ...] = ("ADD", "UPDATE", "DELETE", "NOOP")


@dataclass(frozen=True, slots=True)
class ProposedFact:
    """A fact as an extraction answered it: ``tags`` are indexes of known sources
    (empty: it cited none that exists)."""

    text: str
    tags: tuple[int, ...]
    kind: str | None
    importance: float | None


@dataclass(frozen=True, slots=True)
class Event:
    """One reconciliation event. ``target`` indexes the candidates the model was shown."""

    kind: EventKind
    target: int | None
    text: str | None


_FENCE = "```"
_FENCE_TAG = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def unfence(answer: str) -> str:
    """What is inside the Markdown code fence models often wrap JSON in even when told
    not to (```` ```json ````, a newline, the body, a newline, ```` ``` ````), else the answer.

    Plain string operations, linear in the answer's length: the regular expression
    this replaces backtracked cubically, and a few thousand newlines from the model
    held a worker's GIL for minutes.
    """
    text = answer.strip()
    if not text.startswith(_FENCE) or not text.endswith(_FENCE) or len(text) < 2 * len(_FENCE):
        return answer
    opened = text.find("\n")
    closed = text.rfind("\n", 0, len(text) - len(_FENCE))
    if opened < 0 or closed <= opened or text[closed + 1 : -len(_FENCE)].strip():
        return answer
    tag = text[len(_FENCE) : opened].rstrip()
    if not _FENCE_TAG.issuperset(tag):
        return answer
    return text[opened + 1 : closed]


def _items(answer: str, key: str, what: str, max_items: int) -> list[Any]:
    try:
        data = json.loads(unfence(answer))
    except (ValueError, RecursionError):
        raise ModelOutputError(f"the {what} answer is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ModelOutputError(f"the {what} answer is not an object with a {key!r} list")
    items: list[Any] = data[key]
    if len(items) > max_items:
        raise ModelOutputError(f"the {what} answer has more than {max_items} items")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ModelOutputError(f"item {i} of the {what} answer is not an object")
    return items


def _text(value: object, what: str) -> str:
    try:
        return check_string(value, what, max_chars=MAX_TEXT_CHARS)
    except InvalidRequestError as exc:
        raise ModelOutputError(f"the model's {exc.message}") from None


def parse_facts(answer: str, source_count: int) -> list[ProposedFact]:
    """``{"facts": [{"text", "sources": ["s0", ...], "kind"?, "importance"?}]}``."""
    facts = []
    for i, item in enumerate(_items(answer, "facts", "extraction", MAX_MODEL_FACTS)):
        what = f"fact {i}"
        text = _text(item.get("text"), f"{what} text")
        cited = item.get("sources")
        if cited is None:
            cited = []
        if not isinstance(cited, list):
            raise ModelOutputError(f"{what} sources are not a list")
        tags = tuple(dict.fromkeys(t for c in cited if (t := _tag(c, source_count)) is not None))
        facts.append(
            ProposedFact(text, tags, _kind(item.get("kind"), what), _importance(item, what))
        )
    return facts


def _tag(value: object, source_count: int) -> int | None:
    """The index a tag such as ``s1`` (or ``[s1]``) names, None when there is no such source."""
    if not isinstance(value, str):
        return None
    match = re.fullmatch(r"\[?s(\d{1,6})\]?", value.strip())
    if match is None:
        return None
    index = int(match.group(1))
    return index if index < source_count else None


def _kind(value: object, what: str) -> str | None:
    if value is None:
        return None
    try:
        return check_string(value, f"{what} kind", max_chars=MAX_KIND_CHARS)
    except InvalidRequestError as exc:
        raise ModelOutputError(f"the model's {exc.message}") from None


def _importance(item: dict[str, Any], what: str) -> float | None:
    try:
        return check_importance(item.get("importance"), f"{what} importance")
    except InvalidRequestError as exc:
        raise ModelOutputError(f"the model's {exc.message}") from None


def parse_events(answer: str, candidate_count: int) -> list[Event]:
    """``{"memory": [{"event": "ADD"|"UPDATE"|"DELETE"|"NOOP", "id"?, "text"?}]}``, where
    ids are the candidates' indexes as shown (``"0"``, ``"1"``...)."""
    events = []
    for i, item in enumerate(_items(answer, "memory", "reconciliation", MAX_MODEL_EVENTS)):
        what = f"event {i}"
        kind = item.get("event")
        kind = kind.strip().upper() if isinstance(kind, str) else kind
        if kind not in EVENT_KINDS:
            raise ModelOutputError(f"{what} is not one of {', '.join(EVENT_KINDS)}")
        if kind == "NOOP":
            events.append(Event("NOOP", None, None))  # does nothing, whatever it names
            continue
        target = None
        if kind in ("UPDATE", "DELETE"):
            target = _target(item.get("id"), candidate_count, what)
        text = _text(item.get("text"), f"{what} text") if kind in ("ADD", "UPDATE") else None
        events.append(Event(kind, target, text))
    return events


def _target(value: object, candidate_count: int, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip().isdigit():
        raise ModelOutputError(f"{what} names no record id")
    index = int(value.strip())
    if index >= candidate_count:
        raise ModelOutputError(
            f"{what} names record {index}, not one of the {candidate_count} it was shown"
        )
    return index
