"""Dead letters chosen by a filter, and acted on together.

A page of the dead letters, or a bulk retry or discard, takes the letters a
``Match`` admits (reason, partition, code: exactly, or as a beginning when asked;
operation kind, time; an operation id, a record id, scope fields), read from the
stream in pages. The dashboard, the API and ``engram dead-letters`` read a filter
with ``match_from``.

A bulk action is planned first (``plan``: how many, which, where each would go, and a
digest of them) and applied only to the letters its dry run showed (``Bulk.check``:
else ``SelectionChangedError``), one audit row a letter.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis

from engram.store.errors import InvalidRequestError
from engram.store.limits import MAX_ID_CHARS, MAX_SCOPE_VALUE_CHARS
from engram.store.values import SCOPE_FIELDS, check_string
from engram.store.write.operations import OPERATION_KINDS
from engram.worker import layout
from engram.worker.admin.deadletters import (
    REASONS,
    DeadLetter,
    discard_audited,
    home_partition,
    page,
    retry_audited,
)
from engram.worker.errors import SelectionChangedError

if TYPE_CHECKING:
    from engram.store.audit import Audit

# A bulk action touches at most this many letters (reading the whole stream to find them).
MAX_BULK = 1000


@dataclass(frozen=True, slots=True)
class Match:
    """Which dead letters a page shows or a bulk action takes: those of one reason, one
    partition, one code (exactly, or those beginning with it when ``code_prefix``), one
    operation kind, added in a span of time (``since_ms`` at or after, ``until_ms``
    before), of one operation id, about one record id (the operation's ``request.id``),
    of a scope with these fields (``scope``: pairs, each the letter's scope must hold);
    none of them: every letter.

    The code is the letter's own (``DeadLetter.code``: ``invalid_json``,
    ``unknown_kind``...), never its error's class code, which several codes share
    (``invalid_request``): a bulk discard of ``invalid_request`` takes those letters and
    no others."""

    reason: str | None = None
    partition: int | None = None
    code: str | None = None  # the letter's code (``DeadLetter.code``)
    kind: str | None = None  # the operation's kind, as ``kind_of`` reads it
    since_ms: int | None = None
    until_ms: int | None = None
    operation_id: str | None = None
    record_id: str | None = None
    scope: tuple[tuple[str, str], ...] = ()
    code_prefix: bool = False  # the code is a beginning (a choice of its own, shown)

    def __post_init__(self) -> None:
        for name, value in (("operation_id", self.operation_id), ("record_id", self.record_id)):
            if value is not None:
                check_string(value, name, max_chars=MAX_ID_CHARS)
        for field, value in self.scope:
            if field not in SCOPE_FIELDS:
                raise InvalidRequestError(f"a scope field is one of {', '.join(SCOPE_FIELDS)}")
            check_string(value, field, max_chars=MAX_SCOPE_VALUE_CHARS)
        if self.reason is not None and self.reason not in REASONS:
            raise InvalidRequestError(f"reason must be one of {', '.join(REASONS)}")
        if self.code is not None and not _CODE.fullmatch(self.code):
            raise InvalidRequestError("an error code is 1 to 64 letters, digits, '_', '.' or '-'")
        if self.kind is not None and self.kind not in OPERATION_KINDS:
            raise InvalidRequestError(f"kind must be one of {', '.join(OPERATION_KINDS)}")
        if self.code_prefix and self.code is None:
            object.__setattr__(self, "code_prefix", False)  # no code: nothing to begin with

    def admits_code(self, letter: DeadLetter) -> bool:
        if self.code is None:
            return True
        return letter.code.startswith(self.code) if self.code_prefix else letter.code == self.code

    def admits(self, letter: DeadLetter) -> bool:
        return (
            (self.reason is None or letter.reason == self.reason)
            and (self.partition is None or letter.partition == self.partition)
            and self.admits_code(letter)
            and (self.since_ms is None or letter.at_ms >= self.since_ms)
            and (self.until_ms is None or letter.at_ms < self.until_ms)
            and (self.operation_id is None or letter.operation_id == self.operation_id)
            and (self.kind is None or kind_of(letter) == self.kind)
            and self._searched(letter)
        )

    def _searched(self, letter: DeadLetter) -> bool:
        """The record id and the scope fields, read from the operation as sent."""
        if self.record_id is None and not self.scope:
            return True
        op = _op_of(letter)
        if op is None:
            return False
        request, scope = op.get("request"), op.get("scope")
        if self.record_id is not None and not (
            isinstance(request, dict) and request.get("id") == self.record_id
        ):
            return False
        return all(isinstance(scope, dict) and scope.get(f) == v for f, v in self.scope)

    def as_dict(self) -> dict[str, Any]:
        """The filter as the API and the dashboard's links carry it (times in ISO 8601)."""
        return {
            "reason": self.reason,
            "partition": self.partition,
            "code": self.code,
            "code_match": None if self.code is None else CODE_MATCHES[self.code_prefix],
            "kind": self.kind,
            "since": iso_ms(self.since_ms),
            "until": iso_ms(self.until_ms),
            # The searches, when given (absent: any).
            **{k: v for k, v in self._searches().items() if v is not None},
        }

    def _searches(self) -> dict[str, str | None]:
        return {"operation_id": self.operation_id, "record_id": self.record_id, **dict(self.scope)}


SEARCH_FIELDS = ("operation_id", "record_id", *SCOPE_FIELDS)
MATCH_FIELDS = (
    "reason", "partition", "code", "code_match", "kind", "since", "until", *SEARCH_FIELDS,
)  # fmt: skip
# How ``code`` is matched: the letter's code is it, or begins with it (``code_prefix``).
CODE_MATCHES = ("exact", "prefix")


def match_from(params: Mapping[str, Any]) -> Match:
    """The filter in ``params`` (a query, a form, a JSON object or the command line's
    options), each of ``MATCH_FIELDS``; empty or absent: any. ``InvalidRequestError``
    names what is wrong."""
    return Match(
        _given(params.get("reason"), "reason"),
        _partition(params.get("partition")),
        code=_given(params.get("code"), "code"),
        code_prefix=_code_match(params.get("code_match")) == "prefix",
        kind=_given(params.get("kind"), "kind"),
        since_ms=_ms(params.get("since"), "since"),
        until_ms=_ms(params.get("until"), "until"),
        operation_id=_given(params.get("operation_id"), "operation_id"),
        record_id=_given(params.get("record_id"), "record_id"),
        scope=tuple((f, v) for f in SCOPE_FIELDS if (v := _given(params.get(f), f)) is not None),
    )


def _code_match(value: Any) -> str:
    given = _given(value, "code_match") or "exact"
    if given not in CODE_MATCHES:
        raise InvalidRequestError(f"code_match must be one of {', '.join(CODE_MATCHES)}")
    return given


def _given(value: Any, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(f"{name} is text")
    return value


_MAX_PARTITION = 2**63 - 1  # a query's bound (the API's document says so)


def _partition(partition: Any) -> int | None:
    if isinstance(partition, float) and partition.is_integer():
        partition = int(partition)  # JSON's 1.0 is an integer
    if isinstance(partition, int) and not isinstance(partition, bool) and partition >= 0:
        return partition
    if isinstance(partition, str) and partition != "":
        if not partition.isascii() or not partition.isdigit() or len(partition) > 19:
            raise InvalidRequestError("partition must be a whole number")
        if int(partition) > _MAX_PARTITION:
            raise InvalidRequestError(f"partition must be between 0 and {_MAX_PARTITION}")
        return int(partition)
    if partition not in (None, ""):
        raise InvalidRequestError("partition is a number")
    return None


def _ms(value: Any, name: str) -> int | None:
    text = _given(value, name)
    return ms_of(parse_time(text, name)) if text is not None else None


def parse_time(value: str, name: str) -> datetime:
    """ISO 8601; a time without a zone is UTC (what the dashboard's time fields send)."""
    try:
        if len(value) > 64:
            raise ValueError(value)
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequestError(
            f"{name} must be an ISO 8601 time, e.g. 2026-12-01T09:30"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _op_of(letter: DeadLetter) -> dict[str, Any] | None:
    """The operation a letter holds, if it reads as a JSON object (untrusted: only
    looked at, never run)."""
    if letter.malformed or letter.op is None:
        return None
    try:
        data = json.loads(letter.op)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def kind_of(letter: DeadLetter) -> str | None:
    """The kind of the operation a letter holds, if its op reads as a JSON object with a
    known kind; a letter whose own fields are garbage, or whose op is not, has none."""
    data = _op_of(letter)
    kind = data.get("kind") if data is not None else None
    return kind if isinstance(kind, str) and kind in OPERATION_KINDS else None


def iso_ms(at_ms: int | None) -> str | None:
    if at_ms is None:
        return None
    return (_EPOCH + timedelta(milliseconds=at_ms)).isoformat(timespec="milliseconds")


def ms_of(at: datetime) -> int:
    """A time as whole milliseconds since the epoch, rounded up: a letter's ``at_ms`` is
    at or after it exactly when it is at or after this."""
    return -((_EPOCH - at) // timedelta(milliseconds=1))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SCAN_BATCH = 500


def matching(
    client: redis.Redis, match: Match, *, before: str | None = None, limit: int = MAX_BULK + 1
) -> list[DeadLetter]:
    """Up to ``limit`` dead letters ``match`` admits, newest first, older than the one
    ``before`` names (the stream read in pages, to its end if need be)."""
    return search(client, match, before=before, limit=limit).letters


@dataclass(frozen=True, slots=True)
class Search:
    letters: list[DeadLetter]  # those the match admits, newest first
    last_read: str | None  # the oldest letter read; None when the stream was read to its end
    read: int  # how many letters were read

    @property
    def cut(self) -> bool:
        """The search stopped at its bound, not at the end of the stream or a full page."""
        return self.last_read is not None


def search(
    client: redis.Redis,
    match: Match,
    *,
    before: str | None = None,
    limit: int,
    max_read: int | None = None,
) -> Search:
    """Up to ``limit`` letters ``match`` admits, newest first, older than the one
    ``before`` names, reading at most ``max_read`` letters (a page of the dashboard must
    not read the whole stream for a filter that matches nothing): where it stopped is
    ``last_read``, for the next page to go on from."""
    if match == Match():
        letters = page(client, before=before, count=limit)  # no filter: one read
        return Search(letters, None, len(letters))
    found: list[DeadLetter] = []
    read = 0
    while len(found) < limit:
        count = _SCAN_BATCH if max_read is None else min(_SCAN_BATCH, max_read - read)
        if count <= 0:
            return Search(found, before, read)
        letters = page(client, before=before, count=count)
        read += len(letters)
        found += [x for x in letters if match.admits(x)]
        if len(letters) < count:
            break
        before = letters[-1].id
    return Search(found[:limit], None, read)


def digest(letters: Sequence[DeadLetter]) -> str:
    """A stable name of a set of letters: a bulk action confirms the set its dry run saw."""
    return hashlib.sha256(" ".join(sorted(x.id for x in letters)).encode()).hexdigest()[:32]


BULK_ACTIONS = ("retry", "discard")


@dataclass(frozen=True, slots=True)
class Bulk:
    """What a bulk action would do: the letters it takes (with the partition each retried
    one goes to) and those its filter matches that it leaves (a retry that can never
    succeed)."""

    action: str
    match: Match
    taken: list[tuple[DeadLetter, int | None]]
    left: list[DeadLetter]

    @property
    def count(self) -> int:
        return len(self.taken)

    @property
    def digest(self) -> str:
        return digest([x for x, _ in self.taken])

    def check(self, count: object, seen_digest: object) -> None:
        """Refuse unless it takes the letters a dry run saw (``count`` and ``digest``)."""
        if count != self.count or seen_digest != self.digest:
            raise SelectionChangedError(
                f"{self.count} dead letters match now, not the ones the dry run showed: look again"
            )


def plan(client: redis.Redis, action: str, match: Match, *, partitions: int) -> Bulk:
    """The dry run of ``action`` on every letter ``match`` admits (at most ``MAX_BULK``)."""
    if action not in BULK_ACTIONS:
        raise InvalidRequestError("a bulk action is retry or discard")
    found = matching(client, match)
    if len(found) > MAX_BULK:
        raise InvalidRequestError(f"more than {MAX_BULK} dead letters match: narrow the filter")
    if action == "discard":
        return Bulk(action, match, [(x, None) for x in found], [])
    # The layout in Redis wins over the configured count (``layout``).
    now = layout.read(client, partitions).current
    homes = [(x, home_partition(x, now)) for x in found]
    taken: list[tuple[DeadLetter, int | None]] = [(x, p) for x, p in homes if p is not None]
    return Bulk(action, match, taken, [x for x, p in homes if p is None])


def apply_bulk(
    client: redis.Redis, audit: Audit, who: str, bulk: Bulk, why: str | None = None
) -> int:
    """Do a checked ``Bulk``, one audit row a letter; how many."""
    for letter, home in bulk.taken:
        if bulk.action == "retry":
            retry_audited(client, audit, who, letter, home, why, bulk.count)
        else:
            discard_audited(client, audit, who, letter, why, bulk.count)
    return bulk.count
