"""``Session``: the API of one scope (seed 000's session), synchronous."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Unpack

from .errors import EngramError
from .ledger import LedgerEntry
from .limits import DEFAULT_MIN_RELEVANCE, DEFAULT_TOP_K
from .models.llm import LLM
from .values import Hit, Record, ReembedResult, Scope, WriteResult
from .vectors.embedders import Embedder
from .write.operations import Operation
from .write.options import WriteOptions
from .write.requests import (
    ExtractFields,
    RememberFields,
    RetractFields,
    ReviseFields,
    extract_request,
    forget_request,
    remember_request,
    retract_request,
    revise_request,
)
from .write.writer import Result

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ForgetEvent:
    """What a forget listener is told: ids and revision numbers, never text."""

    scope: Scope
    record_id: str
    revisions: tuple[int, ...]
    operation_id: str
    already_forgotten: bool

    @property
    def key(self) -> tuple[str, str]:
        """The forget's identity: (scope key, operation id)."""
        return (self.scope.key, self.operation_id)


ForgetListener = Callable[[ForgetEvent], None]


def _unwrap(result: Result) -> WriteResult:
    if isinstance(result, EngramError):
        raise result
    return result


class Session:
    """The API of one scope (seed 000's session), synchronous."""

    def __init__(
        self,
        store: Store,
        scope: Scope,
        *,
        embedder: Embedder | None,
        on_forget: list[ForgetListener],
        llm: LLM | None = None,
    ) -> None:
        self.store = store
        self.scope = scope
        self.embedder = embedder
        self.on_forget = on_forget
        self.llm = llm

    def _run(self, kind: str, request: dict[str, Any], operation_id: str | None) -> WriteResult:
        return _unwrap(self.write(Operation.build(kind, self.scope, request, operation_id)))

    def write(self, op: Operation) -> Result:
        """Commit one operation of this scope with the session's embedder and model."""
        [result] = self.store.execute(
            [op], self.embedder, llm=self.llm, options=WriteOptions(listeners=bool(self.on_forget))
        )
        return result

    # The verbs' fields are written once, in ``write.requests`` (``RememberFields`` ...).

    def remember(
        self, text: str, *, operation_id: str | None = None, **fields: Unpack[RememberFields]
    ) -> WriteResult:
        return self._run("remember", remember_request(text, **fields), operation_id)

    def extract(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        operation_id: str | None = None,
        **fields: Unpack[ExtractFields],
    ) -> WriteResult:
        return self._run("extract", extract_request(messages, **fields), operation_id)

    def revise(
        self, record_id: str, *, operation_id: str | None = None, **fields: Unpack[ReviseFields]
    ) -> WriteResult:
        return self._run("revise", revise_request(record_id, **fields), operation_id)

    def retract(
        self, record_id: str, *, operation_id: str | None = None, **fields: Unpack[RetractFields]
    ) -> WriteResult:
        return self._run("retract", retract_request(record_id, **fields), operation_id)

    def forget(self, record_id: str, *, operation_id: str | None = None) -> WriteResult:
        result = self._run("forget", forget_request(record_id), operation_id)
        if self.store.ledger is not None and (result.revisions or result.already_forgotten):
            # Before the listeners, and before its redaction may say ``complete``.
            entry = ledger_entry(self.scope, record_id, result, self.store.database_key)
            self.store.ledger.append([entry])
        if result.receipt.redaction in (None, "none") or not self.on_forget:
            return result
        status = run_forget_listeners(
            self.on_forget,
            ForgetEvent(
                scope=self.scope,
                record_id=record_id,
                revisions=result.revisions,
                operation_id=result.receipt.operation_id,
                already_forgotten=result.already_forgotten,
            ),
        )
        self.store.set_redaction(result.receipt.operation_id, status, self.scope)
        return replace(result, receipt=replace(result.receipt, redaction=status))  # type: ignore[arg-type]

    # ``after``: a receipt's ``position``; the read then sees that write (see Store.get).

    def get(self, record_id: str, *, after: str | None = None) -> Record | None:
        return self.store.get(self.scope, record_id, after=after)

    def history(self, record_id: str, *, after: str | None = None) -> list[Record]:
        return self.store.history(self.scope, record_id, after=after)

    def recall(
        self,
        text: str | None = None,
        *,
        top_k: int = DEFAULT_TOP_K,
        kind: str | None = None,
        include_retracted: bool = False,
        recorded_as_of: datetime | None = None,
        after: str | None = None,
        text_only: bool = False,
        min_relevance: float | None = DEFAULT_MIN_RELEVANCE,
    ) -> list[Hit]:
        """``Store.recall`` in this scope, with this session's embedder (none: the active
        generation's model), or by text only."""
        return self.store.recall(
            self.scope,
            text,
            embedder=None if text_only else self.embedder,
            top_k=top_k,
            kind=kind,
            include_retracted=include_retracted,
            recorded_as_of=recorded_as_of,
            after=after,
            text_only=text_only,
            min_relevance=min_relevance,
        )

    def reembed(self, embedder: Embedder, *, batch_size: int = 64) -> ReembedResult:
        """Move the whole store to ``embedder``; on activation this session uses it."""
        result = self.store.embeddings.reembed(embedder, batch_size=batch_size)
        if result.activated:
            self.embedder = embedder
        return result


def ledger_entry(scope: Scope, record_id: str, result: WriteResult, database: str) -> LedgerEntry:
    """What the forget ledger keeps of a committed forget in ``database``."""
    return LedgerEntry(
        record_id=record_id,
        scope=scope.as_dict(),
        operation_id=result.receipt.operation_id,
        at=result.receipt.committed_at,
        database=database,
    )


def run_forget_listeners(listeners: Sequence[ForgetListener], event: ForgetEvent) -> str:
    """Await every listener in order; 'complete', or 'failed' if one raised."""
    status = "complete"
    for listener in listeners:
        try:
            listener(event)
        except Exception as exc:  # a listener's failure never undoes the forget
            status = "failed"
            log.error(
                "forget listener failed",
                extra={
                    "record_id": event.record_id,
                    "operation_id": event.operation_id,
                    "listener": getattr(listener, "__name__", type(listener).__name__),
                    "error": type(exc).__name__,
                },
            )
    return status
