"""Reading the store from the command line: ``get``, ``history``, ``recall``, ``receipts``,
``scopes``. Each prints a table, or JSON with ``--json``; each is a thin call of the
``Store`` read API on the database ``command_database`` finds."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from engram.store import Embedder, Scope
from engram.store.errors import NotFoundError
from engram.store.limits import DEFAULT_MIN_RELEVANCE
from engram.store.portable import record_as_dict
from engram.store.vectors.embedders import EmbedderResolver
from engram.worker.settings import Settings

from . import exits, wiring
from .args import json_flag, json_value, positive_int, scope_arg
from .database import open_store
from .output import RECEIPT_HEADERS, print_json, receipt_row, record_fields, table


def _scope(args: argparse.Namespace) -> Scope:
    return Scope.of(json_value(args.scope, "--scope"))


def cmd_get(settings: Settings, args: argparse.Namespace) -> int:
    scope = _scope(args)
    with open_store(settings, "engram get") as store:
        record = store.get(
            scope, args.record_id, include_expired=args.include_expired, after=args.after
        )
    if record is None:
        raise NotFoundError(f"no record {args.record_id} in scope {scope.key}")
    if args.json:
        print_json(record_as_dict(record))
    else:
        print(record_fields(record), end="")
    return exits.OK


def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    scope = _scope(args)
    with open_store(settings, "engram history") as store:
        revisions = store.history(scope, args.record_id, after=args.after)
    if not revisions:
        raise NotFoundError(f"no record {args.record_id} in scope {scope.key}")
    if args.json:
        print_json([record_as_dict(r) for r in revisions])
        return exits.OK
    rows = [
        [
            r.revision,
            r.status,
            r.recorded_at,
            r.kind,
            " ".join(f"{x.relation}:{x.id}" for x in r.links),
            r.text,
        ]
        for r in revisions
    ]
    print(table(("rev", "status", "recorded at", "kind", "links", "text"), rows), end="")
    return exits.OK


def cmd_recall(settings: Settings, args: argparse.Namespace) -> int:
    scope = _scope(args)
    embedder = _query_embedder(settings, args.embedder)
    with open_store(settings, "engram recall") as store:
        hits = store.recall(
            scope,
            args.text,
            embedder=embedder,
            top_k=args.top_k,
            kind=args.kind,
            include_retracted=args.include_retracted,
            after=args.after,
            min_relevance=args.min_relevance,
        )
    if args.json:
        print_json(
            [{"score": h.score, "match": h.match, "record": record_as_dict(h.record)} for h in hits]
        )
        return exits.OK
    rows = [[h.score, h.match, h.record.id, h.record.revision, h.record.text] for h in hits]
    print(table(("score", "match", "id", "rev", "text"), rows), end="")
    return exits.OK


def _query_embedder(settings: Settings, spec: str | None) -> Embedder | EmbedderResolver:
    """``--embedder`` when given (a model the active generation must match); else the
    active generation's model, ``ENGRAM_EMBEDDER`` only before the store has one: the
    reader follows a re-embedding as the API, the dashboard and the workers do."""
    if spec is not None:
        return wiring.load_embedder(spec)
    registry = wiring.registry(settings)
    return registry.resolver(wiring.load_embedder(settings.embedder, registry))


def cmd_receipts(settings: Settings, args: argparse.Namespace) -> int:
    scope = _scope(args) if args.scope else None
    with open_store(settings, "engram receipts") as store:
        receipts = store.receipts(
            scope=scope,
            record_id=args.record,
            kind=args.kind,
            operation_id=args.operation_id,
            limit=args.limit,
            refused=args.refused,
        )
    if args.json:
        print_json([r.as_dict() for r in receipts])
    else:
        print(table(RECEIPT_HEADERS, [receipt_row(r) for r in receipts]), end="")
    return exits.OK


def cmd_scopes(settings: Settings, args: argparse.Namespace) -> int:
    with open_store(settings, "engram scopes") as store:
        scopes = store.scopes(limit=args.limit, offset=args.offset, after=args.after)
    if args.json:
        print_json(
            [
                {"scope": s.scope.as_dict(), "revision": s.revision, "records": s.records}
                for s in scopes
            ]
        )
    else:
        rows = [[s.revision, s.records, s.scope.key] for s in scopes]
        print(table(("revision", "records", "scope"), rows), end="")
    return exits.OK


def _after_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--after",
        default=None,
        metavar="POSITION",
        help="a receipt's position: read as of that commit or later (with DATABASE_READ_URL)",
    )


def register(sub: Any) -> None:
    def command(name: str, run: Callable[..., int], help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        json_flag(parser)
        parser.set_defaults(run=run)
        return parser

    get = command("get", cmd_get, "print a record's current revision")
    get.add_argument("record_id")
    scope_arg(get)
    get.add_argument("--include-expired", action="store_true")
    _after_arg(get)

    history = command("history", cmd_history, "print every stored revision of a record")
    history.add_argument("record_id")
    scope_arg(history)
    _after_arg(history)

    recall = command("recall", cmd_recall, "recall a scope's records that match a text")
    recall.add_argument("text")
    scope_arg(recall)
    recall.add_argument("--top-k", type=positive_int, default=5)
    recall.add_argument("--kind", default=None)
    recall.add_argument("--include-retracted", action="store_true")
    recall.add_argument(
        "--min-relevance",
        type=float,
        default=DEFAULT_MIN_RELEVANCE,
        help=f"leave out hits less relevant than this, 0 to 1 (default {DEFAULT_MIN_RELEVANCE}; "
        "0 keeps every hit)",
    )
    recall.add_argument(
        "--embedder",
        default=None,
        help="default: the active generation's model (ENGRAM_EMBEDDER before the store has one)",
    )
    _after_arg(recall)

    receipts = command("receipts", cmd_receipts, "print receipts, newest first")
    scope_arg(receipts, required=False)
    receipts.add_argument("--record", default=None, metavar="RECORD_ID")
    receipts.add_argument("--kind", default=None)
    receipts.add_argument("--operation-id", default=None)
    receipts.add_argument("--limit", type=positive_int, default=50)
    receipts.add_argument(
        "--refused", action="store_true", help="also operations refused (they changed nothing)"
    )

    scopes = command("scopes", cmd_scopes, "print the scopes, with their revision and records")
    scopes.add_argument("--limit", type=positive_int, default=100)
    scopes.add_argument("--offset", type=int, default=0)
    _after_arg(scopes)
