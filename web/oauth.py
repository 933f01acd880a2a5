"""engram as an OAuth 2.1 resource server (issue 39), beside its own ``egt_`` tokens.

When the operator names an authorization server (``ENGRAM_OAUTH_ISSUER``), ``/mcp``
and ``/api/v1`` also take its access tokens: JWTs checked with PyJWT against the
issuer's keys (its JWKS, found through its metadata or ``ENGRAM_OAUTH_JWKS_URL``), its
``iss``, an ``aud`` naming this server (RFC 8707: ``ENGRAM_OAUTH_AUDIENCE``, the URL
clients reach ``/mcp`` at), ``exp`` and ``nbf``, and an algorithm of the allowed ones
(never ``none`` nor an HMAC one, whose key would be public). A claim, or a template
over claims (``ENGRAM_OAUTH_SCOPE_CLAIM``), names the engram scope; the token's OAuth
scopes (``engram:recall``, ...) name its capabilities. A verified token acts through
the very paths an ``egt_`` token does (``Tokens.principal`` gives it a grant of its
own), so its scope, capabilities, rate limits and read log hold the same way.

What a client following the MCP authorization spec needs is served too: the
Protected Resource Metadata (RFC 9728) at ``/.well-known/oauth-protected-resource``
(and its path-suffixed form for ``/mcp``), and ``WWW-Authenticate: Bearer
resource_metadata=...`` on a 401 (``error="invalid_token"`` when a token was sent),
``error="insufficient_scope", scope=...`` on a 403 for a missing capability.

The issuer's keys are cached (``KeySet``): a token signed by a key not in the cache
(a rotation at the issuer) fetches them again, at most once per
``ENGRAM_OAUTH_JWKS_REFRESH`` whoever asks, so a token holder sending made-up key ids
cannot make engram hammer the issuer; a request whose key is cached never waits for a
fetch. A token is never logged, stored or passed on.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt

from engram.store.env import Env
from engram.store.errors import ConfigError, EngramError
from engram.store.tokens import CAPABILITIES, Grant, Tokens
from engram.store.values import SCOPE_FIELDS, Scope

from .errors import ForbiddenError, UnauthorizedError, UnavailableError

log = logging.getLogger("engram.web.oauth")

METADATA_PATH = "/.well-known/oauth-protected-resource"
# The algorithms a token may be signed with: asymmetric ones only. ``none`` and the HMAC
# ones (HS256...) are never accepted: the issuer's keys are public.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
ALGORITHMS = ("RS256", "ES256")
SCOPE_PREFIX = "engram:"
SCOPE_FIELD = "user_id"
# Unknown key ids fetch the issuer's keys again at most this often (a rotation is
# picked up this soon); the cached keys are fetched again when this old anyway.
JWKS_REFRESH_S = 60.0
JWKS_MAX_AGE_S = 3600.0
# Clock skew allowed on exp/nbf/iat.
LEEWAY_S = 30.0
FETCH_TIMEOUT_S = 5.0
MAX_FETCH_BYTES = 512 * 1024
# A bearer longer than this is no access token of ours: refused before any parsing.
MAX_TOKEN_CHARS = 16 * 1024
# The settings that go with ENGRAM_OAUTH_ISSUER (one set without it is a mistake).
SETTINGS = (
    "ENGRAM_OAUTH_AUDIENCE",
    "ENGRAM_OAUTH_SCOPE_CLAIM",
    "ENGRAM_OAUTH_SCOPE_FIELD",
    "ENGRAM_OAUTH_SCOPE_PREFIX",
    "ENGRAM_OAUTH_JWKS_URL",
    "ENGRAM_OAUTH_ALGORITHMS",
    "ENGRAM_OAUTH_JWKS_REFRESH",
    "ENGRAM_OAUTH_LEEWAY",
)
_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_CLAIM = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")


class InvalidTokenError(UnauthorizedError):
    """An access token refused (RFC 6750 ``invalid_token``): malformed, signed by no key
    of the issuer or with an algorithm not allowed, another issuer's or audience's,
    expired or not yet valid, without the claim naming its scope, or its principal
    revoked. An ``unauthorized`` (401) to the caller."""

    oauth_error = "invalid_token"


class InsufficientScopeError(ForbiddenError):
    """A verified token without the capability asked for (RFC 6750
    ``insufficient_scope``): a ``forbidden`` (403) whose challenge names the scope."""

    def __init__(self, message: str, *, capability: str | None = None) -> None:
        super().__init__(message)
        self.capability = capability


def _url(name: str, value: str) -> str:
    """An https URL (http only on a loopback host), without query or fragment."""
    parts = urlsplit(value)
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if (
        parts.scheme not in ("https", "http")
        or not parts.hostname
        or (parts.scheme == "http" and not loopback)
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(
            f"{name} must be an https URL (http only on a loopback host) without a query"
            f" or fragment, got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class OAuthSettings:
    """The operator's authorization server, and how its tokens map onto engram."""

    issuer: str
    audience: str
    scope_claim: str = "sub"
    scope_field: str = SCOPE_FIELD
    scope_prefix: str = SCOPE_PREFIX
    jwks_url: str | None = None
    algorithms: tuple[str, ...] = ALGORITHMS
    jwks_refresh_s: float = JWKS_REFRESH_S
    leeway_s: float = LEEWAY_S

    def __post_init__(self) -> None:
        _url("ENGRAM_OAUTH_ISSUER", self.issuer)
        _url("ENGRAM_OAUTH_AUDIENCE", self.audience)
        if self.jwks_url is not None:
            _url("ENGRAM_OAUTH_JWKS_URL", self.jwks_url)
        claims = self.claims
        if not claims or any(not _CLAIM.fullmatch(c) for c in claims):
            raise ConfigError(
                "ENGRAM_OAUTH_SCOPE_CLAIM is a claim's name (sub) or a template over claims"
                " ({org}/{sub}): names of letters, digits, _ . : -"
            )
        if self.scope_field not in SCOPE_FIELDS:
            raise ConfigError(f"ENGRAM_OAUTH_SCOPE_FIELD is one of {', '.join(SCOPE_FIELDS)}")
        refused = [a for a in self.algorithms if a not in ASYMMETRIC]
        if refused or not self.algorithms:
            raise ConfigError(
                f"ENGRAM_OAUTH_ALGORITHMS may list {', '.join(ASYMMETRIC)}"
                + (f"; not {', '.join(refused)}" if refused else "")
            )
        if not 0 <= self.jwks_refresh_s <= 86_400:
            raise ConfigError("ENGRAM_OAUTH_JWKS_REFRESH must be from 0 to a day")
        if not 0 <= self.leeway_s <= 300:
            raise ConfigError("ENGRAM_OAUTH_LEEWAY must be from 0 to 5 minutes")

    @property
    def claims(self) -> tuple[str, ...]:
        """The claims the scope's template reads."""
        if "{" not in self.scope_claim and "}" not in self.scope_claim:
            return (self.scope_claim,)
        rest = _PLACEHOLDER.sub("", self.scope_claim)
        if "{" in rest or "}" in rest:
            return ()
        return tuple(_PLACEHOLDER.findall(self.scope_claim))

    @property
    def scopes_supported(self) -> list[str]:
        return [self.scope_prefix + c for c in CAPABILITIES]

    @property
    def metadata_url(self) -> str:
        """Where this resource's metadata is (RFC 9728 section 3.1: the well-known path
        inserted before the resource's own path)."""
        parts = urlsplit(self.audience)
        path = parts.path.rstrip("/")
        return f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{path}"

    @property
    def metadata_paths(self) -> tuple[str, ...]:
        """The paths this server answers the metadata at: the one ``metadata_url`` names,
        and the bare one (a client that starts from the server's root)."""
        path = urlsplit(self.metadata_url).path
        return (path,) if path == METADATA_PATH else (path, METADATA_PATH)

    def metadata(self) -> dict[str, Any]:
        """The Protected Resource Metadata document (RFC 9728)."""
        return {
            "resource": self.audience,
            "authorization_servers": [self.issuer],
            "scopes_supported": self.scopes_supported,
            "bearer_methods_supported": ["header"],
            "resource_name": "engram",
            "resource_documentation": "https://github.com/engram/engram/blob/main/docs/agents.md",
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OAuthSettings | None:
        """The settings, or None when no issuer is named (and no other ENGRAM_OAUTH_*
        variable is set: one set alone is a ``ConfigError``)."""
        read = Env(env)
        issuer = read.optional("ENGRAM_OAUTH_ISSUER")
        if issuer is None:
            stray = [name for name in SETTINGS if read.optional(name) is not None]
            if stray:
                raise ConfigError(
                    f"{', '.join(stray)} set without ENGRAM_OAUTH_ISSUER: name the"
                    " authorization server whose tokens engram takes"
                )
            return None
        audience = read.optional("ENGRAM_OAUTH_AUDIENCE")
        if audience is None:
            raise ConfigError(
                "ENGRAM_OAUTH_AUDIENCE names this server's resource, the URL clients reach"
                " /mcp at (https://memory.example.com/mcp): a token must be issued for it"
            )
        return cls(
            issuer=issuer,
            audience=audience,
            scope_claim=read.text("ENGRAM_OAUTH_SCOPE_CLAIM", "sub"),
            scope_field=read.text("ENGRAM_OAUTH_SCOPE_FIELD", SCOPE_FIELD),
            scope_prefix=read.env.get("ENGRAM_OAUTH_SCOPE_PREFIX", SCOPE_PREFIX),
            jwks_url=read.optional("ENGRAM_OAUTH_JWKS_URL"),
            algorithms=read.items("ENGRAM_OAUTH_ALGORITHMS", ALGORITHMS),
            jwks_refresh_s=read.duration("ENGRAM_OAUTH_JWKS_REFRESH", JWKS_REFRESH_S),
            leeway_s=read.duration("ENGRAM_OAUTH_LEEWAY", LEEWAY_S),
        )


# -- the challenges -------------------------------------------------------------------


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def challenge(error: EngramError, settings: OAuthSettings | None, *, realm: str) -> str | None:
    """The ``WWW-Authenticate`` of a 401 or of an ``InsufficientScopeError``, else None:
    the realm, where this resource's metadata is (when OAuth is configured), and the
    RFC 6750 error of a refused token or a missing capability."""
    if error.status != 401 and not isinstance(error, InsufficientScopeError):
        return None
    params = [f"realm={_quoted(realm)}"]
    if settings is not None:
        params.append(f"resource_metadata={_quoted(settings.metadata_url)}")
    if isinstance(error, InvalidTokenError):
        params.append('error="invalid_token"')
        params.append(f"error_description={_quoted(error.message[:200])}")
    elif isinstance(error, InsufficientScopeError):
        params.append('error="insufficient_scope"')
        if error.capability is not None:
            prefix = settings.scope_prefix if settings is not None else ""
            params.append(f"scope={_quoted(prefix + error.capability)}")
    return "Bearer " + ", ".join(params)


def looks_like_jwt(bearer: str) -> bool:
    """Whether a bearer has a JWT's shape (three base64url parts), not whether it is one."""
    return len(bearer) <= MAX_TOKEN_CHARS and _JWT.fullmatch(bearer) is not None


# -- the issuer's keys ----------------------------------------------------------------

Fetch = Callable[[str], Any]


def fetch_json(url: str) -> Any:
    """A JSON document of the authorization server, bounded in time and size, redirects
    not followed. ``UnavailableError`` if it cannot be had."""
    try:
        with (
            httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=False) as client,
            client.stream("GET", url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise UnavailableError(f"the authorization server answered {response.status_code}")
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_FETCH_BYTES:
                    raise UnavailableError("the authorization server's document is too large")
        return json.loads(body)
    except (httpx.HTTPError, ValueError) as exc:
        raise UnavailableError(
            f"the authorization server could not be read ({type(exc).__name__})"
        ) from None


def metadata_urls(issuer: str) -> tuple[str, ...]:
    """Where an issuer's metadata may be: RFC 8414's well-known path inserted before the
    issuer's path, then OpenID Connect Discovery's appended to it."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    origin = f"{parts.scheme}://{parts.netloc}"
    return (
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    )


class KeySet:
    """The issuer's public keys by key id, fetched when first needed, again when a token
    names a key id not among them (at most once per ``refresh_s``), and when older than
    ``max_age_s``. Reading a cached key takes no lock: a fetch in progress holds back
    only the requests that need it."""

    def __init__(
        self,
        settings: OAuthSettings,
        fetch: Fetch = fetch_json,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_age_s: float = JWKS_MAX_AGE_S,
    ) -> None:
        self.settings = settings
        self.fetch = fetch
        self.clock = clock
        self.max_age_s = max_age_s
        self._keys: dict[str | None, dict[str, Any]] = {}
        self._fetched_at: float | None = None  # the last attempt, successful or not
        self._jwks_url = settings.jwks_url
        self._lock = threading.Lock()
        self.fetches = 0  # how many times the keys were fetched (for the tests and logs)

    def key(self, kid: str | None) -> dict[str, Any] | None:
        """The JWK with id ``kid`` (None: the only key, when the issuer has one)."""
        found = self._find(kid)
        now = self.clock()
        stale = self._fetched_at is not None and now - self._fetched_at >= self.max_age_s
        if found is not None and not stale:
            return found
        self._refresh(when_missing=found is None)
        if not self._keys:  # none ever fetched, and not to be tried again yet
            raise UnavailableError(
                "the authorization server's keys could not be fetched: try again shortly"
            )
        return self._find(kid)

    def _find(self, kid: str | None) -> dict[str, Any] | None:
        keys = self._keys
        if kid is None:
            return next(iter(keys.values())) if len(keys) == 1 else None
        return keys.get(kid)

    def _refresh(self, *, when_missing: bool) -> None:
        seen = self._fetched_at
        # A fetch in progress: wait for it (bounded by its own timeouts) rather than
        # start another, then take what it brought.
        with self._lock:
            if self._fetched_at != seen:
                return
            now = self.clock()
            if self._fetched_at is not None:
                age = now - self._fetched_at
                due = age >= self.settings.jwks_refresh_s if when_missing else True
                if not due:
                    return
            self._fetched_at = now
            try:
                self._keys = self._load()
            except UnavailableError as exc:
                if not self._keys:
                    raise
                log.warning(
                    "oauth keys not refreshed, the cached ones kept", extra={"why": exc.message}
                )

    def _load(self) -> dict[str | None, dict[str, Any]]:
        if self._jwks_url is None:
            self._jwks_url = self._discover()
        self.fetches += 1
        document = self.fetch(self._jwks_url)
        keys = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(keys, list):
            raise UnavailableError("the authorization server's JWKS has no keys")
        usable: dict[str | None, dict[str, Any]] = {}
        for jwk in keys:
            if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
                continue
            if jwk.get("kty") not in ("RSA", "EC", "OKP") or "d" in jwk:
                continue  # a symmetric key, or a private one published by mistake
            kid = jwk.get("kid")
            usable[kid if isinstance(kid, str) else None] = jwk
        log.info("oauth keys fetched", extra={"keys": len(usable)})
        return usable

    def _discover(self) -> str:
        for url in metadata_urls(self.settings.issuer):
            try:
                document = self.fetch(url)
            except UnavailableError:
                continue
            if not isinstance(document, dict) or document.get("issuer") != self.settings.issuer:
                continue  # RFC 8414 section 3.3: another issuer's metadata is not used
            jwks_uri = document.get("jwks_uri")
            if isinstance(jwks_uri, str):
                try:
                    return _url("jwks_uri", jwks_uri)
                except ConfigError:
                    break
        raise UnavailableError(
            "the authorization server's metadata names no usable jwks_uri"
            " (set ENGRAM_OAUTH_JWKS_URL)"
        )


# -- verifying a token ----------------------------------------------------------------


class Verifier:
    """An access token of the operator's authorization server, to the grant it gives."""

    def __init__(self, settings: OAuthSettings, tokens: Tokens, keys: KeySet | None = None) -> None:
        self.settings = settings
        self.tokens = tokens
        self.keys = keys if keys is not None else KeySet(settings)

    def verify(self, token: str) -> Grant:
        """The grant of a valid token (database: run in a thread). ``InvalidTokenError``
        for a token refused, ``UnavailableError`` when the issuer's keys cannot be had."""
        claims = self._claims(token)
        scope = self._scope(claims)
        granted = claims.get("scope", claims.get("scp", ""))
        names = set(granted.split() if isinstance(granted, str) else granted or ())
        prefix = self.settings.scope_prefix
        can = frozenset(c for c in CAPABILITIES if prefix + c in names)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise InvalidTokenError("the token has no subject (sub)")
        expires = datetime.fromtimestamp(claims["exp"], UTC)
        grant = self.tokens.principal(self.settings.issuer, subject, scope.as_dict(), can, expires)
        if grant is None:
            raise InvalidTokenError("this token's principal is revoked (engram tokens revoke)")
        return grant

    def _claims(self, token: str) -> dict[str, Any]:
        settings = self.settings
        if not looks_like_jwt(token):
            raise InvalidTokenError("the token is not a JWT")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidTokenError("the token is not a JWT") from None
        alg = header.get("alg")
        if alg not in settings.algorithms:
            raise InvalidTokenError(
                f"the token's algorithm is not one allowed ({', '.join(settings.algorithms)})"
            )
        kid = header.get("kid")
        jwk = self.keys.key(kid if isinstance(kid, str) else None)
        if jwk is None:
            raise InvalidTokenError("the token is signed by no key of the issuer")
        if jwk.get("alg") not in (None, alg):
            raise InvalidTokenError("the token's algorithm is not its key's")
        try:
            key = jwt.PyJWK(jwk, algorithm=alg)
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=[alg],
                audience=settings.audience,
                issuer=settings.issuer,
                leeway=settings.leeway_s,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise InvalidTokenError("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise InvalidTokenError("the token is not valid yet") from None
        except jwt.InvalidAudienceError:
            raise InvalidTokenError("the token was not issued for this server") from None
        except jwt.InvalidIssuerError:
            raise InvalidTokenError("the token is another issuer's") from None
        except jwt.InvalidSignatureError:
            raise InvalidTokenError("the token's signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise InvalidTokenError(f"the token is refused ({type(exc).__name__})") from None
        return claims

    def _scope(self, claims: Mapping[str, Any]) -> Scope:
        """The engram scope the token acts on: the template over its claims."""
        values: dict[str, str] = {}
        for name in self.settings.claims:
            value = claims.get(name)
            if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
                raise InvalidTokenError(
                    f"the token has no {name} claim, which names its scope"
                    " (ENGRAM_OAUTH_SCOPE_CLAIM)"
                )
            values[name] = str(value)
        # Placeholders are replaced by value, never formatted: a claim cannot reach
        # anything but its own text.
        text = _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.settings.scope_claim)
        if "{" not in self.settings.scope_claim:
            text = values[self.settings.scope_claim]
        try:
            return Scope.of({self.settings.scope_field: text})
        except EngramError:
            raise InvalidTokenError("the claim naming the token's scope is not a scope") from None
