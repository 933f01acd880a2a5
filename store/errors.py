"""engram's errors: one root, one class per thing a caller can act on.

Each class has a stable ``code`` (what the stream protocol and the HTTP API
send) and the HTTP ``status`` it maps to. Messages never contain memory text.

``ERRORS_BY_CODE`` is the one registry of codes: a class that says a ``code`` of
its own registers itself as it is defined (``EngramError.__init_subclass__``), and
``error_from_dict`` rebuilds that class from its ``to_dict()``. A subclass that says
no code of its own (``MalformedEntryError``, ``web.errors.BadRequestError``) is an
alias: it crosses the wire as the class whose code it has. Two classes may not
claim one code. The store's and the queue's errors (every code a worker replies
with or a receipt keeps) live in ``store/errors.py`` and ``worker/errors.py``, so
whoever decodes a reply or a receipt has them all registered; the web's, the jobs'
and ``engram``'s own register when their module is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self


class EngramError(Exception):
    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            _register(cls)

    def details(self) -> dict[str, Any]:
        """Extra fields a remote caller needs to rebuild this error."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details()}

    @classmethod
    def from_dict(cls, message: str, data: Mapping[str, Any]) -> Self:
        """This error again, from ``to_dict()`` output read back (untrusted: checked)."""
        return cls(message)


# Every code, and the class that crosses the wire as it.
ERRORS_BY_CODE: dict[str, type[EngramError]] = {EngramError.code: EngramError}


def _register(cls: type[EngramError]) -> None:
    known = ERRORS_BY_CODE.get(cls.code)
    reloaded = known is not None and (known.__module__, known.__qualname__) == (
        cls.__module__,
        cls.__qualname__,
    )
    if known is not None and not reloaded:
        raise TypeError(
            f"{cls.__qualname__}: the code {cls.code!r} is {known.__qualname__}'s"
            " (subclass it without a code of its own to share it)"
        )
    ERRORS_BY_CODE[cls.code] = cls


class InvalidRequestError(EngramError):
    code = "invalid_request"
    status = 422


class NotFoundError(EngramError):
    code = "not_found"
    status = 404


def unknown_operation(op_id: str) -> NotFoundError:
    """What the API, the dashboard and ``engram wait`` say of an operation nothing
    knows, or only a reply that a restore of the database made untrue."""
    return NotFoundError(
        f"no operation {op_id}: no receipt, no reply, not queued"
        " (never sent, or maybe lost to a restore)"
    )


class OperationConflictError(EngramError):
    """The operation id was already used for a different request."""

    code = "operation_conflict"
    status = 409


class AmbiguousIdError(EngramError):
    """An id asked for without its scope is in more than one scope (an operation id and
    a record id each identify one within its scope). Only the operator looks an id up
    across scopes: ``scopes`` lists the scopes that hold it, to choose from. A scoped
    token's look-up is always in its own scope and never meets it. Raised as one of
    its subclasses, which say what kind of id it was."""

    status = 409

    def __init__(self, message: str, *, scopes: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.scopes = list(scopes or [])

    def details(self) -> dict[str, Any]:
        return {"scopes": self.scopes}

    @classmethod
    def from_dict(cls, message: str, data: Mapping[str, Any]) -> Self:
        scopes = data.get("scopes")
        return cls(
            message,
            scopes=[
                {str(k): str(v) for k, v in s.items()}
                for s in (scopes if isinstance(scopes, list) else [])
                if isinstance(s, Mapping)
            ],
        )


class OperationAmbiguousError(AmbiguousIdError):
    """An operation id asked for without its scope is in more than one scope."""

    code = "operation_ambiguous"


class RecordAmbiguousError(AmbiguousIdError):
    """A record id asked for without its scope is held (live or forgotten) in more than
    one scope: the same id in two scopes is two records."""

    code = "record_ambiguous"


class RevisionConflictError(EngramError):
    """The record is not at the revision the caller planned against.

    ``actual`` is None when the conflict is with a record the caller may not
    see (another scope's id, or a forgotten one): nothing about it is revealed.
    """

    code = "revision_conflict"
    status = 409

    def __init__(
        self, message: str, *, expected: int | None, actual: int | None, attempts: int = 1
    ) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual
        self.attempts = attempts

    def details(self) -> dict[str, Any]:
        return {"expected": self.expected, "actual": self.actual, "attempts": self.attempts}

    @classmethod
    def from_dict(cls, message: str, data: Mapping[str, Any]) -> Self:
        return cls(
            message,
            expected=data.get("expected"),
            actual=data.get("actual"),
            attempts=int(data.get("attempts", 1)),
        )


class EmbeddingMismatchError(EngramError):
    """A vector from another model or of another size than the generation's."""

    code = "embedding_mismatch"
    status = 409


class AssertedRecordError(EngramError):
    """The write may only touch inferred records (``only_inferred``), and this one was asserted."""

    code = "asserted_record"
    status = 409


class ModelUnavailableError(EngramError):
    """The model could not answer: not configured, unreachable, too slow, or it refused.

    ``reason`` says which (``timeout``, ``deadline``, ``connection``, ``http_429``,
    ``http_500``, ``protocol``, ``error``...). Nothing was committed: the
    operation may be sent again with the same id.
    """

    code = "model_unavailable"
    status = 503

    def __init__(self, message: str, *, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_dict(cls, message: str, data: Mapping[str, Any]) -> Self:
        return cls(message, reason=str(data.get("reason", "error")))


class ModelOutputError(EngramError):
    """The model answered something unusable (not JSON, an unknown event, a record id
    it was not shown, an oversized answer...). Nothing was committed."""

    code = "model_output"
    status = 502


class EmbedderUnavailableError(EngramError):
    """No embedder for a model is available here: unknown to the registry, or its
    package is not installed (the message says which)."""

    code = "embedder_unavailable"
    status = 503


class FencedError(EngramError):
    """A writer holding a stale partition lease tried to commit; ``fences`` names them."""

    code = "fenced"
    status = 409

    def __init__(self, message: str, *, fences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fences = fences


class TokenNameTakenError(EngramError):
    """A scoped token of that name exists, live or revoked: a name stays with the
    token that had it (receipts and the audit name it), so a new token needs its own."""

    code = "token_name_taken"
    status = 409


class SchemaVersionError(EngramError):
    code = "schema_version"
    status = 500


class RedactionHeldError(EngramError):
    """A forget's deleted row versions cannot leave the tables yet: something still
    holds the xmin horizon before it (``holders``, content-free: a standby's snapshot,
    a replication slot, a prepared transaction, an open transaction). Not a failure:
    the redaction finishes once they are gone."""

    code = "redaction_held"
    status = 503

    def __init__(self, holders: list[str]) -> None:
        super().__init__(held_by(holders))
        self.holders = tuple(holders)

    def details(self) -> dict[str, Any]:
        return {"holders": list(self.holders)}

    @classmethod
    def from_dict(cls, message: str, data: Mapping[str, Any]) -> Self:
        """The holders as sent (strings only, at most ``MAX_HOLDERS_READ`` of them);
        the message is kept as it was sent."""
        sent = data.get("holders")
        holders = [h for h in sent if isinstance(h, str)] if isinstance(sent, list) else []
        error = cls(holders[:MAX_HOLDERS_READ])
        EngramError.__init__(error, message)
        return error


MAX_HOLDERS_READ = 100  # a reply read back is untrusted: its list is bounded


def held_by(holders: list[str] | tuple[str, ...]) -> str:
    """The reason a held redaction shows (receipt, reply, dashboard, ``engram health``):
    the first few holders, and how many more."""
    shown = "; ".join(holders[:_HOLDERS_SHOWN])
    more = len(holders) - _HOLDERS_SHOWN
    return f"held by {shown}" + (f"; and {more} more" if more > 0 else "")


_HOLDERS_SHOWN = 5


def error_from_dict(data: Mapping[str, Any]) -> EngramError:
    """Rebuild a typed error from ``EngramError.to_dict()`` output: the class its code
    names, or a plain ``EngramError`` for a code this process does not know."""
    code = str(data.get("code", "internal"))
    message = str(data.get("message", code))
    return ERRORS_BY_CODE.get(code, EngramError).from_dict(message, data)


class RestorePendingError(EngramError):
    """A restore has not finished re-applying the forget ledger to this database: nothing
    may read or write it until ``engram restore`` runs to its end (a forgotten record's
    text could still be in it)."""

    code = "restore_pending"
    status = 503


class ConfigError(EngramError):
    """Something engram needs is not configured, or configured wrong: no URL and no
    ``engram up`` running, or a dashboard that cannot start as set up."""

    code = "not_configured"
    status = 503


class LedgerUnavailableError(ConfigError):
    """The forget ledger's directory cannot be written (a missing mount, a full disk, no
    rights): nothing was appended, so the forgets it was given are not ``complete``."""

    code = "ledger_unavailable"


class LedgerMissingError(ConfigError):
    """A restore found no forget ledger covering its backup (neither the home's nor the
    copy beside the backups holds what the ledger held when the backup was taken):
    restored, the database would bring back whatever was forgotten since. Nothing was
    changed; ``engram restore --without-ledger`` proceeds anyway, saying so."""

    code = "ledger_missing"


class GenerationNotPendingError(EngramError):
    """Only a pending generation can be cancelled: this one is active, retired or
    cancelled already. Nothing was changed."""

    code = "generation_not_pending"
    status = 409


class UnregisteredModelError(InvalidRequestError):
    """A model asked for from outside that is not one of the registry's names."""

    code = "unregistered_model"


class EmbedderLoadError(InvalidRequestError):
    """A model asked for cannot be loaded here (its package is missing, its factory or
    its first embedding fails): nothing was started."""

    code = "embedder_cannot_load"
