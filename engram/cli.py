"""The ``engram`` command: up, worker, metrics, health, migrate, demo, valkey-cli, and
the commands of the modules in ``_COMMAND_MODULES`` (enqueue and wait, the reads, dead
letters, export and import).

Data goes to stdout, diagnostics to stderr; the exit codes are in ``exits``."""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import psycopg
import redis

from engram.store import Store, WordLlamaEmbedder
from engram.store import backup as backups
from engram.store.errors import EngramError
from engram.worker.admin import metrics
from engram.worker.embedded import logs, runtime, valkey
from engram.worker.settings import Settings

from . import exits, wiring
from .args import positive_int
from .database import command_database, wait_for_store

log = logging.getLogger("engram")


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    with command_database(settings, "engram migrate", create=True) as dsn, Store.connect(dsn):
        pass
    print("schema is up to date")
    return 0


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
    with command_database(settings, "engram demo", create=True) as dsn, Store.connect(dsn) as store:
        print(f"PostgreSQL: {dsn}")
        demo(store)
    return 0


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from engram.jobs.settings import JobsSettings

    from .mcp.settings import McpSettings
    from .up import run_up

    # The settings only the children read, read here first: a value that cannot be read
    # stops ``up`` (a ConfigError naming the variable) before anything starts.
    JobsSettings.from_env()
    McpSettings.from_env()
    workers = args.workers if args.workers is not None else settings.workers
    return run_up(
        settings, workers=workers, demo=args.demo, web=not args.no_web, log_level=args.log_level
    )


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from engram.worker.consuming.worker import Worker

    from .jobs_cli import worker_embedders
    from .jobs_redis import forget_hook

    client = runtime.connect_redis(runtime.redis_url(settings))
    on_forget = forget_hook(settings, client)
    # With a replica, the receipts this worker commits carry their commit position.
    store = wait_for_store(
        runtime.database_url(settings),
        settings.db_pool_size,
        read_dsn=settings.database_read_url,
    )
    embedders, embedder = worker_embedders(settings, args.embedder or settings.embedder, store)
    llm = wiring.load_llm(settings)
    worker = Worker(client, store, embedders, llm=llm, config=settings.worker, on_forget=on_forget)
    wiring.settle(embedder)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Nothing here may take a lock its own thread could hold (see worker.stopping):
        # no logging; the worker says it stopped.
        worker.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    try:
        worker.run()
    finally:
        store.close()
        client.close()
        if llm is not None:
            llm.close()
    return 0


def cmd_metrics(settings: Settings, args: argparse.Namespace) -> int:
    client = runtime.connect_redis(runtime.redis_url(settings))
    try:
        sys.stdout.write(
            metrics.render(
                client,
                partitions=settings.worker.partitions,
                lease_ttl_ms=settings.worker.lease_ttl_ms,
                archiving=_archive_status(settings),
            )
        )
    finally:
        client.close()
    return 0


def _archive_status(settings: Settings) -> backups.ArchiveStatus | None:
    """The database's WAL archiving, if it archives and answers within 2 s."""
    url = runtime.configured_or_published(settings, "database_url")
    if url is None:
        return None
    try:
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            return backups.archive_status(conn)
    except psycopg.Error as exc:
        log.debug("the WAL archiving not read", extra={"error": type(exc).__name__})
        return None


def cmd_health(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 when a worker on this host is beating (a container's health check). Also
    says how many entries wait in streams no worker reads (``layout.stranded``), and the
    forgets whose redaction is held (``redactions_held``): a restart cannot help either,
    so they leave the exit code alone."""
    import socket

    from engram.worker import layout
    from engram.worker.consuming.membership import live_workers

    client = runtime.connect_redis(runtime.redis_url(settings))
    try:
        here = [
            w
            for w in live_workers(client, settings.worker.lease_ttl_ms)
            if w.get("host") == socket.gethostname()
        ]
        stranded = layout.stranded(client, settings.worker.partitions)
    finally:
        client.close()
    report: dict[str, Any] = {
        "live_workers_on_this_host": len(here),
        "stranded_entries": sum(n for _, n in stranded),
        "stranded_streams": [stream for stream, _ in stranded],
    }
    report.update(_database_checks(settings))
    # What restores moved aside in the home still holds forgotten texts: said until
    # removed (engram restore --discard-previous); the exit code is the workers'.
    aside = backups.set_aside_databases(settings.home)
    if aside:
        report["set_aside_databases"] = [s.as_dict() for s in aside]
    print(json.dumps(report))
    return 0 if here else 1


def _database_checks(settings: Settings) -> dict[str, Any]:
    """What the database says, if it answers within 2 s (the health check is the
    workers', and never waits on it): the forgets whose deleted rows something still
    holds (a standby's snapshot, a replication slot, a prepared transaction), and the
    WAL archiving when it fails (nothing after the failing segment is archived: a
    restore cannot reach past it)."""
    from engram.store.write import forgets

    url = runtime.configured_or_published(settings, "database_url")
    if url is None:
        return {}
    found: dict[str, Any] = {}
    try:
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            count, reason = forgets.held(conn)
            archiving = backups.archive_status(conn)
    except psycopg.Error as exc:
        log.debug("the database's checks not read", extra={"error": type(exc).__name__})
        return {}
    if count:
        found["redactions_held"] = {"forgets": count, "held_by": reason}
    if archiving is not None and archiving.failing:
        found["wal_archive"] = {"status": "failing", **archiving.as_dict()}
    return found


def cmd_valkey_cli(settings: Settings, args: argparse.Namespace) -> int:
    """The valkey-cli shipped with engram, connected to engram's Redis: no redis-cli needed."""
    argv, env = valkey.cli_command(runtime.redis_url(settings))
    return subprocess.call([*argv, *args.arguments], env={**os.environ, **env})


def register(sub: Any) -> None:
    """The commands defined here; each sets ``run``, the function ``main`` calls."""
    up = sub.add_parser("up", help="run engram: embedded servers unless configured, workers")
    up.add_argument(
        "--workers", type=positive_int, default=None, help="worker processes (default 2)"
    )
    up.add_argument("--demo", action="store_true", help="send a few operations once up")
    up.add_argument(
        "--no-web", action="store_true", help="do not serve the dashboard and the JSON API"
    )
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
    cli = sub.add_parser(
        "valkey-cli",
        help="run the bundled valkey-cli (redis-cli's twin) against engram's Redis",
    )
    cli.add_argument("arguments", nargs=argparse.REMAINDER, help="valkey-cli's own arguments")
    cli.set_defaults(run=cmd_valkey_cli)
    for name, run, help_text in (
        ("metrics", cmd_metrics, "print the stream counters in Prometheus text format"),
        ("health", cmd_health, "exit 0 if a worker on this host is alive"),
        ("migrate", cmd_migrate, "apply the schema migrations and exit"),
        ("demo", cmd_demo, "remember, revise and recall directly in the store"),
    ):
        sub.add_parser(name, help=help_text).set_defaults(run=run)


# Each module that defines commands offers ``register(subparsers)``; the commands each
# registers, in the order ``engram --help`` lists them. A command line that names a
# command imports only the module that defines it: ``engram worker``, which ``engram up``
# starts twice and the tests hundreds of times, does not load the web app, the MCP
# server or the jobs first (tests/engram/test_worker_cli.py checks this table against
# what each module registers).
_COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "engram.cli": ("up", "worker", "valkey-cli", "metrics", "health", "migrate", "demo"),
    "engram.enqueue": ("enqueue", "wait"),
    "engram.reads": ("get", "history", "recall", "receipts", "scopes"),
    "engram.dead_letters": ("dead-letters",),
    "engram.transfer": ("export", "import"),
    "engram.web_cli": ("web", "signin"),
    "engram.jobs_cli": ("jobs", "jobs-health", "reembed", "demo-reembed", "prune"),
    "engram.pause_cli": ("pause", "resume", "paused"),
    "engram.repartition": ("repartition",),
    "engram.tokens_cli": ("tokens",),
    "engram.forgets_cli": ("forgets",),
    "engram.mcp.cli": ("mcp",),
    "engram.backup_cli": ("backup", "restore"),
}
_MODULE_OF = {command: module for module, names in _COMMAND_MODULES.items() for command in names}


def _register(module: str, sub: Any) -> None:
    registers: Callable[[Any], None] = (
        register if module == __name__ else importlib.import_module(module).register
    )
    registers(sub)


DESCRIPTION = (
    "engram, versioned memory for AI agents: run the service (up), send operations"
    " (enqueue, wait), read what is stored (get, history, recall, receipts, scopes),"
    " and run the background jobs (jobs, reembed, prune)."
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of the module that defines ``command``."""
    parser = argparse.ArgumentParser(prog="engram", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"engram {version()}")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="default: ENGRAM_LOG_FORMAT, else text",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (_MODULE_OF[command],) if command in _MODULE_OF else _COMMAND_MODULES:
        _register(module, sub)
    return parser


def version() -> str:
    try:
        return importlib.metadata.version("engram")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    log_format = args.log_format or os.environ.get("ENGRAM_LOG_FORMAT") or "text"
    logs.configure(args.log_level, as_json=log_format == "json")
    _stacks_on_sigusr1()
    try:
        settings = Settings.from_env()
        if not settings.database_url and not _while_restoring(args):
            backups.check_home_not_pending(settings.home)
        code: int = args.run(settings, args)
        return code
    except (EngramError, ValueError, redis.RedisError, psycopg.OperationalError) as exc:
        print(f"engram: {_describe(exc)}", file=sys.stderr)
        return exits.for_error(exc)


def _while_restoring(args: argparse.Namespace) -> bool:
    """What runs on a home whose restore has not finished: the restore, and what reads
    only the backup folder. Every other command refuses it with one code
    (restore_pending, exit 1) and one message naming the command that finishes it."""
    if args.command not in ("backup", "restore"):
        return False
    from . import backup_cli  # already loaded: it defines these commands

    return args.run in (backup_cli.cmd_restore, backup_cli.cmd_list, backup_cli.cmd_prune)


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` prints where every thread of the process is, to stderr: one
    that seems stuck says where, and goes on. (Not when stderr is no file: in tests.)"""
    try:
        stderr = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return
    faulthandler.register(signal.SIGUSR1, file=stderr, all_threads=True)


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; what follows ``valkey-cli`` is valkey-cli's own, leading options
    included (argparse would read ``--scan`` as one of ours)."""
    at = _command_at(argv)
    command = argv[at] if at is not None else None
    if at is not None and command == "valkey-cli":
        args = build_parser(command).parse_args(argv[: at + 1])
        args.arguments = argv[at + 1 :]
        return args
    return build_parser(command).parse_args(argv)


def _command_at(argv: list[str]) -> int | None:
    """Where the command stands in ``argv``: the first word past the global options."""
    at = 0
    while at < len(argv):
        if argv[at] in ("--log-level", "--log-format"):
            at += 2
        elif argv[at].startswith("-"):
            at += 1
        else:
            return at
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, EngramError):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, redis.RedisError):
        return f"redis unavailable: {type(exc).__name__}: {exc}"
    if isinstance(exc, psycopg.OperationalError):
        return f"database unavailable: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return str(exc)


if __name__ == "__main__":
    raise SystemExit(main())
