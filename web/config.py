"""The dashboard's settings, read once from the environment into a typed object.

The operator authenticates by default: with ENGRAM_DASHBOARD_TOKEN, with the token
of the home (``engram up`` and ``engram web`` pass it), or, for a throwaway local
demo and only when asked (ENGRAM_DASHBOARD_OPEN), not at all."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engram.jobs import keys as jobs_keys
from engram.store.env import Env
from engram.store.errors import ConfigError
from engram.worker import defaults as worker_defaults

from .oauth import OAuthSettings
from .ratelimit import RateLimits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700
# Job queues the jobs page shows when ENGRAM_JOB_QUEUES does not say.
DEFAULT_JOB_QUEUES = jobs_keys.QUEUES
# A token shorter than this is refused: it would be guessable.
MIN_TOKEN_CHARS = 16
# Request bodies: an operation may be as large as a stream entry; a form is small.
MAX_JSON_BYTES = worker_defaults.MAX_ENTRY_BYTES
MAX_FORM_BYTES = 64 * 1024
# ``?wait=`` longer than this is refused (a waiting request holds no thread, but a
# connection).
MAX_WAIT_S = 30.0
SESSION_TTL_S = 12 * 3600
# Every statement a page or an API call sends is cancelled past this
# (ENGRAM_WEB_STATEMENT_TIMEOUT): a 503 statement_timeout, not a thread held. The long
# maintenance an operator sets off (a re-embedding's start, a generation's cancel: they
# purge what retired generations left and count the store) has its own bound
# (ENGRAM_WEB_ADMIN_STATEMENT_TIMEOUT).
STATEMENT_TIMEOUT_S = 5.0
ADMIN_STATEMENT_TIMEOUT_S = 300.0
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class WebConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = field(default=None, repr=False)
    # No operator token, on purpose (ENGRAM_DASHBOARD_OPEN, loopback only): whoever
    # reaches the port is the operator ``local``, while no scoped token is live.
    open: bool = False
    # The token is the home's own (``engram.web.signin.home_token``): sign-in links
    # may be printed for it to its owner.
    home_token: bool = False
    partitions: int = worker_defaults.PARTITIONS
    lease_ttl_ms: int = worker_defaults.LEASE_TTL_MS
    job_queues: tuple[str, ...] = DEFAULT_JOB_QUEUES
    # Host headers accepted. Empty: the loopback names when bound to loopback
    # (a DNS-rebinding page cannot reach a token-less dashboard), any otherwise.
    allowed_hosts: tuple[str, ...] = field(default=())
    max_json_bytes: int = MAX_JSON_BYTES
    max_form_bytes: int = MAX_FORM_BYTES
    max_wait_s: float = MAX_WAIT_S
    session_ttl_s: int = SESSION_TTL_S
    # The TLS proxies in front (IPs): only their X-Forwarded-Proto / -For are believed
    # (uvicorn's proxy_headers), so behind one the cookies are Secure and HSTS is sent.
    trusted_proxies: tuple[str, ...] = field(default=())
    # None: no bound (``off``).
    statement_timeout_s: float | None = STATEMENT_TIMEOUT_S
    admin_statement_timeout_s: float | None = ADMIN_STATEMENT_TIMEOUT_S
    # What a scoped token may do per minute, on the API and over MCP (web.ratelimit).
    rate_limits: RateLimits = field(default_factory=RateLimits)
    # ENGRAM_HOME, where the overview looks for the databases restores set aside.
    home: Path | None = None
    # The authorization server whose access tokens /mcp and /api/v1 take (web.oauth);
    # None: engram's own tokens only.
    oauth: OAuthSettings | None = None

    @property
    def retry_after_s(self) -> int:
        """What a 503 statement_timeout tells the client to wait: the bound, at least 1 s."""
        return max(1, math.ceil(self.statement_timeout_s or 1))

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"ENGRAM_DASHBOARD_TOKEN must be at least {MIN_TOKEN_CHARS} characters"
            )
        if not is_loopback(self.host) and self.token is None:
            raise ConfigError(
                f"refusing to serve the dashboard on {self.host}, which is not a loopback "
                "address, without ENGRAM_DASHBOARD_TOKEN: set a token (every page and API call "
                "will then need it), or bind 127.0.0.1"
            )
        if self.open and self.token is not None:
            raise ConfigError(
                "ENGRAM_DASHBOARD_OPEN serves the dashboard without a token: it cannot go"
                " with ENGRAM_DASHBOARD_TOKEN; set one or the other"
            )
        if self.token is None and not self.open:
            raise ConfigError(
                "the dashboard needs an operator token: ENGRAM_DASHBOARD_TOKEN, or the home's"
                " (engram up and engram web make one), or ENGRAM_DASHBOARD_OPEN=on for a"
                " throwaway local demo"
            )
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ConfigError(
                    "ENGRAM_DASHBOARD_TRUSTED_PROXIES lists IP addresses or networks"
                    " (comma-separated)"
                ) from None
        if not 0 < self.port < 65536:
            raise ConfigError("the port must be between 1 and 65535")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def needs_token(self) -> bool:
        return self.token is not None

    @property
    def hosts(self) -> tuple[str, ...]:
        if self.allowed_hosts:
            return self.allowed_hosts
        if is_loopback(self.host):
            return ("127.0.0.1", "localhost", "::1", "[::1]")
        return ("*",)

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        partitions: int = worker_defaults.PARTITIONS,
        lease_ttl_ms: int = worker_defaults.LEASE_TTL_MS,
        home_token: Callable[[], str] | None = None,
    ) -> WebConfig:
        """The settings of the environment. Without ENGRAM_DASHBOARD_TOKEN or
        ENGRAM_DASHBOARD_OPEN, on loopback, the operator's token is ``home_token()`` (the
        home's, which ``engram up`` and ``engram web`` pass); otherwise there is none: a
        ``ConfigError``."""
        read = Env(env)
        host = host or read.text("ENGRAM_DASHBOARD_HOST", DEFAULT_HOST)
        token = read.optional("ENGRAM_DASHBOARD_TOKEN")
        opened = read.switch("ENGRAM_DASHBOARD_OPEN", False)
        # Any other address is served with a token its operator chose, never by default.
        from_home = token is None and not opened and home_token is not None and is_loopback(host)
        # Every setting is read and checked before the home's token is made: a refused
        # one leaves no home behind (checked as if open, which the home's token replaces).
        config = cls(
            host=host,
            port=port or read.integer("ENGRAM_DASHBOARD_PORT", DEFAULT_PORT),
            token=token,
            open=opened or from_home,
            partitions=partitions,
            lease_ttl_ms=lease_ttl_ms,
            job_queues=read.items("ENGRAM_JOB_QUEUES", ()) or DEFAULT_JOB_QUEUES,
            allowed_hosts=read.items("ENGRAM_DASHBOARD_HOSTS", ()),
            trusted_proxies=read.items("ENGRAM_DASHBOARD_TRUSTED_PROXIES", ()),
            statement_timeout_s=read.duration_or_off(
                "ENGRAM_WEB_STATEMENT_TIMEOUT", STATEMENT_TIMEOUT_S
            ),
            admin_statement_timeout_s=read.duration_or_off(
                "ENGRAM_WEB_ADMIN_STATEMENT_TIMEOUT", ADMIN_STATEMENT_TIMEOUT_S
            ),
            rate_limits=RateLimits.from_env(env),
            oauth=OAuthSettings.from_env(env),
        )
        if not from_home or home_token is None:
            return config
        return dataclasses.replace(config, token=home_token(), open=False, home_token=True)
