"""``engram web``: the dashboard and the JSON API, alone, against configured servers.

It finds PostgreSQL and Redis as the other commands do (DATABASE_URL and
REDIS_URL, else the run file of an ``engram up`` on this ENGRAM_HOME), binds
127.0.0.1 unless told otherwise, and refuses any other address without
ENGRAM_DASHBOARD_TOKEN. Without that token the operator's is the home's
(``web.signin``): every page and API call asks for it, on loopback too, unless
ENGRAM_DASHBOARD_OPEN serves a throwaway demo open. ``engram signin`` prints a
one-time sign-in link. ``build`` is what ``engram up`` can serve as well. With the
MCP SDK installed (``engram[mcp]``), the same server answers MCP at ``/mcp``, each
request with a scoped token (``engram.mcp.http``).

The listening socket is bound before the URL is said (``listen``): a port set
explicitly (``--port``, ENGRAM_DASHBOARD_PORT) and taken is refused; the default
one, if taken, gives way to a free one. ``engram up`` binds it itself and hands
it to each ``engram web`` child it starts (``--fd``), so the URL it prints is
served from the moment it is printed, and across the child's restarts.

A stop (SIGTERM, Ctrl-C) answers the requests that wait for a receipt (``?wait=``, an
MCP write) at once, as a wait that ran out: their operations stay queued. Whatever
still runs ``STOP_GRACE_S`` later is cancelled, so a stop never waits on a client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import redis
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from engram.jobs import reembed
from engram.jobs.settings import JobsSettings
from engram.store import Store
from engram.store.errors import ConfigError
from engram.store.vectors.embedders import EmbedderResolver
from engram.web import Services, WebConfig, create_app, signin
from engram.web.auth import Keys
from engram.web.origins import Hosts
from engram.web.state import WebState
from engram.worker.embedded import runfile, runtime
from engram.worker.producer import Producer
from engram.worker.settings import Settings

from . import jobs_redis, wiring
from .mcp.memory import Memory
from .mcp.settings import McpSettings

log = logging.getLogger("engram.web")

# How long a stop lets the requests in flight finish before it cancels them.
STOP_GRACE_S = 5


@contextlib.contextmanager
def build(
    settings: Settings,
    config: WebConfig,
    *,
    embedder: bool = True,
    stopping: threading.Event | None = None,
    jobs_client: redis.Redis | None = None,
) -> Iterator[ASGIApp]:
    """The app on connections to the configured servers, closed on exit: the dashboard,
    and ``/mcp`` beside it when the MCP SDK is installed. A jobs' Redis that cannot be
    named (``REDIS_URL`` a cluster, ``ENGRAM_JOBS_REDIS_URL`` unset) is a ``ConfigError``
    before anything is served; ``jobs_client`` is one the caller connected already (and
    closes). Once ``stopping`` is set, every wait for a receipt ends."""
    owns_jobs_client = jobs_client is None
    if jobs_client is None:
        jobs_client = jobs_redis.connect(settings)
    client = runtime.connect_redis(runtime.redis_url(settings))
    shared = jobs_redis.jobs_url(settings) == runtime.redis_url(settings)
    store = Store.connect(
        runtime.database_url(settings),
        migrate=False,
        max_connections=settings.db_pool_size,
        # With a token, every dashboard process signs cursors alike; without, its own key.
        cursor_key=Keys(config.token).cursor if config.needs_token else None,
        read_dsn=settings.database_read_url,  # the pages' reads, on a replica
        # Every statement a page sends is bounded (a 503 past it), both pools alike; what
        # an operator's action sets off in maintenance has its own, longer bound.
        statement_timeout_s=config.statement_timeout_s,
        admin_statement_timeout_s=config.admin_statement_timeout_s,
        # A token revoked on the dashboard goes to the ledger too (store.tokens).
        ledger=settings.ledger(),
    )
    producer = Producer(client, partitions=settings.worker.partitions, stopping=stopping)
    registry = wiring.registry(settings)
    reembed_settings = JobsSettings.from_env().reembed

    def start_reembed(model: str, requested_by: str) -> str:
        started = reembed.start(
            store,
            jobs_client,
            registry,
            model,
            requested_by=requested_by,
            settings=reembed_settings,
        )
        return started.job_id

    try:
        # Recall embeds its query with the active generation's model, whichever it is.
        default = wiring.load_embedder(settings.embedder, registry) if embedder else None
        wiring.settle(default)
        query_embedder = registry.resolver(default) if default is not None else None
        app = create_app(
            config,
            Services(
                store=store,
                redis=client,
                producer=producer,
                embedder=query_embedder,
                start_reembed=start_reembed,
                embedders=registry,
                jobs_redis=None if shared else jobs_client,
            ),
        )
        yield _with_mcp(app, settings, store, producer, query_embedder)
    finally:
        producer.close()
        store.close()
        if owns_jobs_client:
            jobs_client.close()


def _with_mcp(
    app: Starlette,
    settings: Settings,
    store: Store,
    producer: Producer,
    embedder: EmbedderResolver | None,
) -> ASGIApp:
    """``app`` with MCP at ``/mcp`` beside it, or ``app`` alone without the SDK."""
    try:
        from .mcp import http
    except ImportError:
        log.info("no MCP at /mcp: the SDK is not installed (pip install 'engram[mcp]')")
        return app
    mcp = McpSettings.from_env()
    memory = Memory(store, producer, embedder=embedder, wait_s=mcp.wait_s)
    web: WebState = app.state.web
    return http.mount(
        app,
        memory,
        mcp,
        model=settings.llm is not None,
        hosts=Hosts(web.config.hosts),
        limiter=web.limiter,
        oauth=web.oauth,
    )


def port_chosen(port: int | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the dashboard's port was set (``--port``, ENGRAM_DASHBOARD_PORT), not defaulted."""
    env = os.environ if env is None else env
    return port is not None or bool(env.get("ENGRAM_DASHBOARD_PORT"))


def listen(config: WebConfig, *, chosen: bool) -> tuple[socket.socket, WebConfig]:
    """The dashboard's listening socket, and the config naming the port it really has.

    A port that was ``chosen`` and is taken is a ``ConfigError``: serving elsewhere
    would break whoever was told that port. The default one, taken, gives way to a
    free port."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    try:
        sock = socket.create_server((config.host.strip("[]"), config.port), family=family)
    except OSError as exc:
        if chosen:
            raise ConfigError(
                f"the dashboard's port {config.port} on {config.host} is taken ({exc.strerror}):"
                " another program listens there; stop it, or set ENGRAM_DASHBOARD_PORT"
                " to a free port"
            ) from None
        sock = socket.create_server((config.host.strip("[]"), 0), family=family)
        log.warning(
            "the dashboard's default port is taken, serving on a free one",
            extra={"taken": config.port, "port": sock.getsockname()[1]},
        )
    sock = tcp(sock)
    return sock, dataclasses.replace(config, port=int(sock.getsockname()[1]))


def tcp(sock: socket.socket) -> socket.socket:
    """``sock`` named a TCP socket (``socket.create_server`` leaves its protocol 0).
    asyncio sets TCP_NODELAY only on connections whose protocol says TCP: without it,
    a keep-alive request waited for the client's delayed ACK, 40 ms and more each."""
    return socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())


def inherited(fd: int, config: WebConfig) -> tuple[socket.socket, WebConfig]:
    """The listening socket ``engram up`` bound and passed down as ``fd``."""
    sock = socket.socket(fileno=fd)
    return sock, dataclasses.replace(config, port=int(sock.getsockname()[1]))


class _NoColour(logging.Filter):
    """uvicorn adds a coloured copy of each message as a field: one copy is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)
        return True


def dashboard_config(
    settings: Settings, *, host: str | None = None, port: int | None = None
) -> WebConfig:
    """The dashboard's settings, its operator token the home's unless
    ENGRAM_DASHBOARD_TOKEN (or ENGRAM_DASHBOARD_OPEN) says otherwise."""
    config = WebConfig.from_env(
        host=host,
        port=port,
        partitions=settings.worker.partitions,
        lease_ttl_ms=settings.worker.lease_ttl_ms,
        home_token=lambda: signin.home_token(settings.home),
    )
    # The home, where the overview looks for the databases restores set aside.
    return dataclasses.replace(config, home=Path(settings.home))


def sign_in_said(config: WebConfig, *, terminal: bool, signin_command: str) -> str:
    """How the operator signs in, for a banner: a one-time link to a terminal (never to
    an output that may be a log), else the command that prints one."""
    if config.open:
        return "none: OPEN, whoever reaches the port is the operator (ENGRAM_DASHBOARD_OPEN)"
    if not config.home_token or config.token is None:
        return "with ENGRAM_DASHBOARD_TOKEN"
    if terminal:
        return signin.link(config.url, config.token) + "  (one use)"
    return f"`{signin_command}` prints a one-time link (this output is no terminal)"


def warn_if_open(config: WebConfig) -> None:
    if config.open:
        log.warning(
            "the dashboard is served OPEN (ENGRAM_DASHBOARD_OPEN): whoever reaches its port"
            " is the operator, until a scoped token is live; for a throwaway demo only",
            extra={"url": config.url},
        )


def cmd_web(settings: Settings, args: argparse.Namespace) -> int:
    config = dashboard_config(settings, host=args.host, port=args.port)
    logging.getLogger("uvicorn.error").addFilter(_NoColour())
    # The jobs' Redis first: one that cannot be named is refused before a port is bound
    # (or a taken default one is said to give way), so the refusal is all that is said.
    with jobs_redis.opened(settings) as jobs_client:
        if args.fd is not None:
            sock, config = inherited(args.fd, config)
        else:
            sock, config = listen(config, chosen=port_chosen(args.port))
            said = sign_in_said(
                config,
                terminal=sys.stdout.isatty(),
                signin_command=f"engram signin --url {config.url}",
            )
            print(f"engram dashboard: {config.url}\n  sign in: {said}", flush=True)
        warn_if_open(config)
        serve(settings, config, sock, jobs_client, embedder=not args.no_embedder)
    return 0


def cmd_signin(settings: Settings, args: argparse.Namespace) -> int:
    """Print a one-time sign-in link to the dashboard of this home's ``engram up`` (or
    at ``--url``)."""
    url = args.url or (runfile.read_live(settings.home) or {}).get("dashboard_url")
    if not url:
        raise ConfigError(
            "no dashboard to sign in to: start `engram up` on this ENGRAM_HOME"
            f" ({settings.home.resolve()}), or pass --url (where `engram web` serves)"
        )
    config = dashboard_config(settings)
    if config.token is None:
        raise ConfigError("ENGRAM_DASHBOARD_OPEN is set: that dashboard has no sign-in")
    print(signin.link(str(url), config.token), flush=True)
    return 0


def serve(
    settings: Settings,
    config: WebConfig,
    sock: socket.socket,
    jobs_client: redis.Redis,
    *,
    embedder: bool,
) -> None:
    """Serve the app on ``sock`` until told to stop (SIGTERM, SIGINT)."""
    stopping = threading.Event()
    with (
        sock,
        build(
            settings, config, embedder=embedder, stopping=stopping, jobs_client=jobs_client
        ) as app,
    ):
        server = _QuietServer(
            stopping,
            uvicorn.Config(
                app,
                # Ours logs ids only; uvicorn's would log query strings (search text).
                access_log=False,
                log_config=None,
                server_header=False,
                # X-Forwarded-* believed from the configured TLS proxies only.
                proxy_headers=bool(config.trusted_proxies),
                forwarded_allow_ips=list(config.trusted_proxies) or None,
                # The MCP session manager's task group lives as long as the server.
                lifespan="auto",
                timeout_graceful_shutdown=STOP_GRACE_S,
            ),
        )
        # A log line, not a print: under ``engram up`` (which prints the URL in its
        # banner) the children log warnings only.
        log.info(
            "engram dashboard: " + config.url,
            extra={"token": "required" if config.needs_token else "none (ENGRAM_DASHBOARD_OPEN)"},
        )
        server.run(sockets=[sock])


class _QuietServer(uvicorn.Server):
    """uvicorn's main loop wakes ten times a second to see whether it should stop
    (and once a second refreshes its Date header): about 0.2% of a core for an idle
    dashboard, measured with bench/bench_idle.py. Once a second does both; a stop
    then takes up to a second longer.

    A stop sets ``stopping`` at once, so that the requests waiting for a receipt answer
    before uvicorn waits for them to end."""

    def __init__(self, stopping: threading.Event, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stopping = stopping

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stopping.set()
        super().handle_exit(sig, frame)

    async def main_loop(self) -> None:
        counter = 0  # uvicorn's tick count, in tenths of a second
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000
            await asyncio.sleep(1.0)


def register(sub: Any) -> None:
    web = sub.add_parser("web", help="serve the dashboard and the JSON API")
    web.add_argument("--host", default=None, help="default: ENGRAM_DASHBOARD_HOST, else 127.0.0.1")
    web.add_argument(
        "--port", type=int, default=None, help="default: ENGRAM_DASHBOARD_PORT, else 8700"
    )
    # The listening socket ``engram up`` bound and passed down.
    web.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    web.add_argument(
        "--no-embedder",
        action="store_true",
        help="do not load the embedder: recall in the dashboard is then by text only",
    )
    web.set_defaults(run=cmd_web)
    link = sub.add_parser(
        "signin",
        help="print a one-time sign-in link to the dashboard (that of this home's engram up)",
    )
    link.add_argument("--url", default=None, help="the dashboard's URL (default: the run file's)")
    link.set_defaults(run=cmd_signin)
