"""What each MCP tool does, on one caller's scope: writes through the streams (a
``Producer``, like any producer's, waiting for the receipt within a bound), reads from
the store, each read a token makes logged content-free.

A tool answers an ``Answer`` (a short text that quotes no memory, and the data) or
raises an ``EngramError`` the server turns into a tool error. A record of another
scope, a forgotten one and an id never used get the same ``not_found``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import redis

from engram.store import Embedder, Grant, Hit, Receipt, Record, Scope, Store
from engram.store.errors import (
    EmbedderUnavailableError,
    EmbeddingMismatchError,
    EngramError,
    NotFoundError,
    RevisionConflictError,
)
from engram.store.limits import DEFAULT_MIN_RELEVANCE
from engram.store.vectors.embedders import EmbedderResolver
from engram.web.backlog import holds, needle_of
from engram.worker import Pending, Producer, StreamReceipt, layout
from engram.worker.protocol import partition_of

from . import contract, opids

# Operations this process sent, remembered with their scope so that ``operation`` can
# say one failed (a failure's reply names no scope).
SENT_KEPT = 10_000
# Live entries of a partition stream read before ``operation`` stops looking.
BACKLOG_SCAN = 10_000


@dataclass(frozen=True, slots=True)
class Access:
    """Who is calling, and on what: the one scope every tool acts on (``--scope``, or the
    token's), the client a derived operation id is bound to (``opids``; None: a client
    with nothing of its own, whose writes each get a fresh id), and the token's grant
    (None over stdio). A token's writes name it (``token:NAME``) as their authenticated
    actor; stdio's name no one (the local user runs the server)."""

    scope: Scope
    session: str | None
    grant: Grant | None = None

    @classmethod
    def of_grant(cls, grant: Grant, session: str | None, client_id: str | None = None) -> Access:
        return cls(
            Scope.of(grant.scope), opids.client_of(grant.token_id, session, client_id), grant
        )

    @property
    def actor(self) -> str | None:
        return self.grant.actor if self.grant is not None else None


@dataclass(frozen=True, slots=True)
class Answer:
    summary: str  # for the model to read: counts and ids, never memory text
    data: dict[str, Any]


class Memory:
    """The tools' work, on services the composition root opened."""

    def __init__(
        self,
        store: Store,
        producer: Producer,
        *,
        embedder: Embedder | EmbedderResolver | None,
        wait_s: float,
    ) -> None:
        self.store = store
        self.producer = producer
        self.embedder = embedder
        self.wait_s = wait_s
        self._sent: OrderedDict[str, str] = OrderedDict()

    # -- writes -----------------------------------------------------------------------

    async def remember(self, access: Access, args: contract.Remember) -> Answer:
        op_id = self._operation_id(access, "remember", args)
        return await self._write(
            access,
            op_id,
            lambda: self.producer.remember(
                access.scope,
                args.text,
                kind=args.kind,
                importance=args.importance,
                metadata=args.metadata,
                operation_id=op_id,
                requested_by=access.actor,
            ),
        )

    async def revise(self, access: Access, args: contract.Revise) -> Answer:
        op_id = self._operation_id(access, "revise", args)
        return await self._write(
            access,
            op_id,
            lambda: self.producer.revise(
                access.scope,
                args.record_id,
                text=args.text,
                expected_revision=args.expected_revision,
                operation_id=op_id,
                requested_by=access.actor,
            ),
            record_id=args.record_id,
        )

    async def retract(self, access: Access, args: contract.Retract) -> Answer:
        op_id = self._operation_id(access, "retract", args)
        return await self._write(
            access,
            op_id,
            lambda: self.producer.retract(
                access.scope,
                args.record_id,
                expected_revision=args.expected_revision,
                operation_id=op_id,
                requested_by=access.actor,
            ),
            record_id=args.record_id,
        )

    async def forget(self, access: Access, args: contract.Forget) -> Answer:
        # The reason is for the audit trail, not part of the request.
        op_id = self._operation_id(access, "forget", args, leave_out=("reason",))
        answer = await self._write(
            access,
            op_id,
            lambda: self.producer.forget(
                access.scope, args.record_id, operation_id=op_id, requested_by=access.actor
            ),
            record_id=args.record_id,
        )
        # Only a forget that found the record (or its tombstone) in this scope is the
        # operator's business: a no-op names nothing of another scope (issue 36).
        found = answer.data.get("revisions") or answer.data.get("already_forgotten")
        if answer.data["state"] == "committed" and not answer.data.get("replayed") and found:

            def audit() -> None:
                # The scope: the same id in another scope is another record.
                detail = {
                    "operation_id": op_id,
                    "reason": args.reason,
                    "scope_id": self.store.scope_id(access.scope),
                }
                self.store.audit.record(
                    access.actor or "mcp", "record.forget", args.record_id, detail
                )

            await anyio.to_thread.run_sync(audit)
        return answer

    async def extract(self, access: Access, args: contract.Extract) -> Answer:
        op_id = self._operation_id(access, "extract", args)
        messages = [
            {"id": str(i), "message": {"role": m.role, "content": m.content}}
            for i, m in enumerate(args.messages, 1)
        ]
        return await self._write(
            access,
            op_id,
            lambda: self.producer.extract(
                access.scope, messages, operation_id=op_id, requested_by=access.actor
            ),
        )

    def _operation_id(
        self,
        access: Access,
        tool: str,
        args: contract.Arguments,
        leave_out: tuple[str, ...] = (),
    ) -> str:
        given = getattr(args, "operation_id", None)
        if isinstance(given, str):
            return given
        if access.session is None:
            return opids.fresh()
        request = args.model_dump(exclude={"operation_id", *leave_out}, exclude_none=True)
        return opids.derive(access.scope, tool, request, access.session)

    async def _write(
        self,
        access: Access,
        op_id: str,
        send: Callable[[], Pending],
        *,
        record_id: str | None = None,
    ) -> Answer:
        grant = access.grant
        if grant is not None:
            # The server's word that this token asked: its receipt shows the token's
            # name as authenticated, not claimed (store.tokens).
            await anyio.to_thread.run_sync(self.store.tokens.vouch, grant, op_id)
        pending = await anyio.to_thread.run_sync(send)
        self._note_sent(op_id, access.scope)
        try:
            receipt = await pending.replied(self.wait_s)
        except RevisionConflictError as exc:
            if exc.actual is None and record_id is not None:
                # A record this scope cannot see: forgotten here, or expired. One
                # answer for both, as for an id never used (another scope's id is
                # never met: a record id is its scope's).
                raise _not_found(record_id) from None
            raise
        if receipt is None:
            return Answer(
                f"queued: not committed within {self.wait_s:g} s; ask the operation tool"
                f" about {op_id} later",
                {"state": "queued", "operation_id": op_id, "waited_s": self.wait_s},
            )
        return Answer(
            committed_summary(receipt, record_id), {"state": "committed", **receipt_json(receipt)}
        )

    def _note_sent(self, op_id: str, scope: Scope) -> None:
        self._sent[op_id] = scope.key
        self._sent.move_to_end(op_id)
        while len(self._sent) > SENT_KEPT:
            self._sent.popitem(last=False)

    # -- reads ------------------------------------------------------------------------

    async def recall(self, access: Access, args: contract.Recall) -> Answer:
        hits = await anyio.to_thread.run_sync(self._recall, access.scope, args)
        await self._log_reads(access, "recall", (h.record for h in hits))
        records = [
            {
                "rank": rank,
                "relevance": round(h.relevance, 4),
                "match": h.match,
                "record": record_json(h.record),
            }
            for rank, h in enumerate(hits, 1)
        ]
        return Answer(_count(len(records), "record") + " found", {"records": records})

    def _recall(self, scope: Scope, args: contract.Recall) -> list[Hit]:
        cut = DEFAULT_MIN_RELEVANCE if args.min_relevance is None else args.min_relevance
        try:
            return self.store.recall(
                scope,
                args.query,
                embedder=self.embedder,
                text_only=self.embedder is None,
                top_k=args.top_k,
                min_relevance=cut,
            )
        except (EmbeddingMismatchError, EmbedderUnavailableError):
            # No embedder here for the active generation: by words only, as the API.
            return self.store.recall(
                scope, args.query, text_only=True, top_k=args.top_k, min_relevance=cut
            )

    async def get(self, access: Access, args: contract.Get) -> Answer:
        record = await anyio.to_thread.run_sync(
            lambda: self.store.get(access.scope, args.record_id)
        )
        if record is None:
            raise _not_found(args.record_id)
        await self._log_reads(access, "get", [record])
        return Answer(
            f"record {record.id}, revision {record.revision}, {record.status}",
            {"record": record_json(record)},
        )

    async def history(self, access: Access, args: contract.History) -> Answer:
        """A page of the newest revisions, bounded in the query by count and by bytes of
        text: a record of a thousand long revisions costs a page."""
        page = await anyio.to_thread.run_sync(
            lambda: self.store.history_page(
                access.scope,
                args.record_id,
                limit=args.limit,
                max_bytes=contract.MAX_HISTORY_BYTES,
                before_revision=args.before_revision,
            )
        )
        kept = page.revisions
        if not kept and args.before_revision is None:
            raise _not_found(args.record_id)
        await self._log_reads(access, "history", kept)
        return Answer(
            _count(len(kept), "revision")
            + f" of record {args.record_id}"
            + (" (older ones: page back with next_before_revision)" if page.older else ""),
            {
                "record_id": args.record_id,
                "revisions": [record_json(r) for r in kept],
                "truncated": page.older,
                "next_before_revision": kept[0].revision if page.older else None,
            },
        )

    async def _log_reads(self, access: Access, tool: str, records: Iterable[Record]) -> None:
        """What a token's read returned, content-free (over stdio there is no token)."""
        grant = access.grant
        if grant is None:
            return
        returned = [(r.id, r.revision) for r in records]
        await anyio.to_thread.run_sync(self.store.tokens.log_reads, grant, tool, returned)

    # -- an operation's state ---------------------------------------------------------

    async def operation(self, access: Access, args: contract.Operation) -> Answer:
        return await anyio.to_thread.run_sync(self._operation, access, args.operation_id)

    def _operation(self, access: Access, op_id: str) -> Answer:
        """Committed or refused (its receipt, in this scope only), failed (a reply with
        an error, to an operation this token, or this process over stdio, sent), queued
        (in this scope's partition stream), else not found: the same answer as for an
        id another scope used."""
        scope = access.scope
        receipt = self.store.receipt(op_id, scope)  # an operation id is its scope's
        if receipt is not None:
            data = receipt_json(receipt)
            if receipt.error is not None:
                code = receipt.error.get("code", "refused")
                said = f"operation {op_id} was refused ({code}): nothing changed"
                return Answer(said, {"state": "refused", "operation_id": op_id, "receipt": data})
            said = f"operation {op_id} committed: {committed_summary(receipt)}"
            return Answer(said, {"state": "committed", "operation_id": op_id, "receipt": data})
        if self._sent_by(access, op_id):
            reply = self.producer.results(scope, [op_id]).get(op_id)
            if isinstance(reply, EngramError):
                return Answer(
                    f"operation {op_id} failed ({reply.code}): nothing changed",
                    {"state": "failed", "operation_id": op_id, "error": reply.to_dict()},
                )
        if self._queued(scope, op_id):
            return Answer(
                f"operation {op_id} is still queued: it commits when a worker reaches it;"
                " ask again later",
                {"state": "queued", "operation_id": op_id},
            )
        if self.store.receipt(op_id, scope) is not None:  # committed while the streams were read
            return self._operation(access, op_id)
        raise _no_operation(op_id)

    def _sent_by(self, access: Access, op_id: str) -> bool:
        if access.grant is not None:
            return self.store.tokens.made(access.grant, op_id)
        return self._sent.get(op_id) == access.scope.key

    def _queued(self, scope: Scope, op_id: str) -> bool:
        client = self.producer.client
        needles = needle_of(op_id)
        for epoch in layout.live_epochs(client, self.producer.partitions):
            stream = epoch.stream(partition_of(scope, epoch.partitions))
            if _stream_holds(client, stream, op_id, scope, needles):
                return True
        return False


def _stream_holds(
    client: redis.Redis, stream: str, op_id: str, scope: Scope, needles: tuple[bytes, ...]
) -> bool:
    """Whether the stream's live entries hold the operation, sent for this scope."""
    start, seen = "-", 0
    while seen < BACKLOG_SCAN:
        page: list[tuple[Any, Mapping[Any, Any]]] = client.xrange(  # type: ignore[assignment]
            stream, start, "+", count=500
        )
        for _, fields in page:
            if holds(fields, op_id, needles) and _scope_of(fields) == scope.key:
                return True
        if len(page) < 500:
            return False
        seen += len(page)
        last = page[-1][0]
        start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    return False


def _scope_of(fields: Mapping[Any, Any]) -> str | None:
    raw = fields.get(b"op", fields.get("op"))
    try:
        return Scope.of(json.loads(raw)["scope"]).key
    except (ValueError, TypeError, KeyError, EngramError):
        return None


# -- the answers' JSON --------------------------------------------------------------


def record_json(record: Record) -> dict[str, Any]:
    """A revision as data: the caller's own scope and the digest left out."""
    data = record.as_dict()
    del data["scope"], data["digest"]
    return data


def receipt_json(receipt: Receipt) -> dict[str, Any]:
    """A receipt as the tools answer it: what was written, not whose scope (the
    caller's own)."""
    data: dict[str, Any] = {
        "operation_id": receipt.operation_id,
        "kind": receipt.kind,
        "records": [r.as_dict() for r in receipt.records],
        "scope_revision": receipt.scope_revision,
        "committed_at": receipt.committed_at.isoformat(),
    }
    if isinstance(receipt, StreamReceipt):
        data["replayed"] = receipt.replayed
    if receipt.kind == "forget":
        data["revisions"] = list(receipt.forgotten_revisions or ())
        data["already_forgotten"] = bool(receipt.already_forgotten)
        data["redaction"] = receipt.redaction
    if receipt.error is not None:
        data["error"] = receipt.error
    return data


def committed_summary(receipt: Receipt, record_id: str | None = None) -> str:
    """What a committed write did, in words a model reading text only acts on: ids,
    revisions and counts, never memory text."""
    refs = receipt.records
    first = refs[0] if refs else None
    record_id = record_id or "the record"
    if receipt.kind == "forget":
        erased = list(receipt.forgotten_revisions or ())
        if erased:
            said = f"forgot {record_id} ({_count(len(erased), 'revision')})"
        elif isinstance(receipt, StreamReceipt) and receipt.replayed:
            said = f"forgot {record_id}"  # a replay's receipt is the redacted one
        elif receipt.already_forgotten:
            said = f"{record_id} was already forgotten: nothing more to erase"
        else:
            said = f"no record {record_id} in this memory: nothing forgotten"
    elif receipt.kind == "remember" and first is not None:
        said = f"remembered {first.id} (revision {first.revision})"
    elif receipt.kind == "revise" and first is not None:
        said = f"revised {first.id}: now revision {first.revision}"
    elif receipt.kind == "retract" and first is not None:
        said = f"retracted {first.id} (revision {first.revision}): no longer recalled"
    elif refs:
        written = ", ".join(f"{r.id} revision {r.revision} ({r.status})" for r in refs)
        said = f"{receipt.kind}: wrote {_count(len(refs), 'record')}: {written}"
    else:
        said = f"{receipt.kind}: nothing worth keeping, no record written"
    replay = " (a replay: it had already committed; nothing was written again)"
    replayed = isinstance(receipt, StreamReceipt) and receipt.replayed
    return said + (replay if replayed else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _not_found(record_id: str) -> NotFoundError:
    return NotFoundError(f"no record {record_id} in this memory")


def _no_operation(op_id: str) -> NotFoundError:
    return NotFoundError(f"no operation {op_id} in this memory")
