"""The write path: replay check, embeddings, then one transaction per batch.

``execute`` takes operations (any scopes, each scope's in the order given),
returns one outcome per operation in the same order: a ``WriteResult`` or the
typed error the operation failed with. Embeddings are computed before the
transaction; inside it the writer locks the fence, then each scope's row (in
key order), loads the state the batch names, plans it (``planner``) and
writes the plan with one set-based statement (``apply``). Two round trips in
all, pipelined; a third before them looks up stored receipts unless the
caller says replays are unlikely (``check_replays=False``): a replay is then
answered without embedding its texts. The transaction reads the receipts again,
under the scopes' locks, which is what decides. After the commit, what a replay
answers is read from its receipt (``load_results``), and the rows the plans
wrote become the ``Record``s returned (``_record``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import psycopg

from ..errors import EmbeddingMismatchError, EngramError, FencedError
from ..limits import MAX_WRITE_ATTEMPTS
from ..read.routing import COMMIT_POSITION
from ..rows import RECEIPT_COLUMNS, REVISION_COLUMNS, receipt_from_row, record_from_row
from ..values import Fence, Receipt, Record, RecordRef, Scope, WriteResult
from ..vectors.embedders import Embedder, EmbedderResolver, Vectors, embed_checked
from ..vectors.embeddings import HOLD_SWITCH_SHARED
from .apply import Loading, note_replays, stored_receipts, write_plans
from .extraction import readable_sources
from .operations import Extract, Operation, OpKey, Remember, Revise, text_digest
from .options import DEFAULTS, WriteOptions
from .planner import (
    Applied,
    Plan,
    PlanContext,
    Replayed,
    RevisionRow,
    ScopeState,
    plan_batch,
)
from .reconcile import Decision

log = logging.getLogger(__name__)

Result = WriteResult | EngramError

_RETRYABLE = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.UniqueViolation,
)


@dataclass(frozen=True, slots=True)
class ActiveGeneration:
    id: int
    model_id: str
    dims: int


# The active generation before any commit has told it.
_UNKNOWN: Any = object()


class Writer:
    def __init__(self, pool: Any, *, track_position: bool = False) -> None:
        self.pool = pool
        # With a read replica: each receipt carries the commit position, read in the
        # COMMIT's own round trip. Without, the write path runs no query for it.
        self.track_position = track_position
        # As of the last commit; a commit checks it under lock and retries if it moved.
        self._generation: ActiveGeneration | None = _UNKNOWN
        self._digest_key = b""  # the store's, read once (it never changes)

    def execute(
        self,
        ops: Sequence[Operation],
        embedder: Embedder | EmbedderResolver | None,
        options: WriteOptions = DEFAULTS,
    ) -> list[Result]:
        """The model phases of ``options.decisions`` ran before, never inside the
        retried transaction."""
        results: list[Result | None] = [None] * len(ops)
        ctx = PlanContext(now=datetime.min, options=options)
        resolver = embedder if isinstance(embedder, EmbedderResolver) else _Fixed(embedder)
        with self.pool.connection() as conn:
            if not self._digest_key:
                self._digest_key = digest_key(conn)
            ctx = replace(ctx, digest_key=self._digest_key)
            generation = self._generation
            stored: dict[OpKey, Any] = {}
            if options.check_replays or generation is _UNKNOWN:
                # A replay is answered from its receipt: no embedding call for it.
                with conn.pipeline():
                    stored = stored_receipts(conn, [op.key for op in ops])
                    generation = _active_generation(conn)
            fresh = [op for op in ops if op.key not in stored]
            retries = 0
            embedded_for: Any = False  # the generation the vectors were computed for
            while True:
                if retries:
                    generation = _active_generation(conn)
                if generation != embedded_for:
                    # A batch embedded for a generation that has since been switched is
                    # embedded again, with the new generation's model when the resolver
                    # knows it (a fixed embedder of the old model is refused instead).
                    vectors, refused, used = self._embed(fresh, resolver, generation, ctx.decisions)
                    embedded_for = generation
                batch = [i for i, op in enumerate(ops) if op.key not in refused]
                try:
                    outcomes, position = self._commit(
                        conn, [ops[i] for i in batch], used, generation, vectors, ctx
                    )
                except (_GenerationMoved, *_RETRYABLE) as exc:
                    retries += 1
                    if retries >= MAX_WRITE_ATTEMPTS:
                        raise
                    log.info(
                        "write retried", extra={"reason": type(exc).__name__, "attempt": retries}
                    )
                    continue
                break
            for i, op in enumerate(ops):
                if op.key in refused:
                    results[i] = refused[op.key]
            replays = load_results(
                conn,
                [
                    ops[i].key
                    for i, o in zip(batch, outcomes, strict=True)
                    if isinstance(o, Replayed)
                ],
            )
            for i, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Replayed):
                    # Committed before this batch's commit, so seen at its position too.
                    results[i] = _at(replays[ops[i].key], position)
                elif isinstance(outcome, Applied):
                    results[i] = WriteResult(
                        receipt=_receipt(outcome, ops[i], position),
                        replayed=False,
                        records=tuple(_record(w, ops[i].scope) for w in outcome.written),
                        conflict_retries=retries,
                    )
                else:
                    results[i] = outcome
        return [r for r in results if r is not None]

    # -- embedding, outside any transaction -------------------------------------

    def _embed(
        self,
        ops: Sequence[Operation],
        resolver: EmbedderResolver,
        generation: ActiveGeneration | None,
        decisions: Mapping[OpKey, Decision],
    ) -> tuple[dict[str, np.ndarray], dict[OpKey, EngramError], Embedder | None]:
        """The vectors by text digest, the operations refused, and the embedder used."""
        texts: dict[str, str] = {}
        needs: dict[OpKey, list[str]] = {}
        for op in ops:
            op_texts = _texts_to_embed(op, decisions.get(op.key))
            needs[op.key] = op_texts
            for text in op_texts:
                texts.setdefault(text_digest(text), text)
        if not texts:
            return {}, {}, None
        try:
            embedder = resolver.for_generation(
                generation.model_id if generation else None, generation.dims if generation else None
            )
        except EngramError as unavailable:  # no embedder here for the active model
            return {}, {op_id: unavailable for op_id, t in needs.items() if t}, None
        if embedder is None:
            return {}, {}, None
        if generation is not None and (
            generation.model_id != embedder.model_id or generation.dims != embedder.dims
        ):
            error = EmbeddingMismatchError(
                f"the active embedding generation is {generation.model_id} "
                f"({generation.dims} dimensions), not {embedder.model_id} ({embedder.dims})"
            )
            return {}, {op_id: error for op_id, t in needs.items() if t}, embedder
        digests = list(texts)
        matrix: Vectors = embed_checked(embedder, [texts[d] for d in digests])
        return dict(zip(digests, matrix, strict=True)), {}, embedder

    # -- the transaction ----------------------------------------------------------

    def _commit(
        self,
        conn: psycopg.Connection[Any],
        ops: list[Operation],
        embedder: Embedder | None,
        generation: ActiveGeneration | None,
        vectors: dict[str, np.ndarray],
        ctx: PlanContext,
    ) -> tuple[list[Any], str | None]:
        """Each operation's outcome, and the commit position if tracked."""
        groups: dict[str, list[Operation]] = defaultdict(list)
        for op in ops:
            groups[op.scope.key].append(op)
        # Two round trips: the fence, the locks and the reads; then the writes and
        # the COMMIT (and the commit position after it), all pipelined.
        with conn.pipeline():
            with conn.transaction():
                pairs = self._plan_and_write(conn, groups, embedder, generation, vectors, ctx)
            position = conn.execute(COMMIT_POSITION) if self.track_position else None
        by_key = {state.scope.key: iter(plan.outcomes) for state, plan in pairs}
        outcomes = [next(by_key[op.scope.key]) for op in ops]
        return outcomes, _fetched_position(position)

    def _plan_and_write(
        self,
        conn: psycopg.Connection[Any],
        groups: dict[str, list[Operation]],
        embedder: Embedder | None,
        generation: ActiveGeneration | None,
        vectors: dict[str, np.ndarray],
        ctx: PlanContext,
    ) -> list[tuple[ScopeState, Plan]]:
        """Inside the transaction: fence, lock, load, plan each scope, write the plans."""
        with conn.pipeline():
            conn.execute(GENERIC_PLANS)
            # First: a generation switch holds this exclusively while it fills the
            # last gaps of the new generation, and no commit may slip in meanwhile.
            conn.execute(HOLD_SWITCH_SHARED)
            begun = _begin(conn, ctx.options.fences)
            loading = Loading(conn, groups, ctx.decisions)
            now, locked = _begun(begun, ctx.options.fences)
            states = loading.states()
        self._generation = locked
        if locked != generation:
            raise _GenerationMoved
        gen_id = locked.id if locked else None
        ctx = replace(ctx, now=now)
        pairs: list[tuple[ScopeState, Plan]] = []
        for state in states:  # a record id is its scope's: the scopes plan apart
            pairs.append((state, plan_batch(state, groups[state.scope.key], ctx)))
        if any(plan.changes_anything for _, plan in pairs):
            if gen_id is None and embedder is not None and vectors:
                gen_id = _start_first_generation(conn, embedder)
                self._generation = ActiveGeneration(gen_id, embedder.model_id, embedder.dims)
            write_plans(conn, pairs, now, gen_id, vectors)
        note_replays(conn, pairs, now)
        return pairs


# The write path's statements have the same shape whatever their arrays hold: plan
# each once per connection (psycopg prepares them) instead of at every execution.
GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"


class _GenerationMoved(Exception):
    """The active generation changed between embedding and commit: embed again."""


@dataclass(frozen=True, slots=True)
class _Fixed:
    """The one embedder a caller passed, whatever the active generation (a mismatch is
    refused by ``_embed``)."""

    embedder: Embedder | None

    def for_generation(self, model_id: str | None, dims: int | None) -> Embedder | None:
        return self.embedder


def _texts_to_embed(op: Operation, decision: Decision | None) -> list[str]:
    if decision is not None:
        return decision.texts
    r = op.request
    if isinstance(r, Remember):
        return [r.text]
    if isinstance(r, Revise):
        return [r.text] if r.text is not None else []
    if isinstance(r, Extract) and not r.infer:
        return [
            item.text for item in readable_sources(r.messages, r.trusted_tools, op.scope.chat_id)
        ]
    return []


def digest_key(conn: psycopg.Connection[Any]) -> bytes:
    """The store's secret for the digests receipts keep (migration 007)."""
    row = conn.execute("SELECT secret FROM engram_secrets WHERE name = 'request_digest'").fetchone()
    if row is None:
        raise RuntimeError("the store has no request digest secret: run `engram migrate`")
    return bytes(row[0])


def _active_generation(conn: psycopg.Connection[Any]) -> ActiveGeneration | None:
    row = conn.execute(
        "SELECT id, model_id, dims FROM engram_generations WHERE status = 'active'"
    ).fetchone()
    return ActiveGeneration(*row) if row else None


def _begin(conn: psycopg.Connection[Any], fences: Sequence[Fence]) -> Any:
    """Raise the fences, read the store clock, and hold the active generation
    (FOR SHARE: an activation waits for this transaction). Read by ``_begun``."""
    return conn.execute(
        """
        WITH raised AS (
            INSERT INTO engram_fences (name, token)
            SELECT * FROM unnest(%(names)b::text[], %(tokens)b::bigint[]) ORDER BY 1
            ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token
            WHERE engram_fences.token <= EXCLUDED.token RETURNING name
        )
        SELECT clock_timestamp(), ARRAY(SELECT name FROM raised), g.id, g.model_id, g.dims
        FROM (SELECT 1) AS one LEFT JOIN (
            SELECT id, model_id, dims FROM engram_generations WHERE status = 'active' FOR SHARE
        ) AS g ON true
        """,
        {"names": [f.name for f in fences], "tokens": [f.token for f in fences]},
    )


def _begun(cursor: Any, fences: Sequence[Fence]) -> tuple[datetime, ActiveGeneration | None]:
    row = cursor.fetchone()
    assert row is not None
    stale = tuple(sorted({f.name for f in fences} - set(row[1])))
    if stale:
        raise FencedError(f"stale fencing token for {', '.join(stale)}", fences=stale)
    return row[0], ActiveGeneration(*row[2:]) if row[2] is not None else None


def _start_first_generation(conn: psycopg.Connection[Any], embedder: Embedder) -> int:
    """The first stored vector starts generation 1 as active (seed 000)."""
    row = conn.execute(
        "INSERT INTO engram_generations (model_id, dims, status, activated_at)"
        " VALUES (%s, %s, 'active', now()) RETURNING id",
        (embedder.model_id, embedder.dims),
    ).fetchone()
    assert row is not None
    log.info("embedding generation started", extra={"generation": row[0]})
    return int(row[0])


def _fetched_position(cursor: Any) -> str | None:
    if cursor is None:
        return None
    row = cursor.fetchone()
    return str(row[0]) if row else None


def _at(result: WriteResult, position: str | None) -> WriteResult:
    if position is None:
        return result
    return replace(result, receipt=replace(result.receipt, position=position))


def _receipt(outcome: Applied, op: Operation, position: str | None = None) -> Receipt:
    r = outcome.receipt
    return Receipt(
        operation_id=r.operation_id,
        kind=r.kind,
        scope=op.scope,
        scope_revision=r.scope_revision,
        committed_at=r.committed_at,
        redacted=r.redacted,
        records=tuple(RecordRef(x.id, x.revision, x.status) for x in r.refs),
        forgotten_revisions=tuple(r.forgotten_revisions)
        if r.forgotten_revisions is not None
        else None,
        already_forgotten=r.already_forgotten,
        redaction=r.redaction,  # type: ignore[arg-type]
        stream_entry=r.stream_entry,
        model_calls=r.model_calls,
        requested_by=r.requested_by,
        proposed=tuple(r.proposed),
        position=position,
    )


def load_results(conn: psycopg.Connection[Any], keys: Sequence[OpKey]) -> dict[OpKey, WriteResult]:
    """The stored receipts of the operations ``keys`` name (scope key, operation id) as
    replayed results, with the revisions still present."""
    if not keys:
        return {}
    params = ([k[0] for k in keys], [k[1] for k in keys])
    receipts = {
        (row[2], row[0]): receipt_from_row(row)
        for row in conn.execute(
            f"SELECT {RECEIPT_COLUMNS} FROM unnest(%b::text[], %b::text[]) AS k(scope_key, op)"
            " JOIN engram_scopes s ON s.key = k.scope_key"
            " JOIN engram_receipts c ON c.scope_id = s.id AND c.operation_id = k.op",
            params,
        ).fetchall()
    }
    records: dict[OpKey, list[Any]] = defaultdict(list)
    for row in conn.execute(
        f"SELECT s.key, rr.operation_id, {REVISION_COLUMNS}"
        " FROM unnest(%b::text[], %b::text[]) AS k(scope_key, op)"
        " JOIN engram_scopes s ON s.key = k.scope_key"
        " JOIN engram_receipt_records rr ON rr.scope_id = s.id AND rr.operation_id = k.op"
        " JOIN engram_revisions v ON v.scope_id = rr.scope_id AND v.record_id = rr.record_id"
        " AND v.revision = rr.revision"
        " ORDER BY rr.record_id, rr.revision",
        params,
    ).fetchall():
        records[(row[0], row[1])].append(record_from_row(row[2:]))
    return {
        key: WriteResult(receipt=_as_repeat(receipt), replayed=True, records=tuple(records[key]))
        for key, receipt in receipts.items()
    }


def _as_repeat(receipt: Receipt) -> Receipt:
    """A repeated forget deletes nothing more: revisions [] and already_forgotten (seed 000)."""
    if receipt.kind != "forget" or receipt.forgotten_revisions is None:
        return receipt
    return replace(receipt, forgotten_revisions=(), already_forgotten=True)


def _record(row: RevisionRow, scope: Scope) -> Record:
    """A row the plan wrote, as the ``Record`` its caller gets back (after the commit)."""
    c = row.record
    return Record(
        id=c.id,
        revision=c.revision,
        scope=scope,
        text=c.text,
        kind=c.kind,
        importance=c.importance,
        metadata=c.metadata,
        origin=c.origin,  # type: ignore[arg-type]
        sources=c.sources,
        links=c.links,
        status=c.status,  # type: ignore[arg-type]
        digest=c.digest,
        operation_id=row.operation_id,
        recorded_at=row.recorded_at,
        expires_at=c.expires_at,
    )
