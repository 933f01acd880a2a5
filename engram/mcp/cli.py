"""``engram mcp --scope JSON``: the MCP server over stdio, for Claude Desktop, Cursor,
Claude Code and any client that starts its servers as commands.

It finds PostgreSQL and Redis as the long-running processes do (DATABASE_URL and
REDIS_URL, else the run file of the ``engram up`` on this ENGRAM_HOME) and starts
neither. Every tool acts on the one scope given here. stdout carries the protocol
only: the transport is opened first (stray output of whatever loads after it goes to
stderr), and logs go to stderr, with tool names, outcomes and times, never memory text.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread

from engram.store import Scope, Store
from engram.store.errors import ConfigError, InvalidRequestError
from engram.worker.embedded import runtime
from engram.worker.producer import Producer
from engram.worker.settings import Settings

from .. import exits, wiring
from ..args import json_value
from .memory import Access, Memory
from .settings import McpSettings

log = logging.getLogger("engram.mcp")

# The SDK's own loggers say which request each message is, at INFO: engram's line per
# tool call is enough.
SDK_LOGGERS = ("mcp", "mcp_types", "sse_starlette")


@contextlib.contextmanager
def open_memory(settings: Settings, mcp: McpSettings) -> Iterator[Memory]:
    """The tools' services on the configured servers, closed on exit."""
    store = Store.connect(
        runtime.database_url(settings),
        migrate=False,
        max_connections=4,
        read_dsn=settings.database_read_url,
    )
    producer = Producer(
        runtime.connect_redis(runtime.redis_url(settings)),
        partitions=settings.worker.partitions,
        wait_replicas=settings.wait_replicas,
    )
    try:
        registry = wiring.registry(settings)
        default = wiring.load_embedder(settings.embedder, registry)
        wiring.settle(default)
        yield Memory(store, producer, embedder=registry.resolver(default), wait_s=mcp.wait_s)
    finally:
        producer.close()
        store.close()


def scope_of(value: str) -> Scope:
    if value == "-":
        raise InvalidRequestError("--scope cannot come from stdin: stdin carries the protocol")
    return Scope.of(json_value(value, "--scope"))


def client_config(settings: Settings, scope: Scope) -> dict[str, Any]:
    """What a desktop client (Claude Desktop, Cursor) needs to start this server from
    wherever it runs, outside any shell or virtual environment: this interpreter by its
    absolute path (``python -m engram``) and this home by its absolute path."""
    return {
        "mcpServers": {
            "engram": {
                "command": sys.executable,
                "args": ["-m", "engram", "mcp", "--scope", json.dumps(scope.as_dict())],
                "env": {"ENGRAM_HOME": str(settings.home.resolve())},
            }
        }
    }


def cmd_mcp(settings: Settings, args: argparse.Namespace) -> int:
    if args.client_config:
        print(json.dumps(client_config(settings, scope_of(args.scope)), indent=2))
        return exits.OK
    try:
        from .server import Tools
    except ImportError as exc:  # the extra is not installed
        raise ConfigError(
            f"the MCP server needs the official SDK: pip install 'engram[mcp]' ({exc.name})"
        ) from None
    scope = scope_of(args.scope)
    mcp_settings = McpSettings.from_env()
    for name in SDK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # One stdio process is one client's connection: its derived operation ids are bound
    # to it (engram.mcp.opids).
    access = Access(scope, session=uuid.uuid4().hex)

    async def serve() -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read_stream, write_stream):
            with contextlib.ExitStack() as stack:
                memory = await anyio.to_thread.run_sync(
                    lambda: stack.enter_context(open_memory(settings, mcp_settings))
                )
                tools = Tools(memory, lambda ctx: access, model=settings.llm is not None)
                server = tools.server()
                log.info("engram mcp: serving on stdio", extra={"tools": len(tools.offered)})
                await server.run(read_stream, write_stream, server.create_initialization_options())

    try:
        anyio.run(serve)
    except BaseExceptionGroup as group:
        # The transport's task group wraps what stopped the server (the database
        # unreachable, say): the command says that, as every engram command does.
        raise _cause(group) from None
    return exits.OK


def _cause(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _cause(first) if isinstance(first, BaseExceptionGroup) else first


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "mcp",
        help="serve memory to an agent over MCP (stdio), on one scope",
        description="The MCP server over stdio: the tools remember, recall, get, history,"
        " revise, retract, forget, operation (and extract with a model), all on the one"
        " scope given. See docs/agents.md.",
    )
    parser.add_argument(
        "--scope",
        required=True,
        help='the scope every tool acts on, JSON, e.g. \'{"user_id": "ada"}\'; @file.json'
        " reads a file",
    )
    parser.add_argument(
        "--client-config",
        action="store_true",
        help="print the mcpServers JSON a desktop client (Claude Desktop, Cursor) needs to"
        " start this server from anywhere (this Python and this home, by absolute paths),"
        " and exit",
    )
    parser.set_defaults(run=cmd_mcp)
