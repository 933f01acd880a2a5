"""Scoped access tokens, and the log of what each read (issue 28).

A token is a principal: a name (the authenticated actor on what it asks for),
one exact scope, and the capabilities it was given. Its secret (``egt_`` and
43 URL-safe characters) is shown once, at creation; only its sha256 is kept,
so a secret cannot be read back from the database. A revoked or expired token
verifies as nothing on its next use.

The read log is content-free by construction: which token, when, through which
tool, and which record ids and revisions a read returned; never a text, never
a query. A forget leaves it as it is (ids and revisions only, like a tombstone).
"""

from __future__ import annotations

import builtins
import hashlib
import math
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from . import audit
from .errors import InvalidRequestError, LedgerUnavailableError, TokenNameTakenError
from .ledger import ForgetLedger, Revocation, database_key
from .limits import MAX_ID_CHARS
from .rows import scope_from_key
from .values import Scope

# What a token may be allowed: its reads, then its writes.
CAPABILITIES = (
    *("recall", "get", "history", "operation"),
    *("remember", "extract", "revise", "retract", "forget"),
)
READ_TOOLS = ("recall", "get", "history")
TOKEN_PREFIX = "egt_"
# The actor a token's operations and audit rows name: ``token:NAME``.
ACTOR_PREFIX = "token:"
# How stale a token's last_used_at may get: verify notes a use at most this often.
LAST_USED_EVERY_S = 60
_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,64}")
_SECRET = re.compile(r"egt_[A-Za-z0-9_-]{43}")

# The interface's name for a refused argument (a scope, a capability, a name).
ValidationError = InvalidRequestError

__all__ = [
    "ACTOR_PREFIX",
    "CAPABILITIES",
    "TOKEN_PREFIX",
    "Grant",
    "ReadEntry",
    "ReadSummary",
    "TokenInfo",
    "TokenNameTakenError",
    "Tokens",
    "ValidationError",
]


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified token may do: its name, its one scope, its capabilities."""

    token_id: int
    name: str  # unique, 1-64 printable chars; the authenticated actor
    scope: dict[str, str]  # the exact scope it acts on
    can: frozenset[str]  # a subset of CAPABILITIES
    expires_at: datetime | None
    # How it was presented: an engram token (``egt_``), or an OAuth access token of the
    # operator's authorization server (``engram.web.oauth``), held by a principal row.
    via: str = "token"

    def allows(self, capability: str) -> bool:
        return capability in self.can

    @property
    def actor(self) -> str:
        """Who its operations and audit rows name: ``token:NAME``."""
        return ACTOR_PREFIX + self.name

    def covers(self, scope: Scope | Mapping[str, Any]) -> bool:
        """Whether ``scope`` is this token's own: the exact scope, no narrower one (a
        token for ``{"user_id": "ada"}`` does not reach ``{"user_id": "ada", "chat_id": ...}``)."""
        return Scope.of(scope).key == Scope.of(self.scope).key


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as the operator's list shows it: never its secret."""

    id: int
    name: str
    scope: Scope
    can: tuple[str, ...]
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    last_used_at: datetime | None

    def live(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)

    def as_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value is not None else None

        return {
            "name": self.name,
            "scope": self.scope.as_dict(),
            "can": list(self.can),
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
            "revoked_by": self.revoked_by,
            "last_used_at": iso(self.last_used_at),
        }


@dataclass(frozen=True, slots=True)
class ReadSummary:
    """How often one token read a record (a read returning it, in any revision)."""

    token: str
    reads: int
    last_at: datetime
    revisions: tuple[int, ...]  # the revisions it was handed, oldest first


@dataclass(frozen=True, slots=True)
class ReadEntry:
    """One record revision one read returned."""

    at: datetime
    tool: str
    record_id: str
    revision: int


_INFO = (
    "id, name, scope_key, can, created_at, created_by, expires_at, revoked_at, revoked_by,"
    " last_used_at"
)


def _info(row: Any) -> TokenInfo:
    return TokenInfo(
        id=row[0],
        name=row[1],
        scope=scope_from_key(row[2]),
        can=tuple(c for c in CAPABILITIES if c in row[3]),
        created_at=row[4],
        created_by=row[5],
        expires_at=row[6],
        revoked_at=row[7],
        revoked_by=row[8],
        last_used_at=row[9],
    )


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def check_name(value: object) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or value != value.strip():
        raise InvalidRequestError(
            "a token's name is 1 to 64 printable characters, without spaces around it"
        )
    return value


def check_capabilities(can: Iterable[str]) -> frozenset[str]:
    if isinstance(can, str):
        raise InvalidRequestError("a token's capabilities are a list of names, not one string")
    given = frozenset(can)
    unknown = sorted(c for c in given if c not in CAPABILITIES)
    if unknown or not given:
        raise InvalidRequestError(
            f"a token may be allowed some of {', '.join(CAPABILITIES)}"
            + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else "")
        )
    return given


class Tokens:
    def __init__(self, pool: Any, *, ledger: ForgetLedger | None = None) -> None:
        self.pool = pool
        # Where a revocation is appended once committed, so that a restore of a backup
        # taken before it revokes the token again (``ledger_replay``). None: appended by
        # the next ``engram forgets check --repair`` (the jobs' hourly schedule).
        self.ledger = ledger

    def create(
        self,
        name: str,
        scope: Mapping[str, str],
        can: Iterable[str] = CAPABILITIES,
        expires_in_s: float | None = None,
        *,
        by: str,
        why: str | None = None,
    ) -> tuple[str, Grant]:
        """A new token: the secret (shown once, 'egt_' + 43 url-safe chars) and its grant.
        Only sha256(secret) is stored; its audit row (``token.create``, by ``by``, with
        ``why``) commits with it. A taken name: TokenNameTakenError; bad scope/capability:
        ValidationError."""
        check_name(name)
        exact = Scope.of(scope)
        allowed = check_capabilities(can)
        if expires_in_s is not None and (
            isinstance(expires_in_s, bool)
            or not isinstance(expires_in_s, int | float)
            or not math.isfinite(expires_in_s)
            or expires_in_s <= 0
        ):
            raise InvalidRequestError("a token's lifetime must be a positive number of seconds")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        names = [c for c in CAPABILITIES if c in allowed]
        lifetime = timedelta(seconds=expires_in_s) if expires_in_s is not None else None
        try:
            with self.pool.connection() as conn, conn.transaction():
                row = conn.execute(
                    "INSERT INTO engram_tokens (name, secret_sha256, scope_key, can, created_by,"
                    " expires_at) VALUES (%s, %s, %s, %s, %s, clock_timestamp() + %s)"
                    " RETURNING id, expires_at",
                    (name, digest(secret), exact.key, names, by, lifetime),
                ).fetchone()
                assert row is not None
                detail: dict[str, str | None] = {"can": ",".join(names), "expires_at": _iso(row[1])}
                if why is not None:
                    detail["reason"] = why
                audit.insert(conn, by, "token.create", ACTOR_PREFIX + name, detail)
        except psycopg.errors.UniqueViolation:
            raise TokenNameTakenError(
                f"a token named {name!r} exists (or existed): choose another name"
            ) from None
        return secret, Grant(row[0], name, exact.as_dict(), allowed, row[1])

    def verify(self, secret: str) -> Grant | None:
        """The grant of a live token, or None (unknown, revoked or expired). Notes its last
        use, to the minute (``LAST_USED_EVERY_S``)."""
        if not isinstance(secret, str) or not _SECRET.fullmatch(secret):
            return None
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT id, name, scope_key, can, expires_at, last_used_at IS NULL"
                " OR last_used_at < clock_timestamp() - make_interval(secs => %s)"
                " FROM engram_tokens WHERE secret_sha256 = %s AND revoked_at IS NULL"
                " AND (expires_at IS NULL OR expires_at > clock_timestamp())",
                (LAST_USED_EVERY_S, digest(secret)),
            ).fetchone()
            if row is not None and row[5]:
                # Noted at most once a LAST_USED_EVERY_S: a request costs a read, not a
                # committed write (bench/bench_mcp.py).
                conn.execute(
                    "UPDATE engram_tokens SET last_used_at = clock_timestamp() WHERE id = %s",
                    (row[0],),
                )
        if row is None:
            return None
        return Grant(row[0], row[1], scope_from_key(row[2]).as_dict(), frozenset(row[3]), row[4])

    def refusal(self, secret: str) -> tuple[str, str | None]:
        """Why ``verify`` refused ``secret``, for the operator's log: ``malformed``,
        ``unknown``, ``revoked`` or ``expired``, with the token's name when one has that
        secret (a name is no secret; the secret itself is never returned or logged)."""
        if not isinstance(secret, str) or not _SECRET.fullmatch(secret):
            return "malformed", None
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT name, revoked_at IS NOT NULL,"
                " expires_at IS NOT NULL AND expires_at <= clock_timestamp()"
                " FROM engram_tokens WHERE secret_sha256 = %s",
                (digest(secret),),
            ).fetchone()
        if row is None:
            return "unknown", None
        return ("revoked" if row[1] else "expired" if row[2] else "unknown"), str(row[0])

    def principal(
        self,
        issuer: str,
        subject: str,
        scope: Mapping[str, str],
        can: Iterable[str],
        expires_at: datetime | None,
    ) -> Grant | None:
        """The grant of an OAuth access token ``engram.web.oauth`` verified: the
        principal row of (``issuer``, ``subject``, ``scope``), made on its first request
        (its audit row, ``token.create`` by ``oauth``, commits with it), so its writes,
        reads and rate limits are its own as a token's are. None when the operator
        revoked it (``engram tokens revoke oauth:...``): its later tokens are refused too.

        The row holds no secret: its ``secret_sha256`` is the hash of a string no
        ``egt_`` secret can be (it holds NUL bytes), so ``verify`` never matches it. Its
        name is ``oauth:`` and the subject, or ``oauth:`` and a digest when that is taken
        or does not fit a name."""
        exact = Scope.of(scope)
        allowed = [c for c in CAPABILITIES if c in frozenset(can)]
        key = hashlib.sha256("\0".join(("oauth", issuer, subject, exact.key)).encode()).digest()
        readable = "oauth:" + subject
        names = [readable] if _NAME.fullmatch(readable) and readable == readable.strip() else []
        names.append("oauth:" + key.hex()[:32])
        with self.pool.connection() as conn:
            for name in names:
                try:
                    with conn.transaction():
                        row = conn.execute(
                            "INSERT INTO engram_tokens (name, secret_sha256, scope_key, can,"
                            " created_by, expires_at, last_used_at)"
                            " VALUES (%s, %s, %s, %s, 'oauth', %s, clock_timestamp())"
                            " ON CONFLICT (secret_sha256) DO UPDATE SET"
                            " last_used_at = clock_timestamp(), can = EXCLUDED.can,"
                            " expires_at = EXCLUDED.expires_at"
                            " RETURNING id, name, revoked_at, xmax = 0",
                            (name, key, exact.key, allowed, expires_at),
                        ).fetchone()
                        assert row is not None
                        if row[3]:
                            audit.insert(
                                conn,
                                "oauth",
                                "token.create",
                                ACTOR_PREFIX + row[1],
                                {"can": ",".join(allowed), "issuer": issuer},
                            )
                except psycopg.errors.UniqueViolation:  # the name is another token's
                    continue
                if row[2] is not None:
                    return None
                can_now = frozenset(allowed)
                return Grant(row[0], row[1], exact.as_dict(), can_now, expires_at, "oauth")
        raise InvalidRequestError("no token name is free for this OAuth principal")

    def any_live(self) -> bool:
        """Whether any token is live (neither revoked nor expired)."""
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM engram_tokens WHERE revoked_at IS NULL"
                " AND (expires_at IS NULL OR expires_at > clock_timestamp()))"
            ).fetchone()
        return bool(row and row[0])

    def revoke(self, name: str, *, by: str, why: str | None = None) -> bool:
        """Revoke the live token ``name`` (its audit row, ``token.revoke``, commits with
        it), then append the revocation to the ledger; False when there is none
        (unknown, or already revoked). The revocation stands even when the ledger cannot
        be written: ``LedgerUnavailableError`` then says so."""
        check_name(name)
        key = None
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(
                "UPDATE engram_tokens SET revoked_at = clock_timestamp(), revoked_by = %s"
                " WHERE name = %s AND revoked_at IS NULL RETURNING id, created_at, revoked_at",
                (by, name),
            ).fetchone()
            if row is not None:
                detail = {"reason": why} if why is not None else {}
                audit.insert(conn, by, "token.revoke", ACTOR_PREFIX + name, detail)
                key = database_key(conn) if self.ledger is not None else None
        if row is None:
            return False
        if self.ledger is not None and key is not None:
            revocation = Revocation(name, row[1], by, row[2], key)
            try:
                self.ledger.append([revocation])
            except LedgerUnavailableError as exc:
                raise LedgerUnavailableError(
                    f"token {name} is revoked, but not in the ledger ({exc.message}): a restore"
                    " would bring it back until `engram forgets check --repair` appends it"
                ) from None
        return True

    def list(self) -> list[TokenInfo]:
        """Every token, live or not, newest first (never a secret)."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"SELECT {_INFO} FROM engram_tokens ORDER BY created_at DESC, id DESC"
            ).fetchall()
        return [_info(r) for r in rows]

    def get(self, name: str) -> TokenInfo | None:
        with self.pool.connection() as conn:
            row = conn.execute(
                f"SELECT {_INFO} FROM engram_tokens WHERE name = %s", (name,)
            ).fetchone()
        return _info(row) if row is not None else None

    # -- what a token did -------------------------------------------------------------

    def vouch(self, grant: Grant, operation_id: str) -> str:
        """Say that ``grant``'s token asked for ``operation_id``, before it is enqueued:
        its receipt then shows ``grant.actor`` as authenticated, not claimed. Returns the
        actor to put in the operation's ``requested_by``. An id vouched for already in the
        token's scope (the same operation sent again) keeps its first row; a vouch is its
        scope's, as an operation id is, and says nothing of the same id elsewhere."""
        if len(operation_id) > MAX_ID_CHARS:
            raise InvalidRequestError(f"operation id is longer than {MAX_ID_CHARS} characters")
        with self.pool.connection() as conn:
            conn.execute(
                "INSERT INTO engram_vouched_operations"
                " (scope_key, operation_id, requested_by, token_id) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (scope_key, operation_id) DO NOTHING",
                (Scope.of(grant.scope).key, operation_id, grant.actor, grant.token_id),
            )
        return grant.actor

    def made(self, grant: Grant, operation_id: str) -> bool:
        """Whether ``grant``'s token asked for ``operation_id`` in its scope."""
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM engram_vouched_operations"
                " WHERE scope_key = %s AND operation_id = %s AND token_id = %s",
                (Scope.of(grant.scope).key, operation_id, grant.token_id),
            ).fetchone()
        return row is not None

    def log_reads(self, grant: Grant, tool: str, returned: Iterable[tuple[str, int]]) -> None:
        """Content-free: token id, when, the tool (recall/get/history), and which
        (record_id, revision) it returned. A read that returned nothing logs nothing."""
        if tool not in READ_TOOLS:
            raise InvalidRequestError(f"a logged read is one of {', '.join(READ_TOOLS)}")
        pairs = [(str(rid), int(rev)) for rid, rev in returned]
        if not pairs:
            return
        with self.pool.connection() as conn:
            conn.execute(
                "INSERT INTO engram_token_reads (token_id, at, tool, record_id, revision)"
                " SELECT %s, now(), %s, r.id, r.rev FROM unnest(%s::text[], %s::int[])"
                " AS r(id, rev)",
                (grant.token_id, tool, [p[0] for p in pairs], [p[1] for p in pairs]),
            )

    def reads_of_record(
        self, scope: Scope | Mapping[str, Any], record_id: str, limit: int = 100
    ) -> builtins.list[ReadSummary]:
        """Which tokens read ``record_id`` of ``scope`` (a record id is its scope's, and a
        token reads its own scope only): how many reads returned it, the last one, the
        revisions handed out; the most recent reader first."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT t.name, count(DISTINCT r.at), max(r.at),"
                " array_agg(DISTINCT r.revision ORDER BY r.revision)"
                " FROM engram_token_reads r JOIN engram_tokens t ON t.id = r.token_id"
                " WHERE r.record_id = %s AND t.scope_key = %s"
                " GROUP BY t.name ORDER BY max(r.at) DESC, t.name LIMIT %s",
                (record_id, Scope.of(scope).key, limit),
            ).fetchall()
        return [ReadSummary(r[0], r[1], r[2], tuple(r[3])) for r in rows]

    def reads_by_token(self, name: str, limit: int = 100) -> builtins.list[ReadEntry]:
        """What token ``name`` read, newest first."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT r.at, r.tool, r.record_id, r.revision FROM engram_token_reads r"
                " JOIN engram_tokens t ON t.id = r.token_id WHERE t.name = %s"
                " ORDER BY r.at DESC, r.id DESC LIMIT %s",
                (name, limit),
            ).fetchall()
        return [ReadEntry(*r) for r in rows]

    def prune_reads(self, older_than: datetime) -> int:
        """Delete the read log's rows from before ``older_than`` (exclusive)."""
        with self.pool.connection() as conn:
            cur = conn.execute("DELETE FROM engram_token_reads WHERE at < %s", (older_than,))
            count: int = cur.rowcount
        return count


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
