"""``engram export`` (everything held about a scope, as JSON Lines) and ``engram import``
(an engram export or mem0's, through the streams as ordinary operations)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from engram.store import Scope, Store
from engram.store.errors import EngramError, InvalidRequestError
from engram.store.portable import convert, export_lines
from engram.store.read.dump import History, Item, ReceiptEntry, Tombstone, dump_scope
from engram.worker.embedded import runtime
from engram.worker.embedded.private import open_private
from engram.worker.errors import WaitTimeout
from engram.worker.producer import Pending, Producer
from engram.worker.settings import Settings

from . import exits
from .args import json_value, one_stdin, positive_float, scope_arg
from .database import command_database
from .output import print_json

# Operations sent per round trip to Redis.
_CHUNK = 500


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    scope = Scope.of(json_value(args.scope, "--scope"))
    counts: Counter[str] = Counter()
    # Every text of the scope: readable by its owner only.
    out: IO[str] = open_private(args.output) if args.output else sys.stdout
    try:
        with (
            command_database(settings, "engram export") as dsn,
            Store.connect(dsn, migrate=False, max_connections=1) as store,
        ):
            items = _counted(dump_scope(store, scope), counts)
            for line in export_lines(items, scope=scope, exported_at=datetime.now(UTC)):
                out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    print(
        f"engram: exported {counts['record']} records, {counts['tombstone']} tombstones, "
        f"{counts['receipt']} receipts of {scope.key}",
        file=sys.stderr,
    )
    return exits.OK


def _counted(items: Iterable[Item], counts: Counter[str]) -> Iterator[Item]:
    names = {History: "record", Tombstone: "tombstone", ReceiptEntry: "receipt"}
    for item in items:
        counts[names[type(item)]] += 1
        yield item


def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    one_stdin(args.file, args.scope)
    text = _read(args.file)
    scope = Scope.of(json_value(args.scope, "--scope")) if args.scope else None
    converted = convert(text, format=args.format, scope=scope, now=datetime.now(UTC))
    ops = converted.operations
    with Producer.from_url(
        runtime.redis_url(settings), partitions=settings.worker.partitions
    ) as producer:
        pending: list[Pending] = []
        for start in range(0, len(ops), _CHUNK):
            pending += producer.enqueue_many(ops[start : start + _CHUNK])
        outcome = _wait_all(pending, args.wait)
    summary = {
        "format": converted.format,
        "records": converted.records,
        "tombstones": converted.tombstones,
        "skipped": converted.skipped,
        "operations": len(ops),
        **outcome,
    }
    print_json(summary)
    if outcome["refused"]:
        print(
            "engram: some operations were refused: see `engram receipts --refused`", file=sys.stderr
        )
        return exits.REFUSED
    if outcome["pending"]:
        print(
            f"engram: {outcome['pending']} operations are enqueued but not applied yet; "
            "run the same import again to wait for them (it applies nothing twice)",
            file=sys.stderr,
        )
        return exits.PENDING
    return exits.OK


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"cannot read {path} ({exc})") from None


def _wait_all(pending: Sequence[Pending], timeout_s: float) -> dict[str, Any]:
    """Each operation's reply to this enqueue (a reply left by an earlier run of the same
    import is passed over), until all are in or ``timeout_s`` has passed."""
    committed = replayed = waiting = 0
    refused: Counter[str] = Counter()
    deadline = time.monotonic() + timeout_s
    for one in pending:
        try:
            receipt = one.wait(max(deadline - time.monotonic(), 0.0))
        except WaitTimeout:
            waiting += 1
        except EngramError as exc:
            refused[exc.code] += 1
        else:
            if receipt.replayed:
                replayed += 1
            else:
                committed += 1
    return {
        "committed": committed,
        "replayed": replayed,
        "refused": dict(refused),
        "pending": waiting,
    }


def register(sub: Any) -> None:
    export = sub.add_parser(
        "export",
        help="write everything held about a scope as JSON Lines (records, revisions, "
        "tombstones, receipts)",
    )
    scope_arg(export)
    export.add_argument("--output", "-o", default=None, help="a file (default: stdout)")
    export.set_defaults(run=cmd_export)
    imp = sub.add_parser(
        "import", help="load an engram export or mem0 memories through the streams"
    )
    imp.add_argument("file", help="JSON Lines or a JSON document; - reads stdin")
    imp.add_argument("--format", choices=("auto", "engram", "mem0"), default="auto")
    scope_arg(imp, required=False)
    imp.add_argument(
        "--wait",
        type=positive_float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for the replies (default 300; exit 3 if some did not come)",
    )
    imp.set_defaults(run=cmd_import)
