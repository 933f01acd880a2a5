"""``Store``: the connection pool and the store-wide API."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from . import backup, migrations
from .audit import Audit
from .errors import (
    EmbedderUnavailableError,
    InvalidRequestError,
    OperationAmbiguousError,
    SchemaVersionError,
)
from .ledger import ForgetLedger, database_key
from .limits import DEFAULT_MIN_RELEVANCE, DEFAULT_TOP_K, MAX_TEXT_CHARS, MAX_TOP_K
from .models.llm import LLM
from .read.browse import Browse
from .read.cursors import Cursors
from .read.metadata_filter import MetadataFilter
from .read.recall import (
    HNSW_SETTINGS,
    RecallContext,
    check_min_relevance,
    recall,
    recall_context,
)
from .read.routing import ReadRoute, parse_position
from .rows import (
    RECEIPT_COLUMNS,
    REVISION_COLUMNS,
    receipt_from_row,
    record_from_row,
    scope_from_key,
    superseded_by,
)
from .session import ForgetListener, Session
from .tokens import Tokens
from .values import Hit, Receipt, Record, Scope, check_string
from .vectors.embedders import (
    Embedder,
    EmbedderResolver,
    check_matches,
    embed_checked,
    embedder_for,
)
from .vectors.embeddings import Embeddings
from .vectors.registry import EmbedderRegistry
from .write import retention, wire
from .write.needs import needs_model
from .write.operations import Operation
from .write.options import DEFAULTS, WriteOptions
from .write.prepare import Prepared, prepare
from .write.waves import execute_in_waves
from .write.writer import Result, Writer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScopeSummary:
    scope: Scope
    revision: int
    records: int


@dataclass(frozen=True, slots=True)
class RevisionPage:
    """The newest revisions of a record asked for, oldest first, and whether older
    ones remain (``Store.history_page``)."""

    revisions: list[Record]
    older: bool


class Store:
    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        cursor_key: bytes | None = None,
        read_pool: ConnectionPool[Any] | None = None,
        admin_statement_timeout_s: float | None = None,
        ledger: ForgetLedger | None = None,
        embedders: EmbedderRegistry | None = None,
    ) -> None:
        self.pool = pool  # the primary's: every write, and whatever a write reads
        # The reads that need not see the primary (recall, get, history, the dashboard's
        # lists) go through ``reads``: to the replica when there is one (store.read.routing).
        self.reads = ReadRoute(pool, read_pool)
        self.writer = Writer(pool, track_position=read_pool is not None)
        # The long maintenance a caller may set off (purging a retired generation, counting
        # the store) runs under this bound instead of the pools' statement timeout.
        self.embeddings = Embeddings(pool, admin_timeout_s=admin_statement_timeout_s)
        # The operator's view of every scope (keyset pages), and the audit trail. Their
        # cursors are signed: with this process's own key unless one is given (processes
        # serving the same lists share one, so a page's next cursor works on any of them).
        self.cursors = Cursors(cursor_key or secrets.token_bytes(32))
        self.browse = Browse(self.reads, self.cursors)
        self.audit = Audit(pool, self.cursors)
        # Where this process's forgets (and token revocations) are appended before their
        # redaction is complete (``store.ledger``); None: not by this process (``engram
        # forgets check --repair`` appends them later).
        self.ledger = ledger
        self._database_key: str | None = None
        # Scoped access tokens and the log of what each read (always the primary's).
        self.tokens = Tokens(pool, ledger=ledger)
        # What a recall given no embedder embeds its query with: the active generation's
        # model, found by its id (the built-ins, and the names ``embedders`` registers).
        self.embedders = embedders or EmbedderRegistry()

    @classmethod
    def connect(
        cls,
        dsn: str,
        *,
        migrate: bool = True,
        max_connections: int = 8,
        cursor_key: bytes | None = None,
        read_dsn: str | None = None,
        statement_timeout_s: float | None = None,
        admin_statement_timeout_s: float | None = None,
        restoring: bool = False,
        ledger: ForgetLedger | None = None,
        embedders: EmbedderRegistry | None = None,
    ) -> Store:
        """Open a pool on ``dsn``; apply migrations first unless told not to.

        With ``read_dsn`` (a streaming replica of ``dsn``'s database, or several, e.g.
        ``host=a,b&target_session_attrs=prefer-standby&load_balance_hosts=random``), the
        reads that allow it go there, and each receipt carries its commit position.
        The replica need not be up: its pool connects on the first read, and reads go
        to the primary until it answers.

        With ``statement_timeout_s``, every statement on both pools' connections is
        cancelled past it (PostgreSQL's ``statement_timeout``, set at connection start:
        ``psycopg.errors.QueryCanceled``), but the long maintenance a caller may set off
        (``Embeddings.purge_retired``, ``counts``), which runs under
        ``admin_statement_timeout_s`` instead (None: unbounded).

        A database a restore has not finished with (``store.backup``'s marker) is
        refused (``RestorePendingError``): every worker, the dashboard, the API and
        the MCP server open their store here, so none serves it. Only the restore's
        own replay opens it (``restoring``)."""
        with psycopg.connect(dsn) as conn:
            if not restoring:
                backup.check_not_pending(conn)
                conn.rollback()  # the check's transaction: the migrations start afresh
            if migrate:
                migrations.migrate(conn)
            else:
                have, want = migrations.current_version(conn), migrations.code_version()
                if have != want:
                    raise SchemaVersionError(
                        f"the database schema is at version {have}, this engram needs {want}: "
                        "run `engram migrate`"
                    )
        pool: ConnectionPool[Any] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=max_connections,
            configure=_configure,
            open=True,
            kwargs={"autocommit": True, **bounded(dsn, statement_timeout_s)},
        )
        read_pool = _read_pool(read_dsn, max_connections, statement_timeout_s) if read_dsn else None
        return cls(
            pool,
            cursor_key=cursor_key,
            read_pool=read_pool,
            admin_statement_timeout_s=admin_statement_timeout_s if statement_timeout_s else None,
            ledger=ledger,
            embedders=embedders,
        )

    @property
    def database_key(self) -> str:
        """The name the ledger's lines give this database (``ledger.database_key``)."""
        if self._database_key is None:
            with self.pool.connection() as conn:
                self._database_key = database_key(conn)
        return self._database_key

    def close(self) -> None:
        self.reads.close()
        self.pool.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def session(
        self,
        scope: Scope | Mapping[str, Any],
        *,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        on_forget: Iterable[ForgetListener] = (),
    ) -> Session:
        return Session(self, Scope.of(scope), embedder=embedder, llm=llm, on_forget=list(on_forget))

    # -- writes ---------------------------------------------------------------------

    def execute(
        self,
        ops: Sequence[Operation],
        embedder: Embedder | EmbedderResolver | None = None,
        *,
        llm: LLM | None = None,
        options: WriteOptions = DEFAULTS,
    ) -> list[Result]:
        """Commit ``ops`` (each scope's in order) in one transaction.

        Returns, per operation and in order, its ``WriteResult`` or the typed
        error it failed with; a failed operation changes nothing. Raises only
        for the whole batch: ``FencedError`` (naming the stale fences; nothing is
        committed), or a database error.

        ``options`` (``WriteOptions``) say how: the fences, whether forget
        listeners run, the stream entries, the replay look-up, the decisions.
        A replay is always answered from its receipt. With ``check_replays``
        (the default) the stored receipts are looked up before embedding, so a
        replay costs no embedding call; without, that round trip is saved and
        the batch's texts are embedded at once, for callers whose operations
        are seldom repeats (the stream worker, for entries read the first time).

        Operations with a model phase (``needs``: a reconciling remember or
        extract, an inferring extract) make their model calls with ``llm``
        before they commit, unless ``decisions`` already holds what their phase
        decided (the stream worker's model phase); then the batch commits in
        waves (``waves``), so that each phase sees its scope's earlier
        operations. A phase that fails returns its typed error and commits
        nothing: the operation may be sent again with the same id.
        """
        decided = options.decisions

        def has_phase(op: Operation) -> bool:
            return op.key not in decided and needs_model(op.request, llm is not None)

        if not any(has_phase(op) for op in ops):
            return self.writer.execute(ops, embedder, options)
        return execute_in_waves(
            self.writer, self.pool, ops, embedder, llm=llm, has_phase=has_phase, options=options
        )

    def prepare(
        self,
        op: Operation,
        *,
        embedder: Embedder | EmbedderResolver | None = None,
        llm: LLM | None = None,
        deadline: float | None = None,
    ) -> Prepared:
        """Run ``op``'s model phase now, outside any transaction (``prepare``); commit
        it later with ``execute(..., decisions={op.key: prepared.decision})``."""
        return prepare(self.pool, op, embedder=embedder, llm=llm, deadline=deadline)

    def set_redaction(
        self, operation_id: str, status: str, scope: Scope | Mapping[str, Any]
    ) -> None:
        """Set the redaction of the forget ``operation_id`` of ``scope``."""
        with self.pool.connection() as conn:
            conn.execute(
                "UPDATE engram_receipts c SET redaction = %s FROM engram_scopes s"
                " WHERE s.id = c.scope_id AND s.key = %s AND c.operation_id = %s"
                " AND c.kind = 'forget'",
                (status, Scope.of(scope).key, operation_id),
            )

    # -- reads ----------------------------------------------------------------------

    def scope_id(self, scope: Scope | Mapping[str, Any]) -> int | None:
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT id FROM engram_scopes WHERE key = %s", (Scope.of(scope).key,)
            ).fetchone()
        return int(row[0]) if row else None

    def scope_revision(self, scope: Scope | Mapping[str, Any]) -> int:
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT revision FROM engram_scopes WHERE key = %s", (Scope.of(scope).key,)
            ).fetchone()
        return int(row[0]) if row else 0

    def scopes(
        self, limit: int = 100, offset: int = 0, *, after: str | None = None
    ) -> list[ScopeSummary]:
        def read() -> list[Any]:
            with self.reads.connection() as conn:
                return conn.execute(
                    "SELECT s.key, s.revision, (SELECT count(*) FROM engram_records r"
                    " WHERE r.scope_id = s.id) FROM engram_scopes s"
                    " ORDER BY s.key LIMIT %s OFFSET %s",
                    (limit, offset),
                ).fetchall()

        rows = self.reads.run(read, after=after)
        return [ScopeSummary(scope_from_key(r[0]), r[1], r[2]) for r in rows]

    def receipt(
        self, operation_id: str, scope: Scope | Mapping[str, Any] | None = None
    ) -> Receipt | None:
        """The receipt of ``operation_id`` in ``scope`` (an operation id identifies an
        operation within its scope). Without a scope: the one scope's that holds the id;
        ``OperationAmbiguousError`` (naming those scopes) when several do."""
        found = self.receipts(scope=scope, operation_id=operation_id, limit=2, refused=True)
        if len(found) > 1:
            everywhere = self.receipts(operation_id=operation_id, limit=1000, refused=True)
            raise OperationAmbiguousError(
                f"operation {operation_id} is in {len(everywhere)} scopes: name its scope",
                scopes=[r.scope.as_dict() for r in everywhere],
            )
        return found[0] if found else None

    def lost_to_restore(self, receipt: Receipt) -> bool:
        """Whether ``receipt`` (a reply valkey still caches: it outlives a restore of the
        database) is of an operation a restore lost: committed before this database was
        last restored (``Audit.last_restore``), and its receipt not in it. Then the
        operation is unknown here, whatever the reply says (docs/backups.md)."""
        restored = self.audit.last_restore()
        if restored is None or receipt.committed_at > restored:
            return False
        return self.receipt(receipt.operation_id, receipt.scope) is None

    def receipts(
        self,
        *,
        scope: Scope | Mapping[str, Any] | None = None,
        record_id: str | None = None,
        kind: str | None = None,
        operation_id: str | None = None,
        limit: int = 50,
        before_revision: int | None = None,
        refused: bool = False,
    ) -> list[Receipt]:
        """Receipts, newest first, filtered by scope, record, kind or operation id;
        with ``refused``, also the refusals (operations that failed and committed nothing)."""
        clauses, params = ["true"], {"limit": min(max(limit, 1), 1000)}
        if not refused:
            clauses.append("c.error IS NULL")
        if scope is not None:
            clauses.append("s.key = %(key)s")
            params["key"] = Scope.of(scope).key  # type: ignore[assignment]
        if record_id is not None:
            clauses.append(
                "(c.scope_id, c.operation_id) IN (SELECT scope_id, operation_id"
                " FROM engram_receipt_records WHERE record_id = %(rid)s)"
            )
            params["rid"] = record_id  # type: ignore[assignment]
        if kind is not None:
            clauses.append("c.kind = %(kind)s")
            params["kind"] = kind  # type: ignore[assignment]
        if operation_id is not None:
            clauses.append("c.operation_id = %(op)s")
            params["op"] = operation_id  # type: ignore[assignment]
        if before_revision is not None:
            clauses.append("c.scope_revision < %(before)s")
            params["before"] = before_revision
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"SELECT {RECEIPT_COLUMNS} FROM engram_receipts c"
                f" JOIN engram_scopes s ON s.id = c.scope_id WHERE {' AND '.join(clauses)}"
                " ORDER BY c.committed_at DESC, c.scope_revision DESC LIMIT %(limit)s",
                params,
            ).fetchall()
        return [receipt_from_row(r) for r in rows]

    def records(
        self,
        scope: Scope | Mapping[str, Any],
        *,
        include_retracted: bool = True,
        include_expired: bool = False,
        limit: int = 50,
        offset: int = 0,
        after: str | None = None,
        metadata: MetadataFilter | None = None,
        kinds: Sequence[str] | None = None,
    ) -> list[Record]:
        """A page of a scope's current records, most recently changed first; with
        ``metadata``, those whose current metadata meets it; with ``kinds``, of those kinds."""
        params = {
            "key": Scope.of(scope).key,
            "retracted": include_retracted,
            "expired": include_expired,
            "limit": limit,
            "offset": offset,
        }
        where, extra = _current_filters(metadata, kinds)
        params.update(extra)
        statement = _RECORDS.format(where=where)

        def read() -> list[Record]:
            with self.reads.connection() as conn:
                return _with_superseded_by(conn, conn.execute(statement, params).fetchall())

        return self.reads.run(read, after=after)

    def metadata_values(
        self,
        scope: Scope | Mapping[str, Any],
        path: Sequence[str],
        *,
        metadata: MetadataFilter | None = None,
        kinds: Sequence[str] | None = None,
        after: str | None = None,
    ) -> list[Any]:
        """The distinct values at ``path`` of the metadata of a scope's live records (active,
        not expired) that meet ``metadata`` and are of ``kinds``; a record without one
        gives none."""
        where, params = _current_filters(metadata, kinds)
        params.update(key=Scope.of(scope).key, path=list(path))

        def read() -> list[Any]:
            with self.reads.connection() as conn:
                return conn.execute(_VALUES.format(where=where), params).fetchall()

        return [row[0] for row in self.reads.run(read, after=after)]

    def get(
        self,
        scope: Scope | Mapping[str, Any],
        record_id: str,
        *,
        include_expired: bool = False,
        after: str | None = None,
    ) -> Record | None:
        """A record's current revision; with ``after`` (a receipt's ``position``), as of
        that commit or later."""
        params = {"id": record_id, "key": Scope.of(scope).key, "expired": include_expired}

        def read() -> list[Record]:
            with self.reads.connection() as conn:
                return _with_superseded_by(conn, conn.execute(_RECORD, params).fetchall())

        found = self.reads.run(read, after=after)
        return found[0] if found else None

    def history(
        self,
        scope: Scope | Mapping[str, Any],
        record_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        before_revision: int | None = None,
    ) -> list[Record]:
        """The stored revisions of a record of this scope, oldest first: every one, or
        with ``limit`` the newest ``limit`` (read so in SQL, never more), of those before
        ``before_revision`` when it is given."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidRequestError("a history's limit must be a whole number")
        params = {
            "id": record_id,
            "key": Scope.of(scope).key,
            "n": limit,
            "before": before_revision,
        }

        def read() -> list[Any]:
            with self.reads.connection() as conn:
                return conn.execute(_HISTORY, params).fetchall()

        return [record_from_row(r) for r in self.reads.run(read, after=after)]

    def history_page(
        self,
        scope: Scope | Mapping[str, Any],
        record_id: str,
        *,
        limit: int,
        max_bytes: int,
        before_revision: int | None = None,
    ) -> RevisionPage:
        """A page of a record's history for a reader that must stay bounded: the newest
        revisions (before ``before_revision``), at most ``limit`` of them and, past the
        first, no more than ``max_bytes`` of text in all. Both bounds are the query's:
        it reads the page and one revision past it (to say whether older ones remain),
        never the rest, whatever the record holds."""
        for value, what in ((limit, "limit"), (max_bytes, "max_bytes")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequestError(
                    f"a history page's {what} must be a whole number, 1 or more"
                )
        params = {
            "id": record_id,
            "key": Scope.of(scope).key,
            "n": limit + 1,
            "before": before_revision,
            "budget": max_bytes,
        }

        def read() -> list[Any]:
            with self.reads.connection() as conn:
                return conn.execute(_HISTORY_PAGE, params).fetchall()

        rows = self.reads.run(read)
        kept = [r for r in rows if r[-2] == 1 or (r[-1] <= max_bytes and r[-2] <= limit)]
        return RevisionPage(
            [record_from_row(r) for r in reversed(kept)], older=len(rows) > len(kept)
        )

    def recall(
        self,
        scope: Scope | Mapping[str, Any],
        text: str | None = None,
        *,
        embedder: Embedder | EmbedderResolver | None = None,
        top_k: int = DEFAULT_TOP_K,
        kind: str | None = None,
        include_retracted: bool = False,
        recorded_as_of: datetime | None = None,
        after: str | None = None,
        metadata: MetadataFilter | None = None,
        text_only: bool = False,
        min_relevance: float | None = DEFAULT_MIN_RELEVANCE,
    ) -> list[Hit]:
        """Hybrid search in one scope; with ``after`` (a receipt's ``position``), over
        the scope as of that commit or later; with ``metadata``, among the records whose
        current metadata meets it.

        The query is embedded with ``embedder`` (one that must match the active
        generation, or a resolver); with none, with the active generation's model, found
        in ``self.embedders`` (``EmbedderUnavailableError`` when none here produces it:
        never a silent search by words alone). ``text_only`` searches the full-text index
        alone, on purpose (a reader that has no model for the active generation).

        A query's hits of a ``Hit.relevance`` under ``min_relevance`` are left out
        (``DEFAULT_MIN_RELEVANCE`` unless told; None or 0: none is); with no query,
        the newest records are listed, none left out."""
        scope = Scope.of(scope)
        cutoff = check_min_relevance(min_relevance, "min_relevance")
        if text_only and embedder is not None:
            raise InvalidRequestError("a recall by text only takes no embedder")
        if text is not None:
            check_string(text, "recall text", max_chars=MAX_TEXT_CHARS)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
            raise InvalidRequestError(f"top_k must be an integer from 1 to {MAX_TOP_K}")
        if recorded_as_of is not None and not isinstance(recorded_as_of, datetime):
            raise InvalidRequestError("recorded_as_of must be a datetime")
        if recorded_as_of is not None and recorded_as_of.tzinfo is None:
            raise InvalidRequestError("recorded_as_of must carry a time zone")
        parse_position(after, "after")  # refused before any work, whoever serves the read

        def read_context() -> RecallContext:
            with self.reads.connection() as conn:
                return recall_context(conn, scope.key)

        found = self.reads.run(read_context, after=after)
        active = found.generation
        vector = None
        if text is not None and active is not None and not text_only:
            # A resolver picks the active generation's model (or raises
            # EmbedderUnavailableError), and so does the store's registry given none.
            query_embedder = embedder_for(
                embedder if embedder is not None else self.embedders.resolver(None),
                active.model_id,
                active.dims,
            )
            if query_embedder is None:
                raise EmbedderUnavailableError(
                    f"no embedder for the active generation's {active.model_id}"
                )
            check_matches(query_embedder, active.model_id, active.dims)
            if found.scope_id is not None:
                vector = embed_checked(query_embedder, [text])[0]  # with no connection taken
        if found.scope_id is None:
            return []  # a scope never written holds nothing
        query = found.query(
            text,
            vector,
            top_k,
            kind=kind,
            include_retracted=include_retracted,
            recorded_as_of=recorded_as_of,
            metadata=metadata,
            min_relevance=cutoff if text is not None else None,
        )

        def search() -> list[Hit]:
            with self.reads.connection() as conn:
                return recall(conn, query)

        return self.reads.run(search, after=after)

    # -- retention ------------------------------------------------------------------

    def prune_history(
        self, older_than: datetime, scope: Scope | Mapping[str, Any] | None = None
    ) -> int:
        return retention.prune_history(
            self.pool, older_than, Scope.of(scope) if scope is not None else None
        )

    def prune_operations(self, older_than: datetime) -> int:
        return retention.prune_operations(self.pool, older_than)


_RECORDS = f"""SELECT {REVISION_COLUMNS}, r.scope_id FROM engram_records r
    JOIN engram_scopes s ON s.id = r.scope_id
    JOIN engram_revisions v
      ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
    WHERE s.key = %(key)s AND (%(retracted)s OR r.status = 'active')
      AND (%(expired)s OR r.expires_at IS NULL OR r.expires_at > now()) AND {{where}}
    ORDER BY r.updated_at DESC, r.id LIMIT %(limit)s OFFSET %(offset)s"""

_VALUES = """SELECT DISTINCT v.metadata #> %(path)s::text[] FROM engram_records r
    JOIN engram_scopes s ON s.id = r.scope_id
    JOIN engram_revisions v
      ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
    WHERE s.key = %(key)s AND r.status = 'active'
      AND (r.expires_at IS NULL OR r.expires_at > now())
      AND v.metadata #> %(path)s::text[] IS NOT NULL AND {where}"""


def _current_filters(
    metadata: MetadataFilter | None, kinds: Sequence[str] | None
) -> tuple[str, dict[str, Any]]:
    """The metadata and kind filters on current revisions ``v``, as SQL."""
    where, params = (metadata or MetadataFilter()).sql("v.metadata")
    if kinds is not None:
        where += " AND v.kind = ANY(%(kinds)s)"
        params["kinds"] = list(kinds)
    return where, params


_RECORD = f"""SELECT {REVISION_COLUMNS}, r.scope_id FROM engram_records r
    JOIN engram_scopes s ON s.id = r.scope_id
    JOIN engram_revisions v
      ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
    WHERE r.id = %(id)s AND s.key = %(key)s
      AND (%(expired)s OR r.expires_at IS NULL OR r.expires_at > now())"""

# The newest %(n)s (NULL: all) before %(before)s (NULL: any), turned oldest first.
_HISTORY = f"""SELECT * FROM (
    SELECT {REVISION_COLUMNS} FROM engram_revisions v
    JOIN engram_scopes s ON s.id = v.scope_id
    WHERE v.record_id = %(id)s AND s.key = %(key)s
      AND (%(before)s::integer IS NULL OR v.revision < %(before)s::integer)
    ORDER BY v.revision DESC LIMIT %(n)s::integer
) newest ORDER BY revision"""


# Newest first: each revision with its rank and the bytes of text up to and including
# it. Kept: the first, and the next ones while within the budget and the limit (the
# caller's test); read: those, and the one just past them (its text the only one more).
_HISTORY_PAGE = f"""SELECT * FROM (
    SELECT {REVISION_COLUMNS},
        row_number() OVER newest AS rank,
        sum(octet_length(v.text)) OVER newest AS upto
    FROM engram_revisions v
    JOIN engram_scopes s ON s.id = v.scope_id
    WHERE v.record_id = %(id)s AND s.key = %(key)s
      AND (%(before)s::integer IS NULL OR v.revision < %(before)s::integer)
    WINDOW newest AS (ORDER BY v.revision DESC ROWS UNBOUNDED PRECEDING)
    ORDER BY v.revision DESC LIMIT %(n)s::integer
) page WHERE rank <= 2 OR upto - octet_length(text) <= %(budget)s::bigint
ORDER BY rank"""


def _with_superseded_by(conn: psycopg.Connection[Any], rows: list[Any]) -> list[Record]:
    links = superseded_by(conn, [r[15] for r in rows], [r[0] for r in rows])
    return [record_from_row(r, links.get(r[0], ())) for r in rows]


def bounded(dsn: str, statement_timeout_s: float | None) -> dict[str, str]:
    """The connection argument that bounds every statement of a session: ``options``
    with ``-c statement_timeout=...`` after those the DSN (or ``PGOPTIONS``) gives. As a
    startup setting it is the session's default: a ``SET`` may raise it for a while,
    ``RESET`` comes back to it. None or 0: nothing."""
    if not statement_timeout_s:
        return {}
    ms = max(1, round(statement_timeout_s * 1000))
    given = conninfo_to_dict(dsn).get("options") or os.environ.get("PGOPTIONS") or ""
    return {"options": f"{given} -c statement_timeout={ms}".strip()}


def _read_pool(
    read_dsn: str, max_connections: int, statement_timeout_s: float | None = None
) -> ConnectionPool[Any]:
    """The replica's pool. It connects on the first read (a process that only writes,
    a stream worker, holds no replica connection; it only stamps receipts with their
    position), and a replica down then sends the reads to the primary until it
    answers. A replica that cannot be reached fails its connection attempt quickly,
    unless the DSN says otherwise."""
    given = conninfo_to_dict(read_dsn)
    return ConnectionPool(
        read_dsn,
        min_size=0,
        max_size=max_connections,
        configure=_configure,
        open=True,
        kwargs={
            "autocommit": True,
            "connect_timeout": given.get("connect_timeout", 3),
            **bounded(read_dsn, statement_timeout_s),
        },
    )


def _configure(conn: psycopg.Connection[Any]) -> None:
    register_vector(conn)
    wire.register(conn)
    for name, value in HNSW_SETTINGS.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
