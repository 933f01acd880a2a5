"""The ``engram`` command: up, worker, enqueue, metrics, health, migrate, demo."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from store import Store, WordLlamaEmbedder
from store.errors import EngramError, InvalidRequestError
from store.server import EmbeddedPostgres
from worker import logs, metrics, runtime
from worker.producer import Producer
from worker.settings import Settings

from . import jobs_cli

log = logging.getLogger("engram")


def _database(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """DATABASE_URL when set, else the embedded PostgreSQL under ENGRAM_HOME."""
    if settings.database_url:
        return settings.database_url, None
    server = EmbeddedPostgres(settings.home)
    return server.dsn(), server


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    dsn, server = _database(settings)
    try:
        with Store.connect(dsn):
            pass
        print("schema is up to date")
        return 0
    finally:
        if server is not None:
            server.stop()


def demo(store: Store) -> None:
    """Remember, revise, recall and print a history: shows that the store works."""
    mem = store.session({"user_id": "engram-demo"}, embedder=WordLlamaEmbedder())
    first = mem.remember("The demo user lives in London.", operation_id="demo:remember:1")
    record = first.records[0] if first.records else mem.store.get(mem.scope, _demo_id(first))
    assert record is not None
    if record.revision == 1:
        mem.revise(
            record.id,
            text="The demo user lives in Paris.",
            expected_revision=1,
            operation_id="demo:revise:1",
        )
    print(f"record {record.id} (scope revision {store.scope_revision(mem.scope)}):")
    for rev in mem.history(record.id):
        print(f"  revision {rev.revision} [{rev.status}] {rev.text}")
    for hit in mem.recall("Which city does the demo user live in?", top_k=1):
        print(f"  recall -> {hit.record.text!r} ({hit.match}, score {hit.score:.4f})")


def _demo_id(result: object) -> str:
    receipt = result.receipt  # type: ignore[attr-defined]
    return str(receipt.records[0].id) if receipt.records else ""


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    dsn, server = _database(settings)
    try:
        with Store.connect(dsn) as store:
            where = "DATABASE_URL" if server is None else f"embedded, data in {server.data_dir}"
            print(f"PostgreSQL: {where}")
            demo(store)
        return 0
    finally:
        if server is not None:
            server.stop()


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from .up import run_up

    return run_up(settings, workers=args.workers or settings.workers, demo=args.demo)


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from worker.worker import Worker

    from .jobs_cli import forget_hook, worker_embedders

    client = runtime.connect_redis(runtime.redis_url(settings))
    store = _connect_store(runtime.database_url(settings), settings.db_pool_size)
    embedders, embedder = worker_embedders(settings, args.embedder or settings.embedder, store)
    worker = Worker(client, store, embedders, config=settings.worker, on_forget=forget_hook())
    runtime.settle(embedder)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("stop requested", extra={"signal": signal.Signals(signum).name})
        worker.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    try:
        worker.run()
    finally:
        store.close()
        client.close()
    return 0


def _connect_store(dsn: str, pool_size: int) -> Store:
    """Wait for PostgreSQL if it is not up yet (workers may start before it)."""
    import time

    import psycopg

    delay = 1.0
    while True:
        try:
            return Store.connect(dsn, migrate=False, max_connections=pool_size)
        except psycopg.OperationalError as exc:
            log.warning(
                "database unavailable, will retry",
                extra={"error": type(exc).__name__, "retry_in_s": delay},
            )
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def cmd_enqueue(settings: Settings, args: argparse.Namespace) -> int:
    try:
        scope, request = json.loads(args.scope), json.loads(args.request)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"--scope and --request must be JSON ({exc.msg})") from None
    with Producer.from_url(
        runtime.redis_url(settings), partitions=settings.worker.partitions
    ) as producer:
        pending = producer.submit(args.kind, scope, request, operation_id=args.operation_id)
        if args.wait is None:
            print(
                json.dumps(
                    {
                        "operation_id": pending.operation_id,
                        "partition": pending.partition,
                        "entry": pending.entry_id,
                    }
                )
            )
            return 0
        try:
            receipt = pending.wait(args.wait)
        except EngramError as exc:
            print(json.dumps({"error": exc.to_dict()}, indent=2))
            return 1
        print(json.dumps(receipt.as_dict(), indent=2))
        return 0


def cmd_metrics(settings: Settings, args: argparse.Namespace) -> int:
    client = runtime.connect_redis(runtime.redis_url(settings))
    try:
        sys.stdout.write(
            metrics.render(
                client,
                partitions=settings.worker.partitions,
                lease_ttl_ms=settings.worker.lease_ttl_ms,
            )
        )
    finally:
        client.close()
    return 0


def cmd_health(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 when a worker on this host is beating (a container's health check)."""
    import socket

    from worker.membership import live_workers

    client = runtime.connect_redis(runtime.redis_url(settings))
    try:
        here = [
            w
            for w in live_workers(client, settings.worker.lease_ttl_ms)
            if w.get("host") == socket.gethostname()
        ]
    finally:
        client.close()
    print(json.dumps({"live_workers_on_this_host": len(here)}))
    return 0 if here else 1


def register(sub: Any) -> None:
    """The commands defined here; each sets ``run``, the function ``main`` calls."""
    up = sub.add_parser("up", help="run engram: embedded servers unless configured, workers")
    up.add_argument("--workers", type=int, default=None, help="worker processes (default 2)")
    up.add_argument("--demo", action="store_true", help="send a few operations once up")
    up.set_defaults(run=cmd_up)
    worker = sub.add_parser("worker", help="commit operations from the streams until SIGTERM")
    worker.add_argument(
        "--embedder",
        default=None,
        help="before the store has a generation: wordllama (default), minilm, hashing[:DIMS],"
        " a name from ENGRAM_EMBEDDERS or package.module:factory; afterwards, the active"
        " generation's model",
    )
    worker.set_defaults(run=cmd_worker)
    enqueue = sub.add_parser("enqueue", help="send one operation; print its id or receipt")
    enqueue.add_argument("kind", choices=("remember", "extract", "revise", "retract", "forget"))
    enqueue.add_argument("--scope", required=True, help='JSON, e.g. \'{"user_id": "ada"}\'')
    enqueue.add_argument("--request", required=True, help='JSON, e.g. \'{"text": "..."}\'')
    enqueue.add_argument("--operation-id", default=None)
    enqueue.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wait for the receipt and print it",
    )
    enqueue.set_defaults(run=cmd_enqueue)
    for name, run, help_text in (
        ("metrics", cmd_metrics, "print the stream counters in Prometheus text format"),
        ("health", cmd_health, "exit 0 if a worker on this host is alive"),
        ("migrate", cmd_migrate, "apply the schema migrations and exit"),
        ("demo", cmd_demo, "remember, revise and recall directly in the store"),
    ):
        sub.add_parser(name, help=help_text).set_defaults(run=run)


# Each module that defines commands offers ``register(subparsers)``.
_COMMAND_MODULES: tuple[Callable[[Any], None], ...] = (register, jobs_cli.register)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engram", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="default: ENGRAM_LOG_FORMAT, else text",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for register_commands in _COMMAND_MODULES:
        register_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import os

    args = build_parser().parse_args(argv)
    log_format = args.log_format or os.environ.get("ENGRAM_LOG_FORMAT") or "text"
    logs.configure(args.log_level, as_json=log_format == "json")
    try:
        code: int = args.run(Settings.from_env(), args)
        return code
    except EngramError as exc:
        print(f"engram: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except (runtime.ConfigError, ValueError) as exc:
        print(f"engram: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
