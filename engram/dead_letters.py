"""``engram dead-letters list|show|retry|discard``: the entries workers could not apply,
one at a time or every one a filter matches (``--all``: a dry run, then ``--confirm``).
``list`` and ``--all`` take the dashboard's filter (reason, partition, error code,
kind, time; operation id, record id, scope fields), read by the same selection logic.
Each retry or discard is written to the audit trail with who (``--by``, else
``cli:<os user>``) and why (``--reason``)."""

from __future__ import annotations

import argparse
import getpass
import json
from datetime import UTC, datetime
from typing import Any

from engram.store.audit import AuditEntry
from engram.store.errors import InvalidRequestError, NotFoundError
from engram.store.values import SCOPE_FIELDS
from engram.store.write.operations import OPERATION_KINDS
from engram.worker import layout
from engram.worker.admin import deadletter_selection as selection
from engram.worker.admin import deadletters
from engram.worker.admin.deadletter_selection import Bulk, Match
from engram.worker.settings import Settings

from . import exits
from .args import json_flag, json_value, positive_int
from .database import open_redis, open_store
from .output import fields, print_json, table

PREVIEW = 20  # letters a dry run lists


def _who(args: argparse.Namespace) -> str:
    return str(args.by or f"cli:{getpass.getuser()}"[:200])


def _when(at_ms: int) -> datetime:
    return datetime.fromtimestamp(at_ms / 1000, tz=UTC)


def _missing(dead_id: str) -> NotFoundError:
    return NotFoundError(f"no dead letter {dead_id}")


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    match = _match(args)
    before = deadletters.check_id(args.before) if args.before is not None else None
    with open_redis(settings) as client:
        letters = selection.matching(client, match, before=before, limit=args.limit)
        total = deadletters.count(client)
    if args.json:
        print_json({"total": total, "dead_letters": [x.as_dict() for x in letters]})
        return exits.OK
    rows = [
        [
            x.id,
            _when(x.at_ms),
            x.partition,
            x.reason,
            x.code,
            x.operation_id,
        ]
        for x in letters
    ]
    print(table(("id", "at", "partition", "reason", "code", "operation"), rows), end="")
    if letters and len(letters) == args.limit and len(letters) < total:
        print(f"{len(letters)} of {total}; older: --before {letters[-1].id}")
    elif match != Match():
        print(f"{len(letters)} of {total} match the filter")
    return exits.OK


def cmd_show(settings: Settings, args: argparse.Namespace) -> int:
    with open_redis(settings) as client:
        letter = deadletters.get(client, deadletters.check_id(args.id))
    if letter is None:
        raise _missing(args.id)
    earlier: list[AuditEntry] = []
    if letter.operation_id is not None:
        with open_store(settings, "engram dead-letters") as store:
            earlier = store.audit.retries_of(letter.operation_id)
    data = letter.as_dict()
    if args.json:
        print_json({**data, "earlier_attempts": [_attempt(e) for e in earlier]})
        return exits.OK
    data["error"] = json.dumps(letter.error, ensure_ascii=False)
    # ``malformed`` says the letter's own fields are garbage, not why it was dead-lettered
    # (its reason, which may be ``malformed`` too): said once, in words, when so.
    unreadable = data.pop("malformed")
    if unreadable:
        data["letter"] = "unreadable: its own fields are missing or garbage (discard it)"
    print(fields(list(data.items())), end="")
    for e in earlier:
        print(f"earlier attempt: {json.dumps(_attempt(e), ensure_ascii=False)}")
    return exits.OK


def _attempt(entry: AuditEntry) -> dict[str, Any]:
    return {"retried_at": entry.at.isoformat(), "by": entry.requested_by, **entry.detail}


def cmd_retry(settings: Settings, args: argparse.Namespace) -> int:
    if args.all:
        return _bulk(settings, args, "retry")
    why = deadletters.check_why(args.reason)
    with open_redis(settings) as client, open_store(settings, "engram dead-letters") as store:
        letter = deadletters.get(client, deadletters.check_id(_one(args)))
        if letter is None:
            raise _missing(args.id)
        # A valid operation goes to the partition its scope belongs to; anything else as sent.
        now = layout.read(client, settings.worker.partitions).current
        home = deadletters.home_partition(letter, now)
        new_id = deadletters.retry_audited(client, store.audit, _who(args), letter, home, why)
        where = letter.partition if home is None else home
    print_json({"retried": args.id, "partition": where, "entry": new_id})
    return exits.OK


def cmd_discard(settings: Settings, args: argparse.Namespace) -> int:
    if args.all:
        return _bulk(settings, args, "discard")
    why = deadletters.check_why(args.reason)
    with open_redis(settings) as client, open_store(settings, "engram dead-letters") as store:
        letter = deadletters.get(client, deadletters.check_id(_one(args)))
        if letter is None:
            raise _missing(args.id)
        deadletters.discard_audited(client, store.audit, _who(args), letter, why)
    print_json({"discarded": args.id})
    return exits.OK


def _one(args: argparse.Namespace) -> str:
    if args.id is None or _match(args) != Match():
        raise InvalidRequestError("name one dead letter, or pass --all (with its filters)")
    return str(args.id)


def _match(args: argparse.Namespace) -> Match:
    """The filter the options give, read as the dashboard and the API read theirs
    (``selection.match_from``)."""
    scope: dict[str, Any] = {}
    if args.scope is not None:
        scope = json_value(args.scope, "--scope")
        if not isinstance(scope, dict) or set(scope) - set(SCOPE_FIELDS):
            raise InvalidRequestError(f"--scope is a JSON object of {', '.join(SCOPE_FIELDS)}")
    return selection.match_from(
        {
            "reason": args.filter_reason,
            "partition": args.partition,
            "code": args.code,
            "code_match": args.code_match,
            "kind": args.kind,
            "since": args.since,
            "until": args.until,
            "operation_id": args.operation,
            "record_id": args.record,
            **scope,
        }
    )


def _bulk(settings: Settings, args: argparse.Namespace, action: str) -> int:
    """Without ``--confirm``, the dry run: how many, which, and the ``--confirm`` value;
    with it, the action on those letters, refused if they changed since."""
    if args.id is not None:
        raise InvalidRequestError("--all takes no id")
    why = deadletters.check_why(args.reason)
    match = _match(args)
    with open_redis(settings) as client:
        bulk = selection.plan(client, action, match, partitions=settings.worker.partitions)
        seen = f"{bulk.count}:{bulk.digest}"
        if args.confirm is None:
            print_json(_dry_run(bulk, seen))
            return exits.OK
        count, _, digest = args.confirm.partition(":")
        bulk.check(int(count) if count.isdigit() else None, digest)
        with open_store(settings, "engram dead-letters") as store:
            selection.apply_bulk(client, store.audit, _who(args), bulk, why)
    print_json({"action": action, "filter": match.as_dict(), "done": bulk.count})
    return exits.OK


def _dry_run(bulk: Bulk, seen: str) -> dict[str, Any]:
    return {
        "action": bulk.action,
        "filter": bulk.match.as_dict(),
        "count": bulk.count,
        "dead_letters": [x.as_dict() for x, _ in bulk.taken[:PREVIEW]],
        "left": [x.id for x in bulk.left],
        "confirm": seen,
    }


def _actions(parser: Any, verb: str) -> None:
    parser.add_argument("id", nargs="?", default=None)
    parser.add_argument("--reason", default=None, help="why (kept in the audit trail)")
    parser.add_argument("--by", default=None, help="who, in the audit trail (cli:<login>)")
    parser.add_argument(
        "--all",
        action="store_true",
        help=f"{verb} every letter the filter matches: a dry run unless --confirm",
    )
    _filters(parser, "with --all: only letters ")
    parser.add_argument(
        "--confirm",
        default=None,
        metavar="COUNT:DIGEST",
        help="with --all: what the dry run printed",
    )


def _filters(parser: Any, only: str) -> None:
    """The filter's options: those of the dashboard's list and the API's ``filter``."""
    parser.add_argument(
        "--filter-reason",
        choices=deadletters.REASONS,
        default=None,
        help=only + "dead-lettered for this reason",
    )
    parser.add_argument("--partition", type=int, default=None, help=only + "of this partition")
    parser.add_argument("--code", default=None, help=only + "of this code (exactly)")
    parser.add_argument(
        "--code-match",
        choices=selection.CODE_MATCHES,
        default=None,
        help="how --code matches: exact (the default), or prefix (codes beginning with it)",
    )
    parser.add_argument(
        "--kind", choices=OPERATION_KINDS, default=None, help=only + "of this operation kind"
    )
    parser.add_argument(
        "--since", default=None, metavar="TIME", help=only + "added at or after (ISO 8601, UTC)"
    )
    parser.add_argument("--until", default=None, metavar="TIME", help=only + "added before")
    parser.add_argument(
        "--operation", default=None, metavar="ID", help=only + "of this operation id"
    )
    parser.add_argument(
        "--record", default=None, metavar="ID", help=only + "whose operation names this record"
    )
    parser.add_argument(
        "--scope",
        default=None,
        help=only + 'whose operation\'s scope has these fields, e.g. \'{"user_id": "ada"}\'',
    )


def register(sub: Any) -> None:
    group = sub.add_parser("dead-letters", help="list, show, retry or discard dead letters")
    actions = group.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="dead letters, newest first")
    listing.add_argument("--before", default=None, metavar="ID", help="only older than this one")
    listing.add_argument("--limit", type=positive_int, default=50)
    _filters(listing, "only letters ")
    json_flag(listing)
    listing.set_defaults(run=cmd_list)
    show = actions.add_parser("show", help="one dead letter, with the operation as sent")
    show.add_argument("id")
    json_flag(show)
    show.set_defaults(run=cmd_show)
    retry = actions.add_parser(
        "retry", help="enqueue its operation again on the partition its scope belongs to"
    )
    _actions(retry, "retry")
    retry.set_defaults(run=cmd_retry)
    discard = actions.add_parser("discard", help="delete a dead letter for good")
    _actions(discard, "discard")
    discard.set_defaults(run=cmd_discard)
