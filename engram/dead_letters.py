"""``engram dead-letters list|show|retry|discard``: the entries workers could not apply."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import redis

from store.errors import NotFoundError
from worker import deadletters, runtime
from worker.deadletters import DeadLetter
from worker.settings import Settings

from . import exits
from .args import json_flag, positive_int
from .output import fields, print_json, table


@contextmanager
def _redis(settings: Settings) -> Iterator[redis.Redis]:
    client = runtime.connect_redis(runtime.redis_url(settings))
    try:
        yield client
    finally:
        client.close()


def _as_dict(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "partition": letter.partition,
        "entry": letter.entry_id,
        "operation_id": letter.operation_id,
        "reason": letter.reason,
        "error": letter.error,
        "deliveries": letter.deliveries,
        "at": _when(letter.at_ms).isoformat(),
        "op": letter.op,
    }


def _when(at_ms: int) -> datetime:
    return datetime.fromtimestamp(at_ms / 1000, tz=UTC)


def _missing(dead_id: str) -> NotFoundError:
    return NotFoundError(f"no dead letter {dead_id}")


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    with _redis(settings) as client:
        letters = deadletters.page(client, before=args.before, count=args.limit)
        total = deadletters.count(client)
    if args.json:
        print_json({"total": total, "dead_letters": [_as_dict(x) for x in letters]})
        return exits.OK
    rows = [
        [
            x.id,
            _when(x.at_ms),
            x.partition,
            x.reason,
            x.error.get("code"),
            x.operation_id,
        ]
        for x in letters
    ]
    print(table(("id", "at", "partition", "reason", "error", "operation"), rows), end="")
    if letters and len(letters) < total:
        print(f"{len(letters)} of {total}; older: --before {letters[-1].id}")
    return exits.OK


def cmd_show(settings: Settings, args: argparse.Namespace) -> int:
    with _redis(settings) as client:
        letter = deadletters.get(client, deadletters.check_id(args.id))
    if letter is None:
        raise _missing(args.id)
    data = _as_dict(letter)
    if args.json:
        print_json(data)
    else:
        data["error"] = json.dumps(letter.error, ensure_ascii=False)
        print(fields(list(data.items())), end="")
    return exits.OK


def cmd_retry(settings: Settings, args: argparse.Namespace) -> int:
    with _redis(settings) as client:
        letter = deadletters.get(client, deadletters.check_id(args.id))
        new_id = deadletters.retry(client, args.id) if letter is not None else None
    if letter is None or new_id is None:
        raise _missing(args.id)
    print_json({"retried": args.id, "partition": letter.partition, "entry": new_id})
    return exits.OK


def cmd_discard(settings: Settings, args: argparse.Namespace) -> int:
    with _redis(settings) as client:
        if not deadletters.discard(client, args.id):
            raise _missing(args.id)
    print_json({"discarded": args.id})
    return exits.OK


def register(sub: Any) -> None:
    group = sub.add_parser("dead-letters", help="list, show, retry or discard dead letters")
    actions = group.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="dead letters, newest first")
    listing.add_argument("--before", default=None, metavar="ID", help="only older than this one")
    listing.add_argument("--limit", type=positive_int, default=50)
    json_flag(listing)
    listing.set_defaults(run=cmd_list)
    show = actions.add_parser("show", help="one dead letter, with the operation as sent")
    show.add_argument("id")
    json_flag(show)
    show.set_defaults(run=cmd_show)
    retry = actions.add_parser("retry", help="enqueue its operation again on its partition")
    retry.add_argument("id")
    retry.set_defaults(run=cmd_retry)
    discard = actions.add_parser("discard", help="delete a dead letter for good")
    discard.add_argument("id")
    discard.set_defaults(run=cmd_discard)
