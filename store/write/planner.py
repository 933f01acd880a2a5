"""Planning a batch of operations against one scope's state: pure, no I/O.

The writer loads the state of every record a batch names (under the scope's
row lock), asks ``plan_batch`` what to write, and writes it. All the rules of
seed 000 that decide an operation's outcome live here: revision checks,
tombstones (a record id is its scope's: no other scope's id is seen here),
no-op receipts, forget within a batch, and the application of a model's
decision (``reconcile.Decision``) to the records as they are now, and what a
repeat of an operation id is answered.

A receipt stores its request's digest keyed with the store's secret
(``keyed_digest``): a copy of the receipts cannot confirm a guess of a request.
Once redacted (a record it wrote or named was forgotten) it stores none, and a
repeat of its id is answered with the receipt whatever the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ..errors import (
    AssertedRecordError,
    EngramError,
    InvalidRequestError,
    NotFoundError,
    OperationConflictError,
    RevisionConflictError,
    error_from_dict,
)
from ..limits import DEFAULT_KIND, RAW_EXTRACT_KIND
from ..values import Link, Proposal, RecordRef, Scope, Source
from .extraction import readable_sources
from .needs import infers, missing_model, supersede_of
from .operations import (
    Extract,
    Forget,
    Operation,
    OpKey,
    Remember,
    Retract,
    Revise,
    keyed_digest,
    text_digest,
)
from .options import WriteOptions
from .reconcile import Create, Decision, Named, Proposed, Retire, Update


@dataclass(frozen=True, slots=True)
class Current:
    """A record's current revision, as the planner sees it."""

    id: str
    revision: int
    status: str
    text: str
    kind: str
    importance: float | None
    metadata: dict[str, Any]
    origin: str
    sources: tuple[Source, ...]
    links: tuple[Link, ...]
    digest: str
    expires_at: datetime | None
    created_at: datetime
    revisions: tuple[int, ...]  # every stored revision number, for a forget

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    operation_id: str
    request_digest: str  # keyed (``keyed_digest``); empty once redacted
    error: dict[str, Any] | None = None  # a refusal: replayed as the same error
    redacted: bool = False
    records: frozenset[str] = frozenset()  # the records it wrote or named


@dataclass(slots=True)
class ScopeState:
    scope_id: int
    scope: Scope
    revision: int
    records: dict[str, Current]  # this scope's records the batch names
    forgotten: set[str]  # ids forgotten in this scope (another scope's are not its)
    receipts: dict[str, StoredReceipt]  # by operation id, this scope's only


@dataclass(frozen=True, slots=True)
class RevisionRow:
    record: Current
    operation_id: str
    recorded_at: datetime
    # Indexed with the text, never shown (migration 018): the message before an
    # extracted turn, and the record that holds it.
    context: str | None = None
    context_of: str | None = None


@dataclass(slots=True)
class ReceiptRow:
    operation_id: str
    kind: str
    request_digest: str
    request: dict[str, Any] | None
    scope_revision: int
    committed_at: datetime
    refs: list[RecordRef]
    # Records the operation's decision kept in place of its text (``Decision.named``): it
    # wrote nothing to them, but a forget of one redacts this receipt.
    named: list[str] = field(default_factory=list)
    # What its model proposed and the planner did not apply (``reconcile.Proposed``).
    proposed: list[Proposal] = field(default_factory=list)
    forgotten_revisions: list[int] | None = None
    already_forgotten: bool | None = None
    redaction: str | None = None
    stream_entry: str | None = None
    redacted: bool = False
    error: dict[str, Any] | None = None  # set on a refusal: nothing else was written
    model_calls: int = 0
    requested_by: str | None = None


@dataclass(frozen=True, slots=True)
class Applied:
    receipt: ReceiptRow
    written: tuple[RevisionRow, ...]


@dataclass(frozen=True, slots=True)
class Replayed:
    operation_id: str


Outcome = Applied | Replayed | EngramError


@dataclass(slots=True)
class Plan:
    outcomes: list[Outcome] = field(default_factory=list)
    revisions: list[RevisionRow] = field(default_factory=list)
    final: dict[str, Current] = field(default_factory=dict)  # touched, still live
    text_changed: set[str] = field(default_factory=set)  # stored vectors are stale
    links_changed: set[str] = field(default_factory=set)
    forgotten_stored: list[str] = field(default_factory=list)  # delete from the database
    tombstones: list[tuple[str, str]] = field(default_factory=list)  # (record id, op id)
    receipts: list[ReceiptRow] = field(default_factory=list)
    scope_revision: int = 0
    replayed: list[str] = field(default_factory=list)  # answered from their stored receipt

    @property
    def changes_anything(self) -> bool:
        return bool(self.receipts)


@dataclass(frozen=True, slots=True)
class PlanContext:
    now: datetime
    options: WriteOptions = field(default_factory=WriteOptions)
    # The store's secret for request digests (``keyed_digest``).
    digest_key: bytes = b""

    @property
    def listeners(self) -> bool:
        return self.options.listeners

    @property
    def stream_entries(self) -> Mapping[OpKey, str]:
        return self.options.stream_entries

    @property
    def decisions(self) -> Mapping[OpKey, Decision]:
        return self.options.decisions

    def model_calls(self, key: OpKey) -> int:
        decision = self.decisions.get(key)
        return decision.model_calls if decision is not None else 0

    def request_digest(self, op: Operation) -> str:
        if not self.digest_key:
            raise ValueError("a plan needs the store's digest key")
        return keyed_digest(self.digest_key, op.digest)


def plan_batch(state: ScopeState, ops: list[Operation], ctx: PlanContext) -> Plan:
    """Apply ``ops`` in order to a copy of ``state``; say what to write.

    ``state.receipts`` holds what was committed under these operation ids in this
    scope before (a receipt, or a refusal), including earlier in the same batch. An
    operation id of another scope is another operation: it is not there.
    """
    plan = Plan(scope_revision=state.revision)
    records = dict(state.records)
    for index, op in enumerate(ops):
        digest = ctx.request_digest(op)
        stored = state.receipts.get(op.operation_id)
        if stored is not None:
            _answer_replay(plan, op, digest, stored)
            continue
        base = _ReceiptBase(op, digest, ctx.now + timedelta(microseconds=index), ctx)
        step = _Step(state, records, op, base.at, ctx)
        try:
            writes, extra = step.run()
        except EngramError as error:
            _plan_refused(plan, state, base.refused(error, plan.scope_revision), error)
            continue
        plan.scope_revision += 1
        receipt = base.applied(plan.scope_revision, step, writes, extra)
        _plan_applied(plan, state, records, step, receipt, writes)
    return plan


@dataclass(frozen=True, slots=True)
class _ReceiptBase:
    """What a receipt of one operation holds, whether it was refused or applied."""

    op: Operation
    digest: str
    at: datetime
    ctx: PlanContext

    def _row(
        self, request: dict[str, Any] | None, scope_revision: int, refs: list[RecordRef]
    ) -> ReceiptRow:
        op_id = self.op.operation_id
        return ReceiptRow(
            operation_id=op_id,
            kind=self.op.kind,
            request_digest=self.digest,
            request=request,
            scope_revision=scope_revision,
            committed_at=self.at,
            refs=refs,
            stream_entry=self.ctx.stream_entries.get(self.op.key),
            model_calls=self.ctx.model_calls(self.op.key),
            requested_by=self.op.requested_by,
        )

    def refused(self, error: EngramError, scope_revision: int) -> ReceiptRow:
        """The refusal, content-free, at the scope revision it left as it was."""
        row = self._row(refused_request(self.op), scope_revision, [])
        row.error = error.to_dict()
        return row

    def applied(
        self, scope_revision: int, step: _Step, writes: list[RevisionRow], extra: dict[str, Any]
    ) -> ReceiptRow:
        refs = [RecordRef(w.record.id, w.record.revision, w.record.status) for w in writes]  # type: ignore[arg-type]
        row = self._row(self.op.request.to_dict(), scope_revision, refs)
        return replace(row, named=step.named, proposed=step.proposed, **extra)


def _answer_replay(plan: Plan, op: Operation, digest: str, stored: StoredReceipt) -> None:
    outcome = _replay(op, digest, stored)
    if not isinstance(outcome, OperationConflictError):
        plan.replayed.append(op.operation_id)
    plan.outcomes.append(outcome)


def _plan_refused(plan: Plan, state: ScopeState, receipt: ReceiptRow, error: EngramError) -> None:
    """Keep the refusal so a redelivery answers the same, and it is found by the record
    it named."""
    plan.receipts.append(receipt)
    state.receipts[receipt.operation_id] = StoredReceipt(
        receipt.operation_id, receipt.request_digest, error.to_dict()
    )
    plan.outcomes.append(error)


def _plan_applied(
    plan: Plan,
    state: ScopeState,
    records: dict[str, Current],
    step: _Step,
    receipt: ReceiptRow,
    writes: list[RevisionRow],
) -> None:
    if any(rid not in records for rid in step.named):
        # Forgotten since the model named it: the text must not outlive it here.
        _redact(receipt)
    _record_writes(plan, step, writes)
    op = step.op
    if isinstance(op.request, Forget):
        _forget_in_plan(plan, state, op.request.id, op.operation_id, step)
    plan.receipts.append(receipt)
    state.receipts[op.operation_id] = StoredReceipt(
        op.operation_id,
        receipt.request_digest,
        redacted=receipt.redacted,
        records=frozenset([ref.id for ref in receipt.refs] + receipt.named),
    )
    plan.outcomes.append(Applied(receipt, tuple(writes)))


def _replay(op: Operation, digest: str, stored: StoredReceipt) -> Outcome:
    if stored.redacted:
        # Its request is erased: comparing would confirm or deny a guess of it.
        return Replayed(op.operation_id)
    if stored.request_digest != digest:
        return OperationConflictError(
            f"operation {op.operation_id} was already used for a different request"
        )
    if stored.error is not None:
        return error_from_dict(stored.error)
    return Replayed(op.operation_id)


def _record_writes(plan: Plan, step: _Step, writes: list[RevisionRow]) -> None:
    for w in writes:
        plan.revisions.append(w)
        plan.final[w.record.id] = w.record
    plan.text_changed |= step.text_changed
    plan.links_changed |= step.links_changed


def _forget_in_plan(plan: Plan, state: ScopeState, record_id: str, op_id: str, step: _Step) -> None:
    if not step.deleted:
        return
    plan.revisions = [r for r in plan.revisions if r.record.id != record_id]
    plan.final.pop(record_id, None)
    plan.text_changed.discard(record_id)
    plan.links_changed.add(record_id)
    for receipt in plan.receipts:
        if any(ref.id == record_id for ref in receipt.refs) or record_id in receipt.named:
            _redact(receipt)
    # What a repeat later in the batch is answered: as the database will have it.
    for stored in list(state.receipts.values()):
        if record_id in stored.records:
            state.receipts[stored.operation_id] = replace(stored, request_digest="", redacted=True)
    if record_id in state.records:
        plan.forgotten_stored.append(record_id)
    plan.tombstones.append((record_id, op_id))


def _redact(receipt: ReceiptRow) -> None:
    receipt.request = None
    receipt.request_digest = ""
    receipt.redacted = True


class _Step:
    """One operation planned against the batch's working state."""

    def __init__(
        self,
        state: ScopeState,
        records: dict[str, Current],
        op: Operation,
        at: datetime,
        ctx: PlanContext,
    ) -> None:
        self.state = state
        self.records = records
        self.op = op
        self.at = at
        self.ctx = ctx
        self.text_changed: set[str] = set()
        self.links_changed: set[str] = set()
        self.deleted = False
        self.named: list[str] = []
        self.proposed: list[Proposal] = []

    def run(self) -> tuple[list[RevisionRow], dict[str, Any]]:
        request = self.op.request
        if isinstance(request, Remember):
            return self._remember(request), {}
        if isinstance(request, Extract):
            return self._extract(request), {}
        if isinstance(request, Revise):
            return self._revise(request), {}
        if isinstance(request, Retract):
            return self._retract(request), {}
        return [], self._forget(request)

    # -- helpers ---------------------------------------------------------------

    def _live(self, record_id: str) -> Current | None:
        current = self.records.get(record_id)
        if current is None or current.expired(self.at):
            return None
        return current

    def _check_new_id(self, record_id: str) -> None:
        if record_id in self.state.forgotten:
            raise RevisionConflictError(
                f"record id {record_id} cannot be created: it was forgotten",
                expected=0,
                actual=None,
            )
        current = self.records.get(record_id)
        if current is not None:
            raise RevisionConflictError(
                f"record {record_id} already exists",
                expected=0,
                actual=None if current.expired(self.at) else current.revision,
            )

    def _expires(self, ttl_ms: int | None, keep: datetime | None = None) -> datetime | None:
        return self.at + timedelta(milliseconds=ttl_ms) if ttl_ms is not None else keep

    def _write(self, record: Current, *, text_changed: bool, links_changed: bool) -> RevisionRow:
        previous = self.records.get(record.id)
        record = replace(
            record, revisions=(previous.revisions if previous else ()) + (record.revision,)
        )
        self.records[record.id] = record
        if text_changed:
            self.text_changed.add(record.id)
        if links_changed:
            self.links_changed.add(record.id)
        return RevisionRow(record=record, operation_id=self.op.operation_id, recorded_at=self.at)

    def _create(
        self,
        record_id: str,
        *,
        text: str,
        kind: str,
        importance: float | None,
        metadata: dict[str, Any] | None,
        origin: str,
        sources: tuple[Source, ...],
        links: tuple[Link, ...],
        ttl_ms: int | None,
    ) -> RevisionRow:
        self._check_new_id(record_id)
        record = Current(
            id=record_id,
            revision=1,
            status="active",
            text=text,
            kind=kind,
            importance=importance,
            metadata=metadata or {},
            origin=origin,
            sources=sources,
            links=links,
            digest=text_digest(text),
            expires_at=self._expires(ttl_ms),
            created_at=self.at,
            revisions=(),
        )
        return self._write(record, text_changed=True, links_changed=bool(links))

    # -- operations ------------------------------------------------------------

    def _remember(self, r: Remember) -> list[RevisionRow]:
        decision = self.ctx.decisions.get(self.op.key)
        if decision is not None:
            return self._decided(
                decision, r.origin, r.kind, r.importance, r.metadata, r.links, r.ttl_ms
            )
        if supersede_of(r, has_llm=False) == "reconcile":
            raise missing_model(r)
        return [
            self._create(
                r.id or self.op.derived_id(0),
                text=r.text,
                kind=r.kind,
                importance=r.importance,
                metadata=r.metadata,
                origin=r.origin,
                sources=r.cited(),
                links=r.links,
                ttl_ms=r.ttl_ms,
            )
        ]

    def _extract(self, r: Extract) -> list[RevisionRow]:
        decision = self.ctx.decisions.get(self.op.key)
        if decision is not None:
            kind = r.kind or DEFAULT_KIND
            return self._decided(decision, "inferred", kind, None, None, r.links, r.ttl_ms)
        if infers(r, has_llm=False) or supersede_of(r, has_llm=False) == "reconcile":
            raise missing_model(r)
        readable = readable_sources(r.messages, r.trusted_tools, self.state.scope.chat_id)
        rows = [
            self._create(
                self.op.derived_id(i),
                text=item.text,
                kind=r.kind or RAW_EXTRACT_KIND,
                importance=None,
                metadata=None,
                origin="inferred",
                sources=(item.source,),
                links=r.links,
                ttl_ms=r.ttl_ms,
            )
            for i, item in enumerate(readable)
        ]
        # Each turn is indexed with the one before it, which it often answers
        # (docs/recall-quality.md: evidence recall on LoCoMo).
        return [
            replace(row, context=rows[i - 1].record.text, context_of=rows[i - 1].record.id)
            if i
            else row
            for i, row in enumerate(rows)
        ]

    def _decided(
        self,
        decision: Decision,
        origin: str,
        kind: str,
        importance: float | None,
        metadata: dict[str, Any] | None,
        links: tuple[Link, ...],
        ttl_ms: int | None,
    ) -> list[RevisionRow]:
        """Apply a model's decision. It is bound to the revisions the model saw: a record
        it acts on that moved since (another writer) refuses the whole operation."""
        self.named = decision.named
        self.proposed = [Proposal("retract", p.id, p.revision) for p in decision.proposed]
        for action in decision.actions:
            if isinstance(action, Create | Named | Proposed):
                continue
            current = self._live(action.id)
            if current is None or current.revision != action.revision:
                raise RevisionConflictError(
                    f"record {action.id} changed after the model saw its revision "
                    f"{action.revision}",
                    expected=action.revision,
                    actual=current.revision if current is not None else None,
                )
        writes: list[RevisionRow] = []
        for action in decision.actions:
            if isinstance(action, Create):
                writes.append(
                    self._create(
                        self.op.derived_id(len(writes)),
                        text=action.text,
                        kind=action.kind or kind,
                        importance=action.importance
                        if action.importance is not None
                        else importance,
                        metadata=metadata,
                        origin=action.origin or origin,
                        sources=action.sources,
                        links=links + action.links,
                        ttl_ms=ttl_ms,
                    )
                )
            elif isinstance(action, Update):
                current = self.records[action.id]
                updated = replace(
                    current,
                    revision=current.revision + 1,
                    text=action.text,
                    digest=text_digest(action.text),
                    sources=_joined(current.sources, action.sources),
                )
                writes.append(self._write(updated, text_changed=True, links_changed=False))
            elif isinstance(action, Retire):
                current = self.records[action.id]
                retracted = replace(current, status="retracted", revision=current.revision + 1)
                writes.append(self._write(retracted, text_changed=False, links_changed=False))
        return writes

    def _revise(self, r: Revise) -> list[RevisionRow]:
        if r.expected_revision == 0:
            if r.text is None:
                raise InvalidRequestError("revise with expected_revision 0 creates: it needs text")
            return [
                self._create(
                    r.id,
                    text=r.text,
                    kind=r.kind or "semantic",
                    importance=r.importance,
                    metadata=r.metadata,
                    origin="asserted",
                    sources=(Source(kind="host", digest=text_digest(r.text)),),
                    links=r.links or (),
                    ttl_ms=r.ttl_ms,
                )
            ]
        current = self._existing(
            r.id,
            r.expected_revision,
            creating_conflicts=True,
            only_inferred=r.only_inferred,
            revive=True,
        )
        # A revived record (it had expired) lives again: for ttl_ms, or for good.
        keep = None if current.expired(self.at) else current.expires_at
        text = r.text if r.text is not None else current.text
        links = r.links if r.links is not None else current.links
        updated = replace(
            current,
            text=text,
            digest=text_digest(text),
            kind=r.kind if r.kind is not None else current.kind,
            importance=r.importance if r.importance is not None else current.importance,
            metadata=r.metadata if r.metadata is not None else current.metadata,
            links=links,
            sources=_joined(current.sources, r.sources or ()),
            status="active",
            expires_at=self._expires(r.ttl_ms, keep=keep),
        )
        if _same_content(updated, current):
            return []
        return [
            self._write(
                replace(updated, revision=current.revision + 1),
                text_changed=updated.digest != current.digest,
                links_changed=links != current.links,
            )
        ]

    def _retract(self, r: Retract) -> list[RevisionRow]:
        current = self._existing(
            r.id, r.expected_revision, creating_conflicts=False, only_inferred=r.only_inferred
        )
        if current.status == "retracted":
            return []
        retracted = replace(current, status="retracted", revision=current.revision + 1)
        return [self._write(retracted, text_changed=False, links_changed=False)]

    def _existing(
        self,
        record_id: str,
        expected: int | None,
        *,
        creating_conflicts: bool,
        only_inferred: bool | None = None,
        revive: bool = False,
    ) -> Current:
        if creating_conflicts and record_id in self.state.forgotten:
            raise RevisionConflictError(
                f"record {record_id} was forgotten", expected=expected, actual=None
            )
        current = self._live(record_id)
        expired = self.records.get(record_id)
        if current is None and revive and expired is not None and expected == expired.revision:
            # An expired record counts as absent, unless the revise names the revision it
            # expired at: that revise revives it (a key written again after its TTL).
            current = expired
        if current is None:
            raise NotFoundError(f"no record {record_id} in this scope")
        if only_inferred and current.origin == "asserted":
            raise AssertedRecordError(
                f"record {record_id} is asserted: only its host may change it"
            )
        if expected is not None and expected != current.revision:
            raise RevisionConflictError(
                f"record {record_id} is at revision {current.revision}, not {expected}",
                expected=expected,
                actual=current.revision,
            )
        return current

    def _forget(self, r: Forget) -> dict[str, Any]:
        current = self.records.pop(r.id, None)
        had_record = current is not None or r.id in self.state.forgotten
        if current is not None:
            self.deleted = True
            self.state.forgotten.add(r.id)
        revisions = list(current.revisions) if current is not None else []
        return {
            "forgotten_revisions": revisions,
            "already_forgotten": current is None and had_record,
            "redaction": "pending" if (self.ctx.listeners and had_record) else "none",
        }


def _joined(sources: tuple[Source, ...], more: tuple[Source, ...]) -> tuple[Source, ...]:
    return tuple(dict.fromkeys(sources + more))


def _same_content(a: Current, b: Current) -> bool:
    return (
        a.digest == b.digest
        and a.sources == b.sources
        and a.kind == b.kind
        and a.importance == b.importance
        and a.metadata == b.metadata
        and a.links == b.links
        and a.status == b.status
        and a.expires_at == b.expires_at
    )


def refused_request(op: Operation) -> dict[str, str] | None:
    """What a refusal keeps of its request: only the id of the record it named (a
    revise, retract or forget), as every receipt keeps ids, never text; so the
    receipts of a record list the refusals about it (migration 016)."""
    named = op.request.to_dict().get("id")
    return {"id": named} if isinstance(named, str) else None
