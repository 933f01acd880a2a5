"""The values the store hands out: scopes, provenance, records, receipts, hits."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .errors import InvalidRequestError
from .limits import MAX_SCOPE_VALUE_CHARS

SCOPE_FIELDS = ("user_id", "agent_id", "run_id", "actor_id", "chat_id")
SOURCE_KINDS = ("user", "assistant", "tool", "external", "host")
ORIGINS = ("asserted", "inferred")
LINK_RELATIONS = ("supersedes", "about")

Origin = Literal["asserted", "inferred"]
Status = Literal["active", "retracted"]
Match = Literal["vector", "lexical", "hybrid"]


def check_string(value: object, what: str, *, max_chars: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be a string, not {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise InvalidRequestError(f"{what} must not be empty")
    if len(value) > max_chars:
        raise InvalidRequestError(f"{what} is longer than {max_chars} characters")
    if "\x00" in value:
        raise InvalidRequestError(f"{what} must not contain NUL characters")
    if not value.isascii():
        check_encodable(value, what)
    return value


def check_encodable(value: str, what: str) -> None:
    """Refuse text that has no UTF-8 form: a lone surrogate, such as the JSON escape
    ``"\\ud800"`` that any producer can send, would fail later, in a digest or in Redis."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidRequestError(
            f"{what} is not valid Unicode text (a lone surrogate has no UTF-8 form)"
        ) from None


@dataclass(frozen=True, slots=True)
class Scope:
    """An exact scope: reads match every set field and no other."""

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    actor_id: str | None = None
    chat_id: str | None = None
    key: str = field(init=False, repr=False, compare=False)
    """The canonical key: the set fields as JSON, keys sorted, no whitespace."""

    def __post_init__(self) -> None:
        set_fields = 0
        for name in SCOPE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                check_string(value, f"scope.{name}", max_chars=MAX_SCOPE_VALUE_CHARS)
                set_fields += 1
        if set_fields == 0:
            raise InvalidRequestError(f"a scope needs at least one of {', '.join(SCOPE_FIELDS)}")
        object.__setattr__(
            self, "key", json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        )

    @classmethod
    def of(cls, value: Scope | Mapping[str, Any]) -> Scope:
        if isinstance(value, Scope):
            return value
        if not isinstance(value, Mapping):
            raise InvalidRequestError("scope must be an object")
        unknown = sorted(set(value) - set(SCOPE_FIELDS))
        if unknown:
            raise InvalidRequestError(f"unknown scope field(s): {', '.join(map(str, unknown))}")
        return cls(**{k: v for k, v in value.items() if v is not None})

    def as_dict(self) -> dict[str, str]:
        return {name: v for name in SCOPE_FIELDS if (v := getattr(self, name)) is not None}


@dataclass(frozen=True, slots=True)
class Source:
    kind: str
    digest: str | None = None
    message_id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    run_id: str | None = None
    chat_id: str | None = None

    def as_dict(self) -> dict[str, str]:
        return {k: v for k in Source.__slots__ if (v := getattr(self, k)) is not None}


@dataclass(frozen=True, slots=True)
class Link:
    relation: str
    id: str

    def as_dict(self) -> dict[str, str]:
        return {"relation": self.relation, "id": self.id}


@dataclass(frozen=True, slots=True)
class Record:
    """One revision of a record."""

    id: str
    revision: int
    scope: Scope
    text: str
    kind: str
    importance: float | None
    metadata: dict[str, Any]
    origin: Origin
    sources: tuple[Source, ...]
    links: tuple[Link, ...]
    status: Status
    digest: str
    operation_id: str
    recorded_at: datetime
    expires_at: datetime | None
    superseded_by: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """This revision as JSON: the export's revision (``store.portable``) after its
        record's id and scope, and the HTTP API's. ``superseded_by`` is the caller's."""
        return {
            "id": self.id,
            "scope": self.scope.as_dict(),
            "revision": self.revision,
            "status": self.status,
            "text": self.text,
            "kind": self.kind,
            "importance": self.importance,
            "metadata": self.metadata,
            "origin": self.origin,
            "sources": [s.as_dict() for s in self.sources],
            "links": [link.as_dict() for link in self.links],
            "digest": self.digest,
            "operation_id": self.operation_id,
            "recorded_at": self.recorded_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
        }


@dataclass(frozen=True, slots=True)
class RecordRef:
    """What a receipt says of a revision it wrote: no content."""

    id: str
    revision: int
    status: Status

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "revision": self.revision, "status": self.status}


Redaction = Literal["pending", "complete", "failed", "none"]
PROPOSAL_ACTIONS = ("retract",)


@dataclass(frozen=True, slots=True)
class Proposal:
    """What a model proposed and the store did not apply, for the host to decide: a
    reconciliation's DELETE of an asserted record (a model may retract only what was
    inferred). The record's id and the revision the model saw; no content."""

    action: Literal["retract"]
    id: str
    revision: int

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "id": self.id, "revision": self.revision}

    @classmethod
    def from_dict(cls, data: Any) -> Proposal:
        """A proposal read back (a receipt through Redis is untrusted): checked, typed."""
        if not isinstance(data, Mapping):
            raise InvalidRequestError("a receipt's proposal must be an object")
        action, record_id, revision = data.get("action"), data.get("id"), data.get("revision")
        if action not in PROPOSAL_ACTIONS:
            raise InvalidRequestError(f"a proposal's action must be one of {PROPOSAL_ACTIONS}")
        if not isinstance(record_id, str) or type(revision) is not int or revision < 1:
            raise InvalidRequestError("a proposal needs a record id and a revision")
        return cls("retract", record_id, revision)


@dataclass(frozen=True, slots=True)
class Receipt:
    operation_id: str
    kind: str
    scope: Scope
    scope_revision: int
    committed_at: datetime
    records: tuple[RecordRef, ...]
    redacted: bool = False
    # Only for a forget:
    forgotten_revisions: tuple[int, ...] | None = None
    already_forgotten: bool | None = None
    redaction: Redaction | None = None
    redaction_reason: str | None = None  # why it failed (content-free)
    stream_entry: str | None = None
    error: dict[str, Any] | None = None  # a refusal: committed nothing
    model_calls: int = 0  # the model calls the operation made (a replay makes none more)
    requested_by: str | None = None  # who asked, when the producer said (the audit trail)
    # What the operation's model proposed and the store did not apply (``Proposal``).
    proposed: tuple[Proposal, ...] = ()
    # Whether ``requested_by`` is authenticated: the server that verified a scoped token
    # vouched for this operation before enqueueing it (store.tokens); else it is claimed.
    # Known when the receipt is read back from the database.
    authenticated: bool = field(default=False, compare=False)
    # How many times this receipt answered a repeat of its operation, and when last:
    # bookkeeping about the receipt, not part of it (a replay equals the original).
    replays: int = field(default=0, compare=False)
    last_replayed_at: datetime | None = field(default=None, compare=False)
    # Where the primary's WAL stood right after the commit that answered (an LSN such
    # as "0/16B3748"), when the store has a read replica: a reader passing it as
    # ``after`` sees this write (store.read.routing). Not stored: a receipt read back
    # from the database has none.
    position: str | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "operation_id": self.operation_id,
            "kind": self.kind,
            "scope": self.scope.as_dict(),
            "scope_revision": self.scope_revision,
            "committed_at": self.committed_at.isoformat(),
            "records": [r.as_dict() for r in self.records],
            "redacted": self.redacted,
            "model_calls": self.model_calls,
        }
        if self.kind == "forget":
            out["revisions"] = list(self.forgotten_revisions or ())
            out["already_forgotten"] = bool(self.already_forgotten)
            out["redaction"] = self.redaction
            if self.redaction_reason is not None:
                out["redaction_reason"] = self.redaction_reason
        if self.stream_entry is not None:
            out["stream_entry"] = self.stream_entry
        if self.error is not None:
            out["error"] = self.error
        if self.requested_by is not None:
            out["requested_by"] = self.requested_by
        if self.proposed:
            out["proposed"] = [p.as_dict() for p in self.proposed]
        if self.authenticated:
            out["authenticated"] = True
        if self.replays:
            out["replays"] = self.replays
            out["last_replayed_at"] = (
                self.last_replayed_at.isoformat() if self.last_replayed_at else None
            )
        if self.position is not None:
            out["position"] = self.position
        return out

    @classmethod
    def fields_from_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments that ``as_dict`` output describes."""
        forget = data["kind"] == "forget"
        return {
            "operation_id": str(data["operation_id"]),
            "kind": str(data["kind"]),
            "scope": Scope.of(data["scope"]),
            "scope_revision": int(data["scope_revision"]),
            "committed_at": datetime.fromisoformat(data["committed_at"]),
            "records": tuple(
                RecordRef(str(r["id"]), int(r["revision"]), r["status"]) for r in data["records"]
            ),
            "redacted": bool(data.get("redacted", False)),
            "forgotten_revisions": tuple(int(r) for r in data.get("revisions", ()))
            if forget
            else None,
            "already_forgotten": bool(data.get("already_forgotten")) if forget else None,
            "redaction": data.get("redaction") if forget else None,
            "redaction_reason": data.get("redaction_reason") if forget else None,
            "stream_entry": data.get("stream_entry"),
            "error": data.get("error"),
            "model_calls": int(data.get("model_calls", 0)),
            "requested_by": data.get("requested_by"),
            "proposed": tuple(Proposal.from_dict(p) for p in data.get("proposed") or ()),
            "authenticated": data.get("authenticated") is True,
            "replays": int(data.get("replays") or 0),
            "last_replayed_at": datetime.fromisoformat(data["last_replayed_at"])
            if data.get("last_replayed_at")
            else None,
            "position": str(data["position"]) if data.get("position") else None,
        }

    @property
    def revisions(self) -> tuple[int, ...] | None:
        """A forget's deleted revision numbers (``()`` when it deleted nothing more)."""
        return self.forgotten_revisions


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a write returns: its receipt and the revisions it wrote."""

    receipt: Receipt
    replayed: bool
    records: tuple[Record, ...]
    conflict_retries: int = 0

    @property
    def revisions(self) -> tuple[int, ...]:
        return self.receipt.forgotten_revisions or ()

    @property
    def already_forgotten(self) -> bool:
        return bool(self.receipt.already_forgotten)

    @property
    def redaction(self) -> Redaction | None:
        return self.receipt.redaction


@dataclass(frozen=True, slots=True)
class Hit:
    record: Record
    # The cosine similarity of its vector to the query's (0 when negative or absent) plus
    # LEXICAL_WEIGHT times the square of the share of the query's telling weight its
    # text holds (limits.LEXICAL_WEIGHT).
    score: float
    match: Match
    # Where the vector and the lexical list ranked the hit (1 = first); None: not found.
    vector_rank: int | None = None
    lexical_rank: int | None = None

    @property
    def relevance(self) -> float:
        """How well the hit answers the query, from 0 to 1, whatever its rank: its
        score, at most 1. A text found by meaning alone has its cosine similarity (with
        the default embedder, 0.2 to 0.75 for a fact about what a question asks in other
        words, under 0.1 for an unrelated one); the words it holds raise it (holding
        every telling word of the query, or half of their weight with a similarity of
        0.5: 1). No query: 0."""
        return min(self.score, 1.0)


@dataclass(frozen=True, slots=True)
class Fence:
    """A fencing token: commits carrying an older token than one seen are refused."""

    name: str
    token: int


@dataclass(frozen=True, slots=True)
class Generation:
    id: int
    model_id: str
    dims: int
    status: Literal["pending", "active", "retired", "cancelled"]
    created_at: datetime
    activated_at: datetime | None = None
    progress: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReembedResult:
    generation: int
    embedded: int
    skipped: int
    activated: bool
