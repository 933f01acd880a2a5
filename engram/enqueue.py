"""``engram enqueue`` and ``engram wait``: send an operation, wait for its reply.

The reply goes to stdout as JSON, a receipt (exit 0) or ``{"error": ...}``
(exit 1). A wait that runs out is not a failure: the operation is enqueued, so
stdout says so (its id, no ``error``), stderr says how to wait again, and the
exit code is 3.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from engram.store import Operation, Scope
from engram.store.errors import EngramError, unknown_operation
from engram.worker.admin import pause
from engram.worker.embedded import runtime
from engram.worker.errors import WaitTimeout
from engram.worker.producer import Producer
from engram.worker.protocol import StreamReceipt
from engram.worker.settings import Settings

from . import exits
from .args import json_value, one_stdin, positive_float, scope_arg
from .database import open_store

KINDS = ("remember", "extract", "revise", "retract", "forget")


def cmd_enqueue(settings: Settings, args: argparse.Namespace) -> int:
    one_stdin(args.scope, args.request)
    op = Operation.build(
        args.kind,
        json_value(args.scope, "--scope"),
        json_value(args.request, "--request"),
        args.operation_id,
    )  # InvalidRequestError (exit 2) before anything is sent
    with _producer(settings) as producer:
        pending = producer.enqueue(op)
        where = {
            "operation_id": pending.operation_id,
            "partition": pending.partition,
            "entry": pending.entry_id,
        }
        if args.wait is None:
            _print(where)
            return exits.OK
        return _answer(
            lambda: pending.wait(args.wait),
            where,
            op.scope.as_dict(),
            args.wait,
            lambda: _held(producer, pending.partition),
        )


def cmd_wait(settings: Settings, args: argparse.Namespace) -> int:
    scope = Scope.of(json_value(args.scope, "--scope"))  # an id is its scope's
    with _producer(settings) as producer:
        return _answer(
            lambda: _not_lost(settings, producer.wait(scope, args.operation_id, args.timeout)),
            {"operation_id": args.operation_id},
            scope.as_dict(),
            args.timeout,
        )


def _not_lost(settings: Settings, receipt: StreamReceipt) -> StreamReceipt:
    """``receipt``, unless a restore of the database lost its operation (valkey's reply
    outlives the database): then ``NotFoundError``, as the API and MCP answer. Checked
    when the database is configured or ``engram up`` runs; else the reply is all there is."""
    if not runtime.configured_or_published(settings, "database_url"):
        return receipt
    with open_store(settings, "engram wait", connections=1) as store:
        if store.lost_to_restore(receipt):
            raise unknown_operation(receipt.operation_id)
    return receipt


def _producer(settings: Settings) -> Producer:
    return Producer.from_url(runtime.redis_url(settings), partitions=settings.worker.partitions)


def _held(producer: Producer, partition: int) -> str | None:
    """Why no worker takes the operation, when Redis says: its partition is paused."""
    held = pause.paused_partitions(producer.client).get(partition)
    if held is None:
        return None
    return (
        f"Its partition {partition} is paused {held.describe()}: it is applied once the "
        f"partition is resumed (engram resume partition {partition})."
    )


def _answer(
    wait: Any,
    where: dict[str, Any],
    scope_fields: dict[str, str],
    timeout_s: float,
    why_waiting: Callable[[], str | None] = lambda: None,
) -> int:
    op_id = where["operation_id"]
    scope = json.dumps(scope_fields, separators=(",", ":"), ensure_ascii=False)
    try:
        receipt = wait()
    except WaitTimeout:
        _print({**where, "status": "pending"})
        why = why_waiting() or (
            "It is applied once a worker takes it (is `engram up` or `engram worker` running?)."
        )
        print(
            f"engram: no reply for {op_id} within {timeout_s:g}s. It is enqueued. {why} "
            f"Wait again with: engram wait {_quoted(op_id)} --scope {_quoted(scope)}"
            " --timeout 60. Sent before a"
            " restore of the database, it may have been lost: it then has no receipt"
            f" (engram receipts --refused --operation-id {_quoted(op_id)} prints none).",
            file=sys.stderr,
        )
        return exits.PENDING
    except EngramError as exc:
        _print({"error": exc.to_dict()})
        print(f"engram: {op_id}: {exc.code}: {exc.message}", file=sys.stderr)
        return exits.REFUSED
    _print(receipt.as_dict())
    return exits.OK


def _print(value: dict[str, Any]) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _quoted(text: str) -> str:
    import shlex

    return shlex.quote(text)


def register(sub: Any) -> None:
    enqueue = sub.add_parser(
        "enqueue", help="send one operation; print where it went, or wait and print its reply"
    )
    enqueue.add_argument("kind", choices=KINDS)
    scope_arg(enqueue)
    enqueue.add_argument(
        "--request",
        required=True,
        help='JSON, e.g. \'{"text": "..."}\'; @file.json reads a file, - reads stdin',
    )
    enqueue.add_argument("--operation-id", default=None, help="yours; generated when not given")
    enqueue.add_argument(
        "--wait",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="wait this long for the reply and print it (exit 3 if none came)",
    )
    enqueue.set_defaults(run=cmd_enqueue)
    wait = sub.add_parser("wait", help="wait for an enqueued operation's reply and print it")
    wait.add_argument("operation_id")
    scope_arg(wait)
    wait.add_argument("--timeout", type=positive_float, default=30.0, metavar="SECONDS")
    wait.set_defaults(run=cmd_wait)
