"""Reconciliation under seed 000's origin rules, and the decisions it makes: pure.

A write (a remember's text, an extraction's facts) meets the active records
most similar to it; the model answers ADD, UPDATE, DELETE or NOOP events, and
``resolve`` turns them into the actions the planner applies:

- an inferred write never revises an asserted record: its UPDATE becomes a new
  inferred record linked ``about`` that record;
- a model retracts inferred records only: a DELETE of an asserted record, whatever
  the write's origin, is not applied but ``Proposed`` (the receipt names the record
  for its host to decide; the candidates are text anyone may have steered);
- an asserted write over an inferred record retracts it and creates an
  asserted record linked ``supersedes`` it;
- a DELETE plus an ADD: the new record ``supersedes`` the retracted one;
- an ADD whose text equals an existing record's (trimmed, case-insensitive)
  is skipped as a duplicate;
- a text is asserted only in the host's own words: a text the model wrote
  (not, trimmed and case-insensitive, the request's) is written ``inferred``,
  citing the request's sources, whatever the write's origin.

The records a decision keeps in place of the write's text (the one an ADD
duplicates, the one an UPDATE leaves as it is, and every record shown when the
answer has a NOOP or writes no text at all) are ``named``: the receipt, which
still holds the request, is redacted when one of them is forgotten.

A ``Decision`` is bound to the revisions the model saw: the planner applies it
under the scope's lock and refuses it (``revision_conflict``) if one of the
records it acts on moved since.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ModelOutputError
from ..values import Link, Source
from .answers import Event


@dataclass(frozen=True, slots=True)
class Fact:
    """A text about to be written, with where it came from."""

    text: str
    sources: tuple[Source, ...]
    kind: str | None = None
    importance: float | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    """An active record as the model is shown it (its revision binds the decision)."""

    id: str
    revision: int
    origin: str
    text: str


@dataclass(frozen=True, slots=True)
class Create:
    text: str
    sources: tuple[Source, ...]
    kind: str | None = None  # None: the request's kind, or the default
    importance: float | None = None
    links: tuple[Link, ...] = ()  # besides the request's own
    origin: str | None = None  # None: the write's; "inferred" for a text the model wrote


@dataclass(frozen=True, slots=True)
class Update:
    """A new revision of a record with a new text; ``sources`` join its own."""

    id: str
    revision: int
    text: str
    sources: tuple[Source, ...]


@dataclass(frozen=True, slots=True)
class Retire:
    """Retract a record."""

    id: str
    revision: int


@dataclass(frozen=True, slots=True)
class Keep:
    """An ADD skipped as a duplicate of this record, which must still be as the model saw it."""

    id: str
    revision: int


@dataclass(frozen=True, slots=True)
class Named:
    """A record the decision kept in place of the write's text, without binding to its
    revision (a NOOP, an UPDATE to the text it has): nothing is written to it, but its
    forget redacts the receipt that holds the text."""

    id: str


@dataclass(frozen=True, slots=True)
class Proposed:
    """A DELETE of an asserted record: nothing is written to it (and so it is not bound
    to its revision); the receipt proposes its retraction to the host."""

    id: str
    revision: int


Action = Create | Update | Retire | Keep | Named | Proposed


@dataclass(frozen=True, slots=True)
class Decision:
    """What a remember or an extract writes once its model calls are made."""

    actions: tuple[Action, ...]
    model_calls: int = 0

    @property
    def texts(self) -> list[str]:
        """The texts that need a vector."""
        return [a.text for a in self.actions if isinstance(a, Create | Update)]

    @property
    def targets(self) -> list[str]:
        """The existing records it acts on or names."""
        return [a.id for a in self.actions if not isinstance(a, Create | Proposed)]

    @property
    def named(self) -> list[str]:
        """The records it keeps in place of the text it was given (``Keep``, ``Named``)."""
        return [a.id for a in self.actions if isinstance(a, Keep | Named)]

    @property
    def proposed(self) -> list[Proposed]:
        """What the model proposed and this decision does not apply."""
        return [a for a in self.actions if isinstance(a, Proposed)]

    @property
    def creates(self) -> int:
        return sum(isinstance(a, Create) for a in self.actions)


def normalized(text: str) -> str:
    return text.strip().casefold()


def add_all(facts: Sequence[Fact], *, skip_repeats: bool = False) -> tuple[Action, ...]:
    """Every fact as a new record (``supersede: add``, or nothing similar to reconcile with);
    with ``skip_repeats``, a fact repeating an earlier one's text is skipped."""
    seen: set[str] = set()
    actions: list[Action] = []
    for fact in facts:
        key = normalized(fact.text)
        if skip_repeats and key in seen:
            continue
        seen.add(key)
        actions.append(Create(fact.text, fact.sources, fact.kind, fact.importance))
    return tuple(actions)


def resolve(
    events: Sequence[Event], candidates: Sequence[Candidate], facts: Sequence[Fact], origin: str
) -> tuple[Action, ...]:
    """The actions of a reconciliation answer, under the origin rules.

    ``origin`` is the write's. UPDATE and DELETE come first, then the ADDs, so
    that an ADD knows which records this answer retracts and which texts it
    leaves. Two events on one record are a malformed answer.
    """
    actions: list[Action] = []
    touched: set[int] = set()
    deleted: list[str] = []
    for i, event in enumerate(events):
        if event.kind not in ("UPDATE", "DELETE"):
            continue
        assert event.target is not None
        if event.target in touched:
            raise ModelOutputError(f"event {i} acts on record {event.target} a second time")
        touched.add(event.target)
        candidate = candidates[event.target]
        if event.kind == "UPDATE":
            assert event.text is not None
            actions += _update(candidate, event.text, facts, origin)
        elif candidate.origin == "asserted":
            # The model read candidates anyone may have worded: it never retracts what
            # the host asserted, it may only propose it.
            actions.append(Proposed(candidate.id, candidate.revision))
        else:
            actions.append(Retire(candidate.id, candidate.revision))
            deleted.append(candidate.id)
    kept = {a.id for a in actions if isinstance(a, Proposed)}  # still active, unchanged
    left = {
        normalized(c.text): c
        for i, c in reversed(list(enumerate(candidates)))
        if i not in touched or c.id in kept
    }
    written = {normalized(a.text) for a in actions if isinstance(a, Create | Update)}
    supersedes = tuple(Link("supersedes", record_id) for record_id in deleted)
    for event in events:
        if event.kind != "ADD":
            continue
        assert event.text is not None
        key = normalized(event.text)
        if key in written:
            continue
        written.add(key)
        duplicate = left.get(key)
        if duplicate is not None:
            actions.append(Keep(duplicate.id, duplicate.revision))
            continue
        fact = _fact_of(event.text, facts)
        text, text_origin = _worded(event.text, facts, origin)
        actions.append(
            Create(
                text,
                _sources_of(fact, facts),
                fact.kind if fact else None,
                fact.importance if fact else None,
                supersedes,
                _unless(text_origin, origin),
            )
        )
    return tuple(actions) + _kept_in_place(events, actions, candidates)


def _kept_in_place(
    events: Sequence[Event], actions: Sequence[Action], candidates: Sequence[Candidate]
) -> tuple[Named, ...]:
    """Every record shown, when the answer has a NOOP or writes no text: the request's
    text is then kept in no revision, only in the receipt, and the model's NOOP names
    no record the store can trust (``answers`` drops it)."""
    if any(isinstance(a, Create | Update) for a in actions) and all(
        e.kind != "NOOP" for e in events
    ):
        return ()
    linked = {a.id for a in actions if not isinstance(a, Create | Proposed)}
    return tuple(Named(i) for i in dict.fromkeys(c.id for c in candidates) if i not in linked)


def _update(candidate: Candidate, text: str, facts: Sequence[Fact], origin: str) -> list[Action]:
    fact = _fact_of(text, facts)
    sources = _sources_of(fact, facts)
    kind, importance = (fact.kind, fact.importance) if fact else (None, None)
    text, text_origin = _worded(text, facts, origin)
    if text_origin == "asserted" and candidate.origin == "inferred":
        return [
            Retire(candidate.id, candidate.revision),
            Create(text, sources, kind, importance, (Link("supersedes", candidate.id),)),
        ]
    if normalized(text) == normalized(candidate.text):
        return [Named(candidate.id)]  # the record says it already
    if text_origin == "inferred" and candidate.origin == "asserted":
        # A model never revises what the host asserted: it may only say something about it.
        about = (Link("about", candidate.id),)
        return [Create(text, sources, kind, importance, about, _unless(text_origin, origin))]
    return [Update(candidate.id, candidate.revision, text, sources)]


def _unless(text_origin: str, origin: str) -> str | None:
    """A ``Create``'s own origin: None when it is the write's."""
    return None if text_origin == origin else text_origin


def _worded(text: str, facts: Sequence[Fact], origin: str) -> tuple[str, str]:
    """The text to write and its origin. An asserted write asserts the host's own words
    only: a text equal to one of its facts (trimmed, case-insensitive) is written as the
    host wrote it; any other text the model wrote, so it is inferred."""
    if origin != "asserted":
        return text, origin
    own = next((f.text for f in facts if normalized(f.text) == normalized(text)), None)
    return (own, origin) if own is not None else (text, "inferred")


def _fact_of(text: str, facts: Sequence[Fact]) -> Fact | None:
    """The fact a text the model wrote comes from: the one with the same text, or the
    only one there is. None when it cannot be told (it merges several, say)."""
    if len(facts) == 1:
        return facts[0]
    return next((f for f in facts if normalized(f.text) == normalized(text)), None)


def _sources_of(fact: Fact | None, facts: Sequence[Fact]) -> tuple[Source, ...]:
    if fact is not None:
        return fact.sources
    return tuple(dict.fromkeys(s for f in facts for s in f.sources))
