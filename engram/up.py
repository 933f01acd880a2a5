"""``engram up``: the embedded servers (unless configured), the schema, and the workers.

With no ``DATABASE_URL`` it starts the embedded PostgreSQL, with no
``REDIS_URL`` the embedded valkey-server, both under ``ENGRAM_HOME``, which it
owns for as long as it runs (one ``up`` per home; see ``home``). Its children and
the commands of the home reach both through their Unix sockets, never TCP (the run
file also names valkey's TCP URL, ``redis_tcp_url``, for other clients). With a
``REDIS_URL`` naming a Redis Cluster and no ``ENGRAM_JOBS_REDIS_URL``, the
embedded valkey-server is the jobs' (RQ cannot use a cluster): ``up`` then runs
with nothing more to set, as it does everywhere else, and its children and the
commands of the home find it (``ENGRAM_JOBS_REDIS_URL``, the run file). It migrates,
runs the workers under a ``Supervisor`` (restarting one that dies), prints
where everything is (and how the operator signs in to the dashboard, whose token is
the home's unless ENGRAM_DASHBOARD_TOKEN is set: a one-time link to a terminal, the
command that prints one to anything else), then logs one line per change of state. On Ctrl-C,
SIGTERM or SIGHUP it stops the workers (each finishes its batch in hand), then
the servers, and says ``stopped``. Killed outright, its watchdog and the
kernel stop everything it started instead.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from engram.store import Store
from engram.store import backup as backups
from engram.store.errors import EngramError, InvalidRequestError
from engram.store.masking import mask_url
from engram.store.server import EmbeddedPostgres
from engram.web.config import WebConfig
from engram.worker import cluster
from engram.worker.consuming.stopping import StopRequest
from engram.worker.embedded import runtime
from engram.worker.embedded.valkey import EmbeddedValkey
from engram.worker.settings import Settings

from . import jobs_redis, web_cli
from .home import UP, HomeSession
from .procs import ProcessRecord
from .supervisor import ChildSpec, ServerWatch, Supervisor

log = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How often ``up`` reads the embedded server's WAL archiving (``ArchiveWatch``).
ARCHIVE_CHECK_S = 15.0


def worker_specs(count: int, log_level: str) -> list[ChildSpec]:
    """``count`` stream workers; their per-partition chatter stays below ``up``'s level."""
    return [ChildSpec(f"worker-{i}", _engram(log_level, "worker")) for i in range(count)]


def jobs_spec(log_level: str) -> ChildSpec:
    """The RQ jobs worker with its scheduler (``engram jobs``): reembed, retention, and
    the forget listeners the stream workers hand over. SIGTERM lets the job in hand end."""
    return ChildSpec("jobs", _engram(log_level, "jobs"), stop_timeout_s=120.0)


def web_spec(log_level: str, listener: socket.socket) -> ChildSpec:
    """The dashboard and the JSON API (``engram web``), on the servers ``up`` runs, serving
    the socket ``up`` bound (kept open by ``up``: a restarted child serves the same port)."""
    fd = listener.fileno()
    return ChildSpec("web", _engram(log_level, "web", "--fd", str(fd)), pass_fds=(fd,))


def _engram(log_level: str, *command: str) -> list[str]:
    return [sys.executable, "-m", "engram", "--log-level", child_log_level(log_level), *command]


def child_log_level(level: str) -> str:
    """Children log warnings and errors only, unless ``up`` itself logs at DEBUG:
    ``up`` reports their starts and exits, one line each."""
    return "DEBUG" if logging.getLevelName(level.upper()) == logging.DEBUG else "WARNING"


def run_up(
    settings: Settings,
    *,
    workers: int,
    demo: bool = False,
    web: bool = True,
    log_level: str = "INFO",
) -> int:
    if workers < 1:
        raise InvalidRequestError("--workers (ENGRAM_WORKERS) must be at least 1")
    # A dashboard that would refuse to start (another address without a token) stops
    # ``up`` before anything starts.
    dashboard = web_cli.dashboard_config(settings) if web else None
    session = HomeSession(settings.home, UP).open()  # or HomeInUseError
    stop = StopRequest()  # set by the signal handler: takes no lock

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS}
    # Whatever happens, everything stops in the reverse of its start: the children, then
    # valkey, then PostgreSQL, then the dashboard's socket and the home.
    with ExitStack() as stack:
        stack.callback(print, "engram: stopped", flush=True)
        stack.callback(_restore_signals, previous)
        stack.callback(session.close)
        default_port = dashboard.port if dashboard is not None else None
        listener: socket.socket | None = None
        if dashboard is not None:
            # Bound before anything else starts: a port set and taken stops ``up`` here.
            listener, dashboard = web_cli.listen(dashboard, chosen=web_cli.port_chosen())
            stack.callback(listener.close)
        servers = _start_servers(settings, session, stack)
        with Store.connect(servers.database_url):
            log.info("schema up to date")
        web_child = (
            (dashboard, listener) if dashboard is not None and listener is not None else None
        )
        supervisor = _start_children(
            servers, settings, session, stack, workers, log_level, web_child
        )
        _announce(settings, session, servers, workers, dashboard, default_port)
        if demo:
            _stream_demo(servers.redis_url, settings)
        watches: list[ServerWatch | ArchiveWatch] = [*servers.watches]
        if servers.postgres is not None and settings.backup_dir is not None:
            watches.append(ArchiveWatch(servers.database_url))
        _supervise(stop, watches, supervisor)
        log.info("stopping")
        return 0


@dataclass(frozen=True, slots=True)
class _Servers:
    """Where ``up``'s children find PostgreSQL, the streams' Redis and the jobs' Redis,
    and the embedded servers among them, watched."""

    database_url: str
    redis_url: str
    jobs_url: str
    postgres: EmbeddedPostgres | None
    valkey: EmbeddedValkey | None
    watches: list[ServerWatch]


def _start_servers(settings: Settings, session: HomeSession, stack: ExitStack) -> _Servers:
    """The embedded PostgreSQL (no ``DATABASE_URL``) and valkey (no ``REDIS_URL``, or a
    cluster and no jobs' Redis) started, each stopped by ``stack``."""
    watches: list[ServerWatch] = []
    postgres: EmbeddedPostgres | None = None
    database_url = settings.database_url
    if database_url is None:
        postgres = EmbeddedPostgres(settings.home, backup_dir=settings.backup_dir)
        watches.append(_stopped_and_watched(stack, session, "postgres", postgres))
        database_url = postgres.dsn()
    redis_url = settings.redis_url
    jobs_url = settings.jobs_redis_url
    if jobs_url is not None:
        jobs_redis.connect(settings).close()  # a cluster named for the jobs stops ``up``
    valkey: EmbeddedValkey | None = None
    if redis_url is None or (jobs_url is None and _is_cluster(redis_url)):
        valkey = EmbeddedValkey(settings.home).start()
        watches.append(_stopped_and_watched(stack, session, "valkey", valkey))
        # Its socket for everything of ours; its port only for clients given its URL.
        if redis_url is None:
            redis_url = valkey.socket_url
        else:  # the streams on a cluster, where RQ cannot run: the jobs here
            jobs_url = valkey.socket_url
    return _Servers(database_url, redis_url, jobs_url or redis_url, postgres, valkey, watches)


# How each embedded server is asked to stop, and how long it is given.
_SERVER_STOPS = {"postgres": (signal.SIGINT, 90.0), "valkey": (signal.SIGTERM, 30.0)}


def _stopped_and_watched(
    stack: ExitStack,
    session: HomeSession,
    name: str,
    server: EmbeddedPostgres | EmbeddedValkey,
) -> ServerWatch:
    """Have ``stack`` stop ``server``, record its process in the home, and watch it (a
    restart records its new pid)."""
    stack.callback(_stop, server, f"{name} stopped")
    signum, timeout_s = _SERVER_STOPS[name]
    _record(session, name, server.pid, signum, timeout_s)
    return ServerWatch(
        name, server, on_start=lambda pid: _record(session, name, pid, signum, timeout_s)
    )


def _start_children(
    servers: _Servers,
    settings: Settings,
    session: HomeSession,
    stack: ExitStack,
    workers: int,
    log_level: str,
    web: tuple[WebConfig, socket.socket] | None,
) -> Supervisor:
    """The stream workers, the jobs worker and the dashboard (``web``: its config and the
    socket ``up`` bound), started under a ``Supervisor`` that ``stack`` stops."""
    env = {
        **os.environ,
        "DATABASE_URL": servers.database_url,
        "REDIS_URL": servers.redis_url,
        "ENGRAM_JOBS_REDIS_URL": servers.jobs_url,
        "ENGRAM_HOME": str(settings.home),
    }
    specs = [*worker_specs(workers, log_level), jobs_spec(log_level)]
    if web is not None:
        dashboard, listener = web
        env["ENGRAM_DASHBOARD_PORT"] = str(dashboard.port)
        specs.append(web_spec(log_level, listener))
    supervisor = Supervisor(specs, env, on_start=session.record)
    stack.callback(_stop, supervisor, "workers stopped")
    supervisor.start()
    return supervisor


def _announce(
    settings: Settings,
    session: HomeSession,
    servers: _Servers,
    workers: int,
    dashboard: WebConfig | None,
    default_port: int | None,
) -> None:
    """Publish where everything is in the run file, and print it."""
    session.publish(
        database_url=servers.database_url,
        redis_url=servers.redis_url,
        jobs_redis_url=servers.jobs_url,
        **({"redis_tcp_url": servers.valkey.url} if servers.valkey else {}),
        workers=workers,
        **({"dashboard_url": dashboard.url} if dashboard else {}),
    )
    _print_where(
        settings,
        servers.database_url,
        (servers.redis_url, servers.jobs_url),
        servers.postgres,
        servers.valkey,
        workers,
        dashboard,
        default_port,
    )


class ArchiveWatch:
    """Says in ``up``'s log when the embedded server's WAL archiving starts failing (a
    segment it cannot archive: nothing after it is archived, so a restore cannot reach
    past it) and when it archives again. PostgreSQL says why in its own log only."""

    def __init__(self, database_url: str, *, every_s: float = ARCHIVE_CHECK_S) -> None:
        self.database_url = database_url
        self.every_s = every_s
        self._next = 0.0
        self._failing: str | None = None

    def check(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        try:
            with psycopg.connect(self.database_url, connect_timeout=2, autocommit=True) as conn:
                status = backups.archive_status(conn)
        except psycopg.Error:
            return  # the server's own watch says when it is down
        if status is not None and status.failing:
            if status.last_failed_wal != self._failing:
                log.error(
                    "WAL archiving fails: nothing after this file is archived (engram health"
                    " shows it; the PostgreSQL log says why)",
                    extra={"wal": status.last_failed_wal, "failed": status.failed},
                )
            self._failing = status.last_failed_wal
        elif self._failing is not None:
            archived = status.last_archived_wal if status is not None else None
            log.warning("WAL archiving works again", extra={"wal": archived})
            self._failing = None


def _supervise(
    stop: StopRequest, watches: list[ServerWatch | ArchiveWatch], supervisor: Supervisor
) -> None:
    """Until a stop is asked: restart a server or a child that died (or, a server's
    restarts spent, ``ServerGaveUpError``: everything stops)."""
    while not stop.wait(1.0):
        for watch in watches:
            watch.check()
        supervisor.check()


def _stop(running: Supervisor | EmbeddedPostgres | EmbeddedValkey, said: str) -> None:
    running.stop()
    log.info(said)


def _restore_signals(previous: dict[signal.Signals, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _record(session: HomeSession, name: str, pid: int | None, signum: int, timeout: float) -> None:
    if pid:
        session.record(ProcessRecord.of(name, pid, stop_signal=signum, stop_timeout_s=timeout))


def _is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (asked of the server, as the workers will)."""
    client = runtime.connect_redis(url)
    try:
        return cluster.is_cluster(client)
    finally:
        client.close()


def _print_where(
    settings: Settings,
    database_url: str,
    redis_urls: tuple[str, str],
    postgres: EmbeddedPostgres | None,
    valkey: EmbeddedValkey | None,
    workers: int,
    dashboard: WebConfig | None,
    default_port: int | None = None,
) -> None:
    redis_url, jobs_url = redis_urls
    pg = f"embedded, data in {postgres.data_dir}" if postgres else "DATABASE_URL"
    embedded = (
        f"embedded, data in {valkey.data_dir}; other clients: {mask_url(valkey.url)}"
        if valkey
        else ""
    )
    vk = embedded if valkey and valkey.socket_url == redis_url else "REDIS_URL"
    jobs = ""
    if jobs_url != redis_url:
        where = embedded if valkey and valkey.socket_url == jobs_url else "ENGRAM_JOBS_REDIS_URL"
        jobs = f"  jobs Redis  {mask_url(jobs_url)}  ({where}; RQ cannot use a cluster)\n"
    home = Path(settings.home).resolve()
    # The passwords stay in the run file, the owner's only; a terminal may be shared.
    web = ""
    if dashboard is not None:
        taken = f"; port {default_port} was taken" if dashboard.port != default_port else ""
        web = f"  dashboard   {dashboard.url}  (the JSON API: /api/v1{taken})\n"
        # The link only to a terminal: an output that is a file may be a log others read.
        said = web_cli.sign_in_said(
            dashboard, terminal=sys.stdout.isatty(), signin_command="engram signin"
        )
        web += f"  sign in     {said}\n"
    print(
        f"engram is up (ENGRAM_HOME={home}, pid {os.getpid()})\n"
        f"  PostgreSQL  {mask_url(database_url)}  ({pg})\n"
        f"  Redis       {mask_url(redis_url)}  ({vk})\n"
        + jobs
        + f"  workers     {workers} x `engram worker`, "
        f"{settings.worker.partitions} partition streams\n"
        "  jobs        `engram jobs`: reembed, retention, redaction listeners\n"
        + web
        + f"  run file    {home / 'run.json'}\n"
        'try:  engram enqueue remember --scope \'{"user_id": "ada"}\' '
        '--request \'{"text": "Ada lives in London."}\' --wait 10\n'
        "Ctrl-C stops everything.",
        flush=True,
    )


def _stream_demo(redis_url: str, settings: Settings) -> None:
    """Remember then revise through the streams, and print the receipts."""
    from engram.worker.producer import Producer

    with Producer.from_url(redis_url, partitions=settings.worker.partitions) as producer:
        scope = {"user_id": "engram-demo"}
        first = producer.remember(
            scope, "The demo user lives in London.", operation_id="demo:stream:remember:1"
        ).wait(60)
        print(
            f"demo: {first.kind} -> {[r.as_dict() for r in first.records]}"
            f" (scope revision {first.scope_revision}, replayed {first.replayed})",
            flush=True,
        )
        record_id = first.records[0].id
        second = producer.revise(
            scope,
            record_id,
            text="The demo user lives in Paris.",
            expected_revision=1,
            operation_id="demo:stream:revise:1",
        )
        try:
            receipt = second.wait(60)
            print(f"demo: revise -> {[r.as_dict() for r in receipt.records]}", flush=True)
        except EngramError as exc:  # e.g. a revision conflict
            print(f"demo: revise -> {type(exc).__name__}", flush=True)
