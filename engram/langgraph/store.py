"""``EngramStore``: a LangGraph ``BaseStore`` whose items are engram records.

A graph compiled with ``store=EngramStore.from_env(scope=...)`` (or LangMem's
tools given it) keeps its long-term memory in engram: every put is a revision of
the key's record, written through the streams and committed by a worker with
its receipt; a delete retracts; ``forget`` erases; search is engram's hybrid
recall. The mapping of items to records is ``items``, of namespaces to scopes
``scopes``; what each LangGraph promise becomes is in docs/langgraph.md.

Writes wait for their receipts before ``put`` returns, so a read that follows on
any store object sees them (and, with a read replica, reads pass the receipts'
positions). A put revises the revision this object last saw of the key; when
another writer moved it since, the put is sent again on the revision the
conflict names: the last writer wins, as in LangGraph, and the history keeps both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from engram.store import (
    Embedder,
    MetadataFilter,
    NotFoundError,
    Operation,
    Record,
    RevisionConflictError,
    Scope,
    Store,
)
from engram.store.limits import MAX_STORED_METADATA_BYTES, MAX_TOP_K
from engram.store.read.routing import parse_position
from engram.store.vectors.embedders import EmbedderResolver
from engram.store.write.requests import remember_request, retract_request, revise_request
from engram.worker import Producer
from engram.worker.embedded.runtime import database_url, redis_url
from engram.worker.protocol import StreamReceipt
from engram.worker.settings import Settings

from .. import wiring
from . import items
from .scopes import ScopeMap, ScopePattern

# How long a write waits for its receipt.
WRITE_TIMEOUT_S = 30.0
# How many times a put is sent again after another writer moved its record.
MAX_ATTEMPTS = 5
# A read refreshes an item's TTL once this share of it has passed since the last
# write or refresh (and at least REFRESH_MIN_S): a refresh is a revision, and a hot
# item is not rewritten on every read.
REFRESH_SHARE = 0.1
REFRESH_MIN_S = 1.0
# Who the receipts say asked (the audit trail).
REQUESTED_BY = "langgraph"


@dataclass(frozen=True, slots=True)
class _Seen:
    """What this store last saw of a record: its revision (None: absent), whether it is
    live, and when its item was created."""

    revision: int | None
    active: bool
    created_at: str | None


_ABSENT = _Seen(None, False, None)


class EngramStore(BaseStore):
    """A LangGraph store on engram (see the module docstring and docs/langgraph.md)."""

    supports_ttl = True

    def __init__(
        self,
        store: Store,
        producer: Producer,
        scope: Scope | Mapping[str, str],
        *,
        scopes: Sequence[ScopePattern] = (),
        embedder: Embedder | EmbedderResolver | None = None,
        fields: Sequence[str] = ("$",),
        ttl: TTLConfig | None = None,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        owned: bool = False,
    ) -> None:
        self.store = store
        self.producer = producer
        self.scopes = ScopeMap(Scope.of(scope), scopes)
        self.embedder = embedder
        self.fields = tuple(fields)
        self.ttl_config = ttl
        self.write_timeout_s = write_timeout_s
        self._owned = owned  # close the store and the producer on close
        self._seen: dict[str, _Seen] = {}
        self._after: dict[str, str] = {}  # scope key -> the last commit position written

    @classmethod
    def from_urls(
        cls,
        *,
        database_url: str,
        redis_url: str,
        scope: Scope | Mapping[str, str],
        database_read_url: str | None = None,
        partitions: int | None = None,
        **options: Any,
    ) -> EngramStore:
        """A store on these servers. ``options``: ``scopes``, ``embedder`` (default: the
        store's active model, found as the workers find it), ``fields``, ``ttl``,
        ``write_timeout_s``."""
        settings = Settings.from_env()
        if "embedder" not in options:
            options["embedder"] = wiring.registry(settings).resolver(None)
        store = Store.connect(
            database_url, migrate=False, max_connections=4, read_dsn=database_read_url
        )
        try:
            producer = Producer.from_url(
                redis_url, partitions=partitions or settings.worker.partitions
            )
        except BaseException:
            store.close()
            raise
        return cls(store, producer, scope, owned=True, **options)

    @classmethod
    def from_env(
        cls,
        *,
        scope: Scope | Mapping[str, str],
        env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> EngramStore:
        """A store on the servers every engram command finds: ``DATABASE_URL`` and
        ``REDIS_URL``, else those of the ``engram up`` running on ``ENGRAM_HOME``."""
        settings = Settings.from_env(env)
        if "embedder" not in options:
            options["embedder"] = wiring.registry(settings).resolver(None)
        return cls.from_urls(
            database_url=database_url(settings),
            redis_url=redis_url(settings),
            scope=scope,
            database_read_url=settings.database_read_url,
            partitions=settings.worker.partitions,
            **options,
        )

    def close(self) -> None:
        if self._owned:
            self.producer.close()
            self.store.close()

    def __enter__(self) -> EngramStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the batch ------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Puts first (the last put of a key wins), then the reads, each answered in
        the order given; the TTLs of the items read are refreshed last."""
        ops = list(ops)
        for op in ops:
            _validate(op)
        puts = [op for op in ops if isinstance(op, PutOp)]
        if puts:
            self._put_all(puts)
        refresh: dict[str, tuple[Scope, Record]] = {}
        results = [self._read(op, refresh) for op in ops]
        if refresh:
            self._refresh(list(refresh.values()))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def _read(self, op: Op, refresh: dict[str, tuple[Scope, Record]]) -> Result:
        if isinstance(op, GetOp):
            scope = self.scopes.scope_of(op.namespace)
            record = self._get(scope, items.record_id(scope, op.namespace, op.key))
            if record is None:
                return None
            if op.refresh_ttl:
                refresh[record.id] = (scope, record)
            return items.item_of(record)
        if isinstance(op, SearchOp):
            found = self._search(op)
            if op.refresh_ttl:
                scope = self.scopes.scope_of_prefix(op.namespace_prefix)
                refresh.update({r.id: (scope, r) for r, _ in found})
            return [items.search_item_of(r, score) for r, score in found]
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        return None  # a put: done above

    # -- reads ------------------------------------------------------------------------

    def _get(self, scope: Scope, rid: str) -> Record | None:
        record = self.store.get(scope, rid, after=self._after.get(scope.key))
        if record is None or record.status != "active" or not items.is_item(record):
            return None
        self._saw(record)
        return record

    def _search(self, op: SearchOp) -> list[tuple[Record, float | None]]:
        scope = self.scopes.scope_of_prefix(op.namespace_prefix)
        where = items.prefix_filter(op.namespace_prefix) & MetadataFilter.parse(
            op.filter, under=items.VALUE_PATH
        )
        after = self._after.get(scope.key)
        found: list[tuple[Record, float | None]]
        if op.query and op.query.strip():
            # Recall ranks at most MAX_TOP_K: a page beyond them is empty.
            top_k = min(op.offset + op.limit, MAX_TOP_K)
            if top_k <= op.offset:
                return []
            hits = self.store.recall(
                scope,
                op.query,
                embedder=self.embedder,
                top_k=top_k,
                kind=items.INDEXED,
                metadata=where,
                after=after,
            )
            found = [(h.record, h.relevance) for h in hits[op.offset :]]
        else:
            records = self.store.records(
                scope,
                include_retracted=False,
                limit=op.limit,
                offset=op.offset,
                metadata=where,
                kinds=items.KINDS,
                after=after,
            )
            found = [(r, None) for r in records]
        kept = [(r, score) for r, score in found if items.is_item(r)]
        for record, _ in kept:
            self._saw(record)
        return kept

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        prefix = next((tuple(c.path) for c in conditions if c.match_type == "prefix"), ())
        scope = self.scopes.scope_of_prefix(prefix)
        values = self.store.metadata_values(
            scope,
            items.NAMESPACE_PATH,
            metadata=items.prefix_filter(prefix),
            kinds=items.KINDS,
            after=self._after.get(scope.key),
        )
        found = {
            tuple(ns)[: op.max_depth] if op.max_depth is not None else tuple(ns)
            for ns in values
            if isinstance(ns, list) and all(_matches(c, ns) for c in conditions)
        }
        return sorted(found)[op.offset : op.offset + op.limit]

    # -- writes -----------------------------------------------------------------------

    def _put_all(self, puts: list[PutOp]) -> None:
        latest = {(op.namespace, op.key): op for op in puts}  # the last put of a key wins
        todo = [(self.scopes.scope_of(op.namespace), op) for op in latest.values()]
        for scope, op in todo:
            rid = items.record_id(scope, op.namespace, op.key)
            if rid not in self._seen:
                self._load(scope, rid)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            todo = self._send(todo, last=attempt == MAX_ATTEMPTS)
            if not todo:
                return

    def _send(self, todo: list[tuple[Scope, PutOp]], *, last: bool) -> list[tuple[Scope, PutOp]]:
        """Send the puts, wait for their receipts; those another writer overtook, to be
        sent again on the revision it left."""
        planned = [(scope, op, self._operation(scope, op)) for scope, op in todo]
        sent = [(scope, op, o) for scope, op, o in planned if o is not None]
        pending = self.producer.enqueue_many([o for _, _, o in sent])
        again = []
        for (scope, op, o), p in zip(sent, pending, strict=True):
            rid = items.record_id(scope, op.namespace, op.key)
            try:
                self._wrote(scope, p.wait(self.write_timeout_s))
            except RevisionConflictError as conflict:
                if last:
                    raise
                self._overtaken(scope, rid, conflict, o)
                again.append((scope, op))
            except NotFoundError:
                self._load(scope, rid)  # it expired since this store saw it
                if o.kind == "retract":
                    continue  # an expired item is gone already
                if last:
                    raise
                again.append((scope, op))
        return again

    def _operation(self, scope: Scope, op: PutOp) -> Operation | None:
        rid = items.record_id(scope, op.namespace, op.key)
        seen = self._seen.get(rid, _ABSENT)
        if op.value is None:  # a delete: retract what is live, nothing else
            if seen.revision is None or not seen.active:
                return None
            request = retract_request(rid, expected_revision=seen.revision)
            return Operation.build("retract", scope, request, requested_by=REQUESTED_BY)
        write = items.write_of(
            op.namespace,
            op.key,
            op.value,
            index=op.index,
            fields=self.fields,
            created_at=seen.created_at or items.now_iso(),
            ttl_minutes=op.ttl,
        )
        ttl_ms = items.ttl_ms(op.ttl)
        if seen.revision is None:
            request = remember_request(
                write.text,
                kind=write.kind,
                metadata=write.metadata,
                ttl_ms=ttl_ms,
                id=rid,
                supersede="add",  # this record, never a model's choice of one
            )
            return Operation.build(
                "remember",
                scope,
                request,
                requested_by=REQUESTED_BY,
                metadata_bytes=MAX_STORED_METADATA_BYTES,  # the value: a document, at most 1 MB
            )
        request = revise_request(
            rid,
            text=write.text,
            kind=write.kind,
            metadata=write.metadata,
            ttl_ms=ttl_ms,
            expected_revision=seen.revision,
        )
        return Operation.build(
            "revise",
            scope,
            request,
            requested_by=REQUESTED_BY,
            metadata_bytes=MAX_STORED_METADATA_BYTES,
        )

    def _overtaken(
        self, scope: Scope, rid: str, conflict: RevisionConflictError, op: Operation
    ) -> None:
        """Another writer was first: go on from the revision it left (last writer wins)."""
        if conflict.actual is not None:
            seen = self._seen.get(rid, _ABSENT)
            self._seen[rid] = _Seen(conflict.actual, True, seen.created_at)
            if op.kind == "retract":
                self._load(scope, rid)  # is it still live?
            return
        # A create refused: the record exists but expired, or the key was forgotten
        # in this scope (its tombstone refuses it for ever; another scope's record of
        # the same key is another record, and never refuses this one).
        self._load(scope, rid)
        if self._seen[rid].revision is None:
            raise RevisionConflictError(
                f"record {rid} cannot be written: its key was forgotten",
                expected=0,
                actual=None,
            )

    def _load(self, scope: Scope, rid: str) -> None:
        """What the store holds of ``rid`` now, expired or not."""
        record = self.store.get(scope, rid, include_expired=True, after=self._after.get(scope.key))
        if record is None:
            self._seen[rid] = _ABSENT
        else:
            self._saw(record)

    def _saw(self, record: Record) -> None:
        created = record.metadata.get(items.ROOT, {}).get("created_at")
        live = record.status == "active" and (
            record.expires_at is None or record.expires_at > datetime.now(UTC)
        )
        self._seen[record.id] = _Seen(
            record.revision, live, created if isinstance(created, str) else None
        )

    def _wrote(self, scope: Scope, receipt: StreamReceipt) -> None:
        for ref in receipt.records:
            seen = self._seen.get(ref.id, _ABSENT)
            self._seen[ref.id] = _Seen(ref.revision, ref.status == "active", seen.created_at)
        if receipt.position is not None:
            known = self._after.get(scope.key)
            if known is None or (parse_position(known) or 0) < (
                parse_position(receipt.position) or 0
            ):
                self._after[scope.key] = receipt.position

    # -- TTL --------------------------------------------------------------------------

    def _refresh(self, read: list[tuple[Scope, Record]]) -> None:
        """Move the expiry of the items read whose TTL is due a refresh (a revision that
        changes nothing else). One that another writer moved meanwhile is left: that
        write set its own expiry."""
        now = datetime.now(UTC)
        ops = [
            Operation.build(
                "revise",
                scope,
                revise_request(r.id, ttl_ms=items.ttl_ms(ttl), expected_revision=r.revision),
                requested_by=REQUESTED_BY,
            )
            for scope, r in read
            if (ttl := items.ttl_minutes_of(r)) is not None and _due(r, ttl, now)
        ]
        if not ops:
            return
        for op, pending in zip(ops, self.producer.enqueue_many(ops), strict=True):
            # Moved, deleted or expired since it was read: nothing to refresh.
            with contextlib.suppress(RevisionConflictError, NotFoundError):
                self._wrote(op.scope, pending.wait(self.write_timeout_s))

    # -- engram's own -----------------------------------------------------------------

    def forget(self, namespace: tuple[str, ...], key: str) -> StreamReceipt:
        """Forget the item: every revision, vector and index entry of its record, the
        text its receipts held; a content-free tombstone stays, and the key can never
        be written again. Returns the forget's receipt (``redaction`` tells the
        listeners' progress)."""
        _validate(GetOp(namespace, key))
        scope = self.scopes.scope_of(namespace)
        rid = items.record_id(scope, namespace, key)
        pending = self.producer.forget(scope, rid, requested_by=REQUESTED_BY)
        receipt = pending.wait(self.write_timeout_s)
        self._wrote(scope, receipt)
        self._seen[rid] = _ABSENT
        return receipt

    def history(self, namespace: tuple[str, ...], key: str) -> list[dict[str, Any] | None]:
        """The values the item held, oldest first; None where it was deleted. A TTL
        refresh (a revision that changed nothing else) is not a value of its own."""
        _validate(GetOp(namespace, key))
        scope = self.scopes.scope_of(namespace)
        rid = items.record_id(scope, namespace, key)
        return items.history_values(
            self.store.history(scope, rid, after=self._after.get(scope.key))
        )

    def scope_of(self, namespace: tuple[str, ...]) -> Scope:
        """The engram scope the namespace's items live in."""
        return self.scopes.scope_of(namespace)


def _due(record: Record, ttl_minutes: float, now: datetime) -> bool:
    if record.expires_at is None:
        return False
    ttl = timedelta(minutes=ttl_minutes)
    step = max(timedelta(seconds=REFRESH_MIN_S), ttl * REFRESH_SHARE)
    return now + ttl - record.expires_at >= step


def _matches(condition: MatchCondition, namespace: Sequence[str]) -> bool:
    path = tuple(condition.path)
    if not path:
        return True
    if len(namespace) < len(path):
        return False
    labels = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(p == "*" or p == label for p, label in zip(path, labels, strict=True))


def _validate(op: Op) -> None:
    """LangGraph's label rules for ops given to ``batch`` directly too (its methods check
    them before): no empty label, no period, no NUL; a put's namespace is not empty
    and not under ``langgraph``."""
    validate_op_namespace(op)
    if isinstance(op, PutOp) and not op.namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    if isinstance(op, PutOp) and op.namespace[0] == "langgraph":
        raise InvalidNamespaceError(
            f'Root label for namespace cannot be "langgraph". Got: {op.namespace}'
        )


__all__ = ["EngramStore", "Item", "SearchItem"]
