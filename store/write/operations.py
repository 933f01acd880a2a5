"""Memory operations as plain, validated values.

An operation is what a producer asks for: an id, a scope, a kind and its
request. The same shape travels through the Python API, the Redis streams and
the HTTP API; ``Operation.from_dict`` is the single place that checks it, so
bad input is refused the same way everywhere and before anything changes.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..errors import InvalidRequestError
from ..limits import (
    DEFAULT_KIND,
    MAX_ID_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    MAX_MESSAGES,
    MAX_METADATA_BYTES,
    MAX_SOURCES,
    MAX_TEXT_CHARS,
    MAX_TOP_K,
)
from ..values import ORIGINS, Link, Scope, Source, check_string
from .validation import Fields, as_list, canonical_json, plain_json

OperationKind = Literal["remember", "extract", "revise", "retract", "forget"]
OPERATION_KINDS: tuple[OperationKind, ...] = ("remember", "extract", "revise", "retract", "forget")
MAX_TTL_MS = 100 * 365 * 24 * 3600 * 1000
# How a remember or an extract meets similar records: ``add`` writes beside them,
# ``reconcile`` asks the model (ADD, UPDATE, DELETE or NOOP). No value: ``reconcile``
# when the executor has a model, ``add`` when it has none (seed 000).
SUPERSEDE_MODES = ("add", "reconcile")


def text_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def keyed_digest(key: bytes, digest: str) -> str:
    """What a receipt stores of its request: HMAC-SHA256, keyed with the store's secret
    (``engram_secrets``), of ``Operation.digest``. Without the secret a copy of the
    receipts cannot confirm a guess of a request; migration 007 re-keyed the plain
    digests stored before it the same way."""
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def new_operation_id() -> str:
    return f"op_{uuid.uuid4().hex}"


# An operation's identity: its scope's key and its operation id. An operation id
# identifies an operation within its scope; the same id in two scopes is two operations.
OpKey = tuple[str, str]


def derived_record_id(scope_key: str, operation_id: str, index: int) -> str:
    """The id of the index-th record an operation creates.

    Derived from the operation (its scope and its id) so that a redelivered operation
    whose receipt was pruned aims at the same id (and meets its tombstone or its
    record) instead of creating a copy, while the same operation id in another scope
    aims elsewhere.
    """
    digest = hashlib.sha256(f"{scope_key}\x00{operation_id}\x00{index}".encode()).hexdigest()
    return f"mem_{digest[:26]}"


@dataclass(frozen=True, slots=True)
class Remember:
    kind_name: ClassVar[OperationKind] = "remember"
    text: str
    kind: str = DEFAULT_KIND
    importance: float | None = None
    metadata: dict[str, Any] | None = None
    origin: str = "asserted"
    sources: tuple[Source, ...] | None = None
    links: tuple[Link, ...] = ()
    ttl_ms: int | None = None
    id: str | None = None
    supersede: str | None = None
    top_k: int | None = None

    FIELDS: ClassVar[tuple[str, ...]] = (
        "text",
        "kind",
        "importance",
        "metadata",
        "origin",
        "sources",
        "links",
        "ttl_ms",
        "id",
        "supersede",
        "top_k",
    )

    @classmethod
    def from_dict(cls, data: object, *, metadata_bytes: int = MAX_METADATA_BYTES) -> Remember:
        f = Fields(data, "remember", cls.FIELDS)
        origin = f.get("origin")
        if origin is None:
            origin = "asserted"
        elif origin not in ORIGINS:
            raise InvalidRequestError(f"remember.origin must be one of {', '.join(ORIGINS)}")
        record_id = f.ident("id", required=False)
        supersede = _supersede(f)
        if supersede == "reconcile" and record_id is not None:
            raise InvalidRequestError(
                "remember.id cannot be combined with supersede 'reconcile': "
                "the model decides which record the text lands in"
            )
        return cls(
            text=str(f.text("text")),
            kind=f.kind() or DEFAULT_KIND,
            importance=f.importance(),
            metadata=f.metadata(max_bytes=metadata_bytes),
            origin=origin,
            sources=f.sources(),
            links=f.links() or (),
            ttl_ms=f.integer("ttl_ms", minimum=1, maximum=MAX_TTL_MS),
            id=record_id,
            supersede=supersede,
            top_k=f.integer("top_k", minimum=1, maximum=MAX_TOP_K),
        )

    def cited(self) -> tuple[Source, ...]:
        """Its sources; by default one host source with the digest of its text (seed 000)."""
        return self.sources or (Source(kind="host", digest=text_digest(self.text)),)

    def to_dict(self) -> dict[str, Any]:
        return _compact(
            {
                "text": self.text,
                "kind": self.kind,
                "importance": self.importance,
                "metadata": self.metadata,
                "origin": self.origin,
                "sources": [s.as_dict() for s in self.sources]
                if self.sources is not None
                else None,
                "links": [link.as_dict() for link in self.links] or None,
                "ttl_ms": self.ttl_ms,
                "id": self.id,
                "supersede": self.supersede,
                "top_k": self.top_k,
            }
        )


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation message an extraction may read, with its stable id."""

    id: str
    role: str
    content: Any
    run_id: str | None = None
    tool_name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return _compact(
            {
                "id": self.id,
                "message": {"role": self.role, "content": self.content},
                "run_id": self.run_id,
                "tool_name": self.tool_name,
            }
        )


MESSAGE_ROLES = ("user", "assistant", "tool", "system")


def parse_message(item: object, what: str) -> Message:
    f = Fields(item, what, ("id", "message", "run_id", "tool_name"))
    inner = Fields(f.get("message"), f"{what}.message", ("role", "content"))
    role = inner.get("role")
    if role not in MESSAGE_ROLES:
        raise InvalidRequestError(f"{what}.message.role must be one of {', '.join(MESSAGE_ROLES)}")
    content = plain_json(
        inner.get("content"), f"{what}.message.content", max_bytes=MAX_TEXT_CHARS * 4
    )
    return Message(
        id=str(f.ident("id")),
        role=role,
        content=content,
        run_id=f.ident("run_id", required=False),
        tool_name=f.ident("tool_name", required=False),
    )


@dataclass(frozen=True, slots=True)
class Extract:
    kind_name: ClassVar[OperationKind] = "extract"
    messages: tuple[Message, ...]
    kind: str | None = None
    ttl_ms: int | None = None
    links: tuple[Link, ...] = ()
    trusted_tools: tuple[str, ...] = ()
    infer: bool | None = None
    supersede: str | None = None
    top_k: int | None = None
    instructions: str | None = None

    FIELDS: ClassVar[tuple[str, ...]] = (
        "messages",
        "kind",
        "ttl_ms",
        "links",
        "trusted_tools",
        "infer",
        "supersede",
        "top_k",
        "instructions",
    )

    @classmethod
    def from_dict(cls, data: object) -> Extract:
        f = Fields(data, "extract", cls.FIELDS)
        items = as_list(f.get("messages"), "extract.messages", MAX_MESSAGES)
        messages = tuple(parse_message(m, f"extract.messages[{i}]") for i, m in enumerate(items))
        if len({m.id for m in messages}) != len(messages):
            raise InvalidRequestError("extract.messages ids must be unique")
        trusted = as_list(
            _or_empty_list(f.get("trusted_tools")), "extract.trusted_tools", MAX_SOURCES
        )
        infer = f.get("infer")
        if infer is not None and not isinstance(infer, bool):
            raise InvalidRequestError("extract.infer must be true or false")
        instructions = f.get("instructions")
        if instructions is not None:
            check_string(instructions, "extract.instructions", max_chars=MAX_INSTRUCTIONS_CHARS)
        return cls(
            messages=messages,
            kind=f.kind(),
            ttl_ms=f.integer("ttl_ms", minimum=1, maximum=MAX_TTL_MS),
            links=f.links() or (),
            trusted_tools=tuple(
                check_string(t, "extract.trusted_tools[]", max_chars=MAX_ID_CHARS) for t in trusted
            ),
            infer=infer,
            supersede=_supersede(f),
            top_k=f.integer("top_k", minimum=1, maximum=MAX_TOP_K),
            instructions=instructions,
        )

    def to_dict(self) -> dict[str, Any]:
        return _compact(
            {
                "messages": [m.as_dict() for m in self.messages],
                "kind": self.kind,
                "ttl_ms": self.ttl_ms,
                "links": [link.as_dict() for link in self.links] or None,
                "trusted_tools": list(self.trusted_tools) or None,
                "infer": self.infer,
                "supersede": self.supersede,
                "top_k": self.top_k,
                "instructions": self.instructions,
            }
        )


@dataclass(frozen=True, slots=True)
class Revise:
    kind_name: ClassVar[OperationKind] = "revise"
    id: str
    text: str | None = None
    kind: str | None = None
    importance: float | None = None
    metadata: dict[str, Any] | None = None
    links: tuple[Link, ...] | None = None
    ttl_ms: int | None = None
    expected_revision: int | None = None
    sources: tuple[Source, ...] | None = None  # added to the record's own
    only_inferred: bool | None = None  # True: an asserted record is refused (model tools)

    FIELDS: ClassVar[tuple[str, ...]] = (
        "id",
        "text",
        "kind",
        "importance",
        "metadata",
        "links",
        "ttl_ms",
        "expected_revision",
        "sources",
        "only_inferred",
    )

    @classmethod
    def from_dict(cls, data: object, *, metadata_bytes: int = MAX_METADATA_BYTES) -> Revise:
        f = Fields(data, "revise", cls.FIELDS)
        expected = f.integer("expected_revision", minimum=0, maximum=2**31 - 1)
        only_inferred = _only_inferred(f)
        if only_inferred and expected == 0:
            raise InvalidRequestError(
                "revise.only_inferred is for an existing record: not with expected_revision 0"
            )
        return cls(
            id=str(f.ident("id")),
            text=f.text("text", required=False),
            kind=f.kind(),
            importance=f.importance(),
            metadata=f.metadata(max_bytes=metadata_bytes),
            links=f.links(),
            ttl_ms=f.integer("ttl_ms", minimum=1, maximum=MAX_TTL_MS),
            expected_revision=expected,
            sources=f.sources(),
            only_inferred=only_inferred,
        )

    def to_dict(self) -> dict[str, Any]:
        return _compact(
            {
                "id": self.id,
                "text": self.text,
                "kind": self.kind,
                "importance": self.importance,
                "metadata": self.metadata,
                "links": [link.as_dict() for link in self.links]
                if self.links is not None
                else None,
                "ttl_ms": self.ttl_ms,
                "expected_revision": self.expected_revision,
                "sources": [s.as_dict() for s in self.sources]
                if self.sources is not None
                else None,
                "only_inferred": self.only_inferred,
            }
        )


@dataclass(frozen=True, slots=True)
class Retract:
    kind_name: ClassVar[OperationKind] = "retract"
    id: str
    expected_revision: int | None = None
    only_inferred: bool | None = None

    @classmethod
    def from_dict(cls, data: object) -> Retract:
        f = Fields(data, "retract", ("id", "expected_revision", "only_inferred"))
        return cls(
            id=str(f.ident("id")),
            expected_revision=f.integer("expected_revision", minimum=1, maximum=2**31 - 1),
            only_inferred=_only_inferred(f),
        )

    def to_dict(self) -> dict[str, Any]:
        return _compact(
            {
                "id": self.id,
                "expected_revision": self.expected_revision,
                "only_inferred": self.only_inferred,
            }
        )


@dataclass(frozen=True, slots=True)
class Forget:
    kind_name: ClassVar[OperationKind] = "forget"
    id: str

    @classmethod
    def from_dict(cls, data: object) -> Forget:
        f = Fields(data, "forget", ("id",))
        return cls(id=str(f.ident("id")))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id}


Request = Remember | Extract | Revise | Retract | Forget
REQUEST_TYPES: dict[
    str, type[Remember] | type[Extract] | type[Revise] | type[Retract] | type[Forget]
] = {
    "remember": Remember,
    "extract": Extract,
    "revise": Revise,
    "retract": Retract,
    "forget": Forget,
}


@dataclass(frozen=True, slots=True)
class Operation:
    operation_id: str
    scope: Scope
    request: Request
    requested_by: str | None = field(default=None, compare=False)
    """Who asked (an operator's name, ``local``, an API caller), stored on the receipt for
    the audit trail. Not part of the request: a repeat asked by someone else replays."""
    digest: str = field(init=False, repr=False, compare=False)
    """Identifies the request (not the id): same id + other digest = conflict. Never
    stored as it is (``keyed_digest``)."""

    def __post_init__(self) -> None:
        body = {"kind": self.kind, "scope": self.scope.as_dict(), "request": self.request.to_dict()}
        try:
            encoded = canonical_json(body).encode()
        except UnicodeEncodeError:  # built around from_dict, which refuses such text by field
            raise InvalidRequestError(
                f"operation {self.operation_id!r} holds text with no UTF-8 form"
            ) from None
        object.__setattr__(self, "digest", hashlib.sha256(encoded).hexdigest())

    @property
    def kind(self) -> OperationKind:
        return self.request.kind_name

    @property
    def key(self) -> OpKey:
        """What identifies the operation: (scope key, operation id)."""
        return (self.scope.key, self.operation_id)

    def derived_id(self, index: int) -> str:
        """The id of the index-th record this operation creates (``derived_record_id``)."""
        return derived_record_id(self.scope.key, self.operation_id, index)

    @classmethod
    def from_dict(cls, data: object, *, metadata_bytes: int = MAX_METADATA_BYTES) -> Operation:
        """The operation ``data`` holds, checked. ``metadata_bytes``: the largest metadata
        a remember or revise may carry; the doors' ``MAX_METADATA_BYTES`` unless the
        caller is one that may write up to ``MAX_STORED_METADATA_BYTES`` (store.limits)."""
        f = Fields(data, "operation", ("operation_id", "kind", "scope", "request", "requested_by"))
        kind = f.get("kind")
        if not isinstance(kind, str) or kind not in REQUEST_TYPES:
            raise InvalidRequestError(f"operation.kind must be one of {', '.join(OPERATION_KINDS)}")
        return cls(
            operation_id=str(f.ident("operation_id")),
            scope=Scope.of(f.get("scope")),
            request=_request(kind, _or_empty(f.get("request")), metadata_bytes),
            requested_by=f.ident("requested_by", required=False),
        )

    @classmethod
    def build(
        cls,
        kind: str,
        scope: Scope | Mapping[str, Any],
        request: Mapping[str, Any],
        operation_id: str | None = None,
        *,
        requested_by: str | None = None,
        metadata_bytes: int = MAX_METADATA_BYTES,
    ) -> Operation:
        """Validate a request given as keyword values; generate an id when none is given.
        ``metadata_bytes`` as in ``from_dict``."""
        return cls.from_dict(
            _compact(
                {
                    "operation_id": new_operation_id() if operation_id is None else operation_id,
                    "kind": kind,
                    "scope": scope.as_dict() if isinstance(scope, Scope) else scope,
                    "request": _compact(dict(request)),
                    "requested_by": requested_by,
                }
            ),
            metadata_bytes=metadata_bytes,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "operation_id": self.operation_id,
            "kind": self.kind,
            "scope": self.scope.as_dict(),
            "request": self.request.to_dict(),
        }
        if self.requested_by is not None:
            out["requested_by"] = self.requested_by
        return out


def _request(kind: str, data: object, metadata_bytes: int) -> Request:
    """The request of an operation of ``kind``; only a remember and a revise carry metadata."""
    if kind == "remember":
        return Remember.from_dict(data, metadata_bytes=metadata_bytes)
    if kind == "revise":
        return Revise.from_dict(data, metadata_bytes=metadata_bytes)
    return REQUEST_TYPES[kind].from_dict(data)


def _supersede(f: Fields) -> str | None:
    value = f.get("supersede")
    if value is not None and value not in SUPERSEDE_MODES:
        raise InvalidRequestError(f"{f.what}.supersede must be one of {', '.join(SUPERSEDE_MODES)}")
    return value  # type: ignore[no-any-return]


def _only_inferred(f: Fields) -> bool | None:
    """``true`` or nothing: ``false`` is the default, and the same request either way."""
    value = f.get("only_inferred")
    if value is not None and not isinstance(value, bool):
        raise InvalidRequestError(f"{f.what}.only_inferred must be true or false")
    return True if value else None


def _or_empty(request: object) -> object:
    """A missing request is an empty one (a forget of nothing names no id, and says so)."""
    return {} if request is None else request


def _or_empty_list(items: object) -> object:
    return [] if items is None else items


def _compact(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
