"""Redis Cluster support: reading a ``REDIS_URL``, opening the client it names (one
server or a cluster, told by the server itself), and running a Lua script in a
pipeline either way.

A URL names one node, ``redis://user:password@host:port/0``: if that server says
``cluster_enabled:1`` (``INFO cluster``) the client is a ``redis.cluster.RedisCluster``,
which finds the other nodes from it. A URL may also list several seed nodes, for a
cluster whose first node may be down: ``redis://user:password@h1:p1,h2:p2,h3:p3/0``
(always a cluster). A cluster has one database, 0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.exceptions import RedisClusterException

from engram.store.errors import ConfigError

log = logging.getLogger(__name__)

# Whatever a call to Redis raises when Redis, or the cluster, fails: redis-py's errors,
# and its cluster client's own (no node known for a slot while a failover is under
# way: ``SlotNotCoveredError``), which are not ``RedisError``s.
REDIS_FAILURES = (redis.RedisError, RedisClusterException)

_SCHEMES = ("redis", "rediss", "unix")
# How long the probe of a one-node URL waits for the server to say what it is.
_PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ParsedUrl:
    """What a ``REDIS_URL`` names: the nodes, the credentials, the database."""

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int

    @property
    def several(self) -> bool:
        return len(self.hosts) > 1


def parse_url(url: str) -> ParsedUrl:
    """The URL's parts; ``ConfigError`` (never a traceback) for one that is not a Redis
    URL. The password is never quoted in the error."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError("REDIS_URL must look like redis://user:password@host:port/0")
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ConfigError(f"REDIS_URL scheme must be one of {', '.join(_SCHEMES)}")
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    username, password = _credentials(userinfo) if at else (None, None)
    if parts.scheme == "unix":
        return ParsedUrl("unix", (), username, password, _db(parts.path, parts.query, unix=True))
    hosts = tuple(_host_port(h) for h in hostlist.split(","))
    return ParsedUrl(parts.scheme, hosts, username, password, _db(parts.path, parts.query))


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if colon else None)


def _host_port(text: str) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6 address]:port``; the port defaults to 6379."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest or "6379"
    else:
        host, colon, port = text.partition(":")
        port = port if colon else "6379"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"REDIS_URL: {text!r} is not host:port")
    return host, int(port)


def _db(path: str, query: str, *, unix: bool = False) -> int:
    # A unix URL's path is the socket's: its database, if any, is ?db=N.
    raw = (parse_qs(query).get("db") or ["0"])[0] if unix else path.strip("/") or "0"
    if not raw.isdigit():
        raise ConfigError(f"REDIS_URL: database {raw!r} is not a number")
    return int(raw)


def open_client(url: str, **options: Any) -> redis.Redis:
    """The client ``url`` names, with ``options`` (timeouts...): a ``RedisCluster`` for a
    cluster (typed as ``redis.Redis``: the commands engram uses are the same; the
    few places that differ ask ``is_cluster``), else a ``redis.Redis``.

    A one-node URL whose server cannot be reached now gives a one-server client, as
    before clusters were supported: name a cluster by several seeds to be sure."""
    parsed = parse_url(url)
    if parsed.several:
        return _cluster(parsed, options)
    try:
        single = redis.Redis.from_url(url, **options)
    except ValueError as exc:  # what redis-py refuses in a URL that looked right
        raise ConfigError(f"REDIS_URL is not usable: {str(exc)[:200]}") from None
    if parsed.scheme != "unix" and _cluster_enabled(url):
        single.close()
        return _cluster(parsed, options)
    return single


def _cluster_enabled(url: str) -> bool:
    probe = redis.Redis.from_url(
        url, socket_timeout=_PROBE_TIMEOUT_S, socket_connect_timeout=_PROBE_TIMEOUT_S
    )
    try:
        return bool(probe.info("cluster").get("cluster_enabled"))
    except redis.RedisError as exc:
        log.warning(
            "could not ask Redis whether it is a cluster; using it as one server",
            extra={"error": type(exc).__name__},
        )
        return False
    finally:
        probe.close()


def _cluster(parsed: ParsedUrl, options: dict[str, Any]) -> redis.Redis:
    if parsed.db != 0:
        raise ConfigError("a Redis Cluster has database 0 only: end REDIS_URL with /0")
    if parsed.scheme == "unix":
        raise ConfigError("a Redis Cluster is reached over TCP: redis:// or rediss://")
    try:
        client = RedisCluster(
            startup_nodes=[_node(host, port) for host, port in parsed.hosts],
            username=parsed.username,
            password=parsed.password,
            ssl=parsed.scheme == "rediss",
            **{k: v for k, v in options.items() if k != "health_check_interval"},
        )
    except RedisClusterException:
        # Not a RedisError: the callers' "Redis unavailable" handling would miss it.
        raise redis.ConnectionError(
            f"no node of the Redis Cluster answered (tried {len(parsed.hosts)})"
        ) from None
    return cast(redis.Redis, client)


def _node(host: str, port: int) -> ClusterNode:
    make: Any = ClusterNode  # redis-py leaves its constructor unannotated
    return cast(ClusterNode, make(host, port))


def is_cluster(client: Any) -> bool:
    """Whether ``client`` (or a pipeline of one) talks to a Redis Cluster."""
    return isinstance(client, RedisCluster)


def run_script(script: Any, keys: list[str], args: list[Any], pipe: Any) -> None:
    """Queue ``script`` in ``pipe``. A cluster pipeline refuses ``EVALSHA`` (it could
    not load a script a node lacks): there the script's text goes with ``EVAL``."""
    if isinstance(pipe, ClusterPipeline):
        cluster_pipe: Any = pipe  # its execute_command is unannotated
        cluster_pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    else:
        script(keys=keys, args=args, client=pipe)
