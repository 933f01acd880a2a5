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
where everything is, then logs one line per change of state. On Ctrl-C,
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
from pathlib import Path
from types import FrameType

from engram.store import Store
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
    dashboard = _dashboard_config() if web else None
    session = HomeSession(settings.home, UP).open()  # or HomeInUseError
    stop = StopRequest()  # set by the signal handler: takes no lock

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS}
    postgres: EmbeddedPostgres | None = None
    valkey: EmbeddedValkey | None = None
    supervisor: Supervisor | None = None
    listener: socket.socket | None = None
    watches: list[ServerWatch] = []
    try:
        default_port = dashboard.port if dashboard is not None else None
        if dashboard is not None:
            # Bound before anything else starts: a port set and taken stops ``up`` here.
            listener, dashboard = web_cli.listen(dashboard, chosen=web_cli.port_chosen())
        database_url = settings.database_url
        if database_url is None:
            postgres = EmbeddedPostgres(settings.home, backup_dir=settings.backup_dir)
            _record(session, "postgres", postgres.pid, signal.SIGINT, 90.0)
            database_url = postgres.dsn()
            watches.append(
                ServerWatch(
                    "postgres",
                    postgres,
                    on_start=lambda pid: _record(session, "postgres", pid, signal.SIGINT, 90.0),
                )
            )
        redis_url = settings.redis_url
        jobs_url = settings.jobs_redis_url
        if jobs_url is not None:
            jobs_redis.connect(settings).close()  # a cluster named for the jobs stops ``up``
        if redis_url is None or (jobs_url is None and _is_cluster(redis_url)):
            valkey = EmbeddedValkey(settings.home).start()
            _record(session, "valkey", valkey.pid, signal.SIGTERM, 30.0)
            watches.append(
                ServerWatch(
                    "valkey",
                    valkey,
                    on_start=lambda pid: _record(session, "valkey", pid, signal.SIGTERM, 30.0),
                )
            )
            # Its socket for everything of ours; its port only for clients given its URL.
            if redis_url is None:
                redis_url = valkey.socket_url
            else:  # the streams on a cluster, where RQ cannot run: the jobs here
                jobs_url = valkey.socket_url
        jobs_url = jobs_url or redis_url
        with Store.connect(database_url):
            log.info("schema up to date")
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "ENGRAM_JOBS_REDIS_URL": jobs_url,
            "ENGRAM_HOME": str(settings.home),
        }
        specs = [*worker_specs(workers, log_level), jobs_spec(log_level)]
        if dashboard is not None and listener is not None:
            env["ENGRAM_DASHBOARD_PORT"] = str(dashboard.port)
            specs.append(web_spec(log_level, listener))
        supervisor = Supervisor(specs, env, on_start=session.record)
        supervisor.start()
        session.publish(
            database_url=database_url,
            redis_url=redis_url,
            jobs_redis_url=jobs_url,
            **({"redis_tcp_url": valkey.url} if valkey else {}),
            workers=workers,
            **({"dashboard_url": dashboard.url} if dashboard else {}),
        )
        _print_where(
            settings,
            database_url,
            (redis_url, jobs_url),
            postgres,
            valkey,
            workers,
            dashboard,
            default_port,
        )
        if demo:
            _stream_demo(redis_url, settings)
        while not stop.wait(1.0):
            for watch in watches:
                watch.check()  # or ServerGaveUpError: everything stops
            supervisor.check()
        log.info("stopping")
        return 0
    finally:
        if supervisor is not None:
            supervisor.stop()
            log.info("workers stopped")
        if valkey is not None:
            valkey.stop()
            log.info("valkey stopped")
        if postgres is not None:
            postgres.stop()
            log.info("postgres stopped")
        if listener is not None:
            listener.close()
        session.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        print("engram: stopped", flush=True)


def _dashboard_config() -> WebConfig:
    return WebConfig.from_env()


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
