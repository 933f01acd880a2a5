"""The ``engram`` command: ``up``, ``migrate``, ``demo``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from store import Store, WordLlamaEmbedder
from store.errors import EngramError
from store.server import EmbeddedPostgres

from .settings import Settings

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
        mem.revise(record.id, text="The demo user lives in Paris.", expected_revision=1,
                   operation_id="demo:revise:1")
    print(f"record {record.id} (scope revision {store.scope_revision(mem.scope)}):")
    for rev in mem.history(record.id):
        print(f"  revision {rev.revision} [{rev.status}] {rev.text}")
    for hit in mem.recall("Which city does the demo user live in?", top_k=1):
        print(f"  recall -> {hit.record.text!r} ({hit.match}, score {hit.score:.4f})")


def _demo_id(result: object) -> str:
    receipt = getattr(result, "receipt")
    return str(receipt.records[0].id) if receipt.records else ""


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engram", description=__doc__)
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start engram on its embedded default (or the configured servers)")
    sub.add_parser("migrate", help="apply the schema migrations and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    settings = Settings.from_env()
    commands = {"up": cmd_up, "migrate": cmd_migrate}
    try:
        return commands[args.command](settings, args)
    except EngramError as exc:
        print(f"engram: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
