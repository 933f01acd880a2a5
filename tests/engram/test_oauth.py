"""engram as an OAuth 2.1 resource server (issue 39), against a real authorization
server (node-oidc-provider, ``tests/oauth_fixtures.py``) issuing tokens by the
client_credentials grant: the Protected Resource Metadata, the challenges, a token
reaching its own scope only, every kind of bad token refused with nothing changed, a
missing capability a 403 ``insufficient_scope``, rotated keys picked up without a
token holder being able to make engram hammer the issuer, and ``egt_`` tokens as
before."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from mcp import ClientSession, MCPError
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from engram.mcp.http import REFUSED
from engram.store import Store
from engram.store.errors import ConfigError
from engram.store.tokens import CAPABILITIES
from engram.web.errors import UnavailableError
from engram.web.oauth import InvalidTokenError, KeySet, OAuthSettings, Verifier, fetch_json
from tests.mcp_support import INITIALIZE, http_session, ok, refused, run, server_env
from tests.oauth_fixtures import CLIENTS, SECRET, AuthorizationServer, new_key
from tests.redis_fixtures import InProcessWorker
from tests.web_fixtures import OPERATOR, Served, free_port

METADATA_PATHS = (
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-protected-resource",
)
ACCEPT = {"Accept": "application/json, text/event-stream"}


class Oauthed:
    """``engram web`` taking the authorization server's tokens for its ``/mcp``."""

    def __init__(self, served: Served, resource: str, issuer: AuthorizationServer) -> None:
        self.served = served
        self.url = served.url
        self.resource = resource
        self.issuer = issuer

    @property
    def metadata_url(self) -> str:
        return self.url + "/.well-known/oauth-protected-resource/mcp"

    def token(self, client: str, scope: str | None = None) -> str:
        return self.issuer.token(client, self.resource, scope)


def serve_oauth(
    serve_web: Callable[..., Served],
    dsn: str,
    redis_url: str,
    home: Path,
    issuer: AuthorizationServer,
    **extra: str,
) -> Oauthed:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    env = server_env(
        dsn,
        redis_url,
        home,
        ENGRAM_OAUTH_ISSUER=issuer.issuer,
        ENGRAM_OAUTH_AUDIENCE=resource,
        **extra,
    )
    served = serve_web(database_url=dsn, redis_url=redis_url, env=env, port=port)
    return Oauthed(served, resource, issuer)


@pytest.fixture
def oauthed(
    store: Store,
    dsn: str,
    redis_url: str,
    tmp_path: Path,
    serve_web: Callable[..., Served],
    authorization_server: AuthorizationServer,
) -> Oauthed:
    return serve_oauth(serve_web, dsn, redis_url, tmp_path / "home", authorization_server)


@pytest.fixture
def worker(store: Store, start_worker: Callable[..., InProcessWorker]) -> Any:
    with start_worker(store) as running:
        yield running


class Memory(TokenStorage):
    """The SDK's token storage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def sdk_client(server: Oauthed, client: str) -> ClientCredentialsOAuthProvider:
    """The MCP SDK's own OAuth client: from the 401 it finds the resource's metadata, the
    authorization server's, and gets a token by client_credentials for this resource."""
    return ClientCredentialsOAuthProvider(
        server_url=server.resource,
        storage=Memory(),
        client_id=client,
        client_secret=SECRET,
        scope=CLIENTS[client],
        issuer=server.issuer.issuer,
    )


def initialize(url: str, token: str | None) -> httpx.Response:
    headers = {**ACCEPT, **({"Authorization": f"Bearer {token}"} if token else {})}
    return httpx.post(url + "/mcp", json=INITIALIZE, headers=headers, timeout=10)


def remember(url: str, token: str, text: str) -> httpx.Response:
    return httpx.post(
        url + "/api/v1/operations?wait=10",
        json={"kind": "remember", "request": {"text": text}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=20,
    )


def test_the_metadata_names_this_resource_its_issuer_and_scopes(oauthed: Oauthed) -> None:
    expected = {
        "resource": oauthed.resource,
        "authorization_servers": [oauthed.issuer.issuer],
        "scopes_supported": [f"engram:{c}" for c in CAPABILITIES],
        "bearer_methods_supported": ["header"],
    }
    for path in METADATA_PATHS:
        answer = httpx.get(oauthed.url + path, timeout=10)
        assert answer.status_code == 200
        document = answer.json()
        assert {k: document[k] for k in expected} == expected
    # Nothing else under it is served, and it is read only.
    assert httpx.get(oauthed.metadata_url + "/x", timeout=10).status_code == 404
    assert httpx.post(oauthed.metadata_url, timeout=10).status_code == 405
    # Every 401 says where the metadata is: /mcp, and /api/v1.
    challenge = f'resource_metadata="{oauthed.metadata_url}"'
    missing = initialize(oauthed.url, None)
    assert missing.status_code == 401 and challenge in missing.headers["www-authenticate"]
    assert "error=" not in missing.headers["www-authenticate"]  # no token was sent
    api = httpx.post(oauthed.url + "/api/v1/recall", json={"text": "x"}, timeout=10)
    assert api.status_code == 401 and challenge in api.headers["www-authenticate"]
    assert api.json()["error"]["code"] == "unauthorized"  # engram's JSON error


def test_without_oauth_no_metadata_is_announced(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> None:
    served = serve_web(
        database_url=dsn, redis_url=redis_url, env=server_env(dsn, redis_url, tmp_path / "h")
    )
    for path in METADATA_PATHS:
        assert httpx.get(served.url + path, timeout=10).status_code == 404
    missing = initialize(served.url, None)
    assert missing.status_code == 401
    assert "resource_metadata" not in missing.headers["www-authenticate"]


def test_an_sdk_client_finds_the_issuer_from_the_401_and_reaches_its_own_scope_only(
    oauthed: Oauthed, store: Store, worker: Any
) -> None:
    text = "Ada's bike lock is QUOKKABRIDGE 4."

    async def session(client: str) -> Any:
        http = httpx2.AsyncClient(auth=sdk_client(oauthed, client), timeout=30)
        return http, streamable_http_client(oauthed.resource, http_client=http)

    async def main() -> str:
        http, transport = await session("ada")
        async with http, transport as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            written = await ok(s, "remember", text=text)
            assert written["state"] == "committed"
            rid: str = written["records"][0]["id"]
            [hit] = (await ok(s, "recall", query="bike lock"))["records"]
            assert hit["record"]["id"] == rid
        http, transport = await session("bob")
        async with http, transport as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            assert (await refused(s, "get", record_id=rid))["code"] == "not_found"
            assert (await refused(s, "history", record_id=rid))["code"] == "not_found"
            assert (await ok(s, "recall", query="bike lock QUOKKABRIDGE"))["records"] == []
        return rid

    rid = run(main)
    # The sub claim named the scope; the write is the principal's, authenticated.
    assert store.get({"user_id": "ada"}, rid).text == text
    assert store.get({"user_id": "bob"}, rid) is None
    receipts = store.receipts(scope={"user_id": "ada"})
    [receipt] = receipts
    assert receipt.authenticated and receipt.requested_by == "token:oauth:ada"
    # /api/v1 takes the same tokens, on the same scope.
    bob = {"Authorization": f"Bearer {oauthed.token('bob')}"}
    hidden = httpx.get(f"{oauthed.url}/api/v1/records/{rid}", headers=bob, timeout=10)
    assert hidden.status_code == 404 and text not in hidden.text
    ada = {"Authorization": f"Bearer {oauthed.token('ada')}"}
    got = httpx.get(f"{oauthed.url}/api/v1/records/{rid}", headers=ada, timeout=10)
    assert got.status_code == 200 and got.json()["text"] == text


def test_bad_tokens_are_refused_with_invalid_token_and_change_nothing(
    oauthed: Oauthed, store: Store, worker: Any
) -> None:
    issuer = oauthed.issuer
    resource = oauthed.resource
    good = issuer.claims(resource)
    _, stranger_jwk = new_key()
    stranger_key, _ = new_key()
    real = oauthed.token("ada")
    before = store.records({"user_id": "ada"})
    head, body, signature = real.split(".")
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    kid = issuer.keys[0][1]["kid"]
    pem = (
        issuer.keys[0][0]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    bad = {
        # A real grant, for another resource (RFC 8707): not this server's token.
        "wrong audience": issuer.token("ada", f"http://127.0.0.1:{free_port()}/mcp"),
        "wrong issuer": issuer.sign({**good, "iss": "http://127.0.0.1:1/elsewhere"}),
        "expired": issuer.sign({**good, "iat": good["iat"] - 7200, "exp": good["iat"] - 3600}),
        "not yet valid": issuer.sign({**good, "nbf": good["iat"] + 3600}),
        "bad signature": f"{head}.{body}.{flipped}",
        "another key, the issuer's kid": jwt.encode(
            good, stranger_key, algorithm="RS256", headers={"kid": kid}
        ),
        "an unknown kid": jwt.encode(
            good, stranger_key, algorithm="RS256", headers={"kid": stranger_jwk["kid"]}
        ),
        "alg none": jwt.encode(good, None, algorithm="none", headers={"kid": kid}),
        "HS256 keyed with the public key": _hs256(good, pem, kid),
        "no sub": issuer.sign({k: v for k, v in good.items() if k != "sub"}),
    }
    for why, token in bad.items():
        answer = initialize(oauthed.url, token)
        assert answer.status_code == 401, why
        challenge = answer.headers["www-authenticate"]
        assert 'error="invalid_token"' in challenge, why
        assert f'resource_metadata="{oauthed.metadata_url}"' in challenge, why
        assert answer.json()["error"]["data"]["code"] == "unauthorized", why
        api = remember(oauthed.url, token, f"Planted by {why}.")
        assert api.status_code == 401, why
        assert api.json()["error"]["code"] == "unauthorized", why
        assert 'error="invalid_token"' in api.headers["www-authenticate"], why
    # Nothing was written: the one write of a good token is the scope's only record.
    done = remember(oauthed.url, real, "The real one.")
    assert done.status_code == 200 and done.json()["records"], done.text
    after = store.records({"user_id": "ada"})
    assert [r.text for r in after if r not in before] == ["The real one."]
    assert len(after) == len(before) + 1
    # No token was logged, whole or in part.
    log = oauthed.served.log()
    signatures = [token.rsplit(".", 1)[1][:20] for token in bad.values()]
    assert all(part not in log for part in signatures if part)
    assert body not in log


def _hs256(claims: dict[str, Any], pem: bytes, kid: str) -> str:
    """The classic confusion: an HMAC token keyed with the issuer's public key. PyJWT
    refuses to sign with a PEM as an HMAC secret, so it is signed by hand here."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    signing = (
        b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
        + "."
        + b64(json.dumps(claims).encode())
    )
    return signing + "." + b64(hmac.new(pem, signing.encode(), hashlib.sha256).digest())


def test_a_missing_capability_is_403_insufficient_scope(
    oauthed: Oauthed, store: Store, worker: Any
) -> None:
    reader = oauthed.token("reader")
    answer = remember(oauthed.url, reader, "A reader's write.")
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "forbidden"
    challenge = answer.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="engram:remember"' in challenge
    # It may recall: its own scope, empty.
    recall = httpx.post(
        oauthed.url + "/api/v1/recall",
        json={"text": "x"},
        headers={"Authorization": f"Bearer {reader}"},
        timeout=10,
    )
    assert recall.status_code == 200 and recall.json()["hits"] == []
    # A token granting no engram capability at all reaches no session.
    nothing = oauthed.token("ada", scope="")
    refused_answer = initialize(oauthed.url, nothing)
    assert refused_answer.status_code == 403
    assert 'error="insufficient_scope"' in refused_answer.headers["www-authenticate"]
    # Over MCP, a tool call it lacks the capability for is the same 403, before the
    # MCP server: the SDK raises it as what it is, and the session goes on.
    statuses: list[int] = []

    async def main() -> MCPError:
        async with http_session(oauthed.resource, reader, statuses) as s:
            assert (await ok(s, "recall", query="anything"))["records"] == []
            with pytest.raises(MCPError) as refused_call:
                await s.call_tool("remember", {"text": "A reader's write."})
            assert statuses[-1] == 403
            missing = await refused(s, "get", record_id="nothing-here-1")
            assert missing["code"] == "not_found"
            return refused_call.value

    error = run(main)
    assert error.error.code == REFUSED and error.error.data["code"] == "forbidden"
    raw = httpx.post(
        oauthed.resource,
        json={
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "forget", "arguments": {"record_id": "x"}},
        },
        headers={**ACCEPT, "Authorization": f"Bearer {reader}"},
        timeout=10,
    )
    assert raw.status_code == 403
    assert 'scope="engram:forget"' in raw.headers["www-authenticate"]
    assert store.records({"user_id": "reader"}) == []


def test_keys_rotated_at_the_issuer_are_picked_up(
    store: Store,
    dsn: str,
    redis_url: str,
    tmp_path: Path,
    serve_web: Callable[..., Served],
    authorization_server: AuthorizationServer,
) -> None:
    # Unknown key ids fetch the keys again at once (the default waits a minute).
    server = serve_oauth(
        serve_web,
        dsn,
        redis_url,
        tmp_path / "home",
        authorization_server,
        ENGRAM_OAUTH_JWKS_REFRESH="0s",
    )
    old = server.token("ada")
    assert initialize(server.url, old).status_code == 200
    new_kid = authorization_server.rotate()
    rotated = server.token("ada")
    assert jwt.get_unverified_header(rotated)["kid"] == new_kid
    assert initialize(server.url, rotated).status_code == 200
    assert initialize(server.url, old).status_code == 200  # the old key is still published


def test_made_up_key_ids_do_not_make_engram_fetch_the_keys_again(
    oauthed: Oauthed, authorization_server: AuthorizationServer
) -> None:
    assert initialize(oauthed.url, oauthed.token("ada")).status_code == 200
    fetched = authorization_server.jwks_fetches()
    assert fetched == 1
    stranger, _ = new_key()
    claims = authorization_server.claims(oauthed.resource)
    for _ in range(20):
        forged = jwt.encode(claims, stranger, algorithm="RS256", headers={"kid": uuid.uuid4().hex})
        assert initialize(oauthed.url, forged).status_code == 401
    assert authorization_server.jwks_fetches() == fetched
    # And a real token is served as before.
    assert initialize(oauthed.url, oauthed.token("bob")).status_code == 200


def test_egt_tokens_work_beside_oauth_and_a_revoked_one_is_an_auth_error_in_the_sdk(
    oauthed: Oauthed, store: Store, worker: Any
) -> None:
    secret, _ = store.tokens.create("beside-oauth", {"user_id": "egt-ada"}, by="test")
    statuses: list[int] = []

    async def main() -> MCPError:
        async with http_session(oauthed.resource, secret, statuses) as s:
            assert (await ok(s, "remember", text="Kept by an egt token."))["state"] == "committed"
            assert store.tokens.revoke("beside-oauth", by="test")
            with pytest.raises(MCPError) as refused_call:
                await s.call_tool("recall", {"query": "kept"})
            return refused_call.value

    error = run(main)
    assert statuses[-1] == 401
    assert error.error.code == REFUSED  # not -32603, "Server returned an error response"
    assert error.error.data["code"] == "unauthorized"
    assert "revoked" in error.error.message
    # The operator's token is no access token, and still the operator's.
    operator = httpx.get(oauthed.url + "/api/v1/scopes", headers=OPERATOR, timeout=10)
    assert operator.status_code == 200


def test_the_operator_can_revoke_an_oauth_principal(oauthed: Oauthed, store: Store) -> None:
    token = oauthed.token("ada")
    assert initialize(oauthed.url, token).status_code == 200
    # Its principal is listed as a token (``oauth:ada``, or ``oauth:`` and a digest when an
    # earlier test's issuer took that name), newest first.
    [principal, *_] = [t for t in store.tokens.list() if t.scope.user_id == "ada"]
    assert principal.created_by == "oauth" and principal.name.startswith("oauth:")
    assert store.tokens.revoke(principal.name, by="test")
    refused_answer = initialize(oauthed.url, oauthed.token("ada"))
    assert refused_answer.status_code == 401
    assert 'error="invalid_token"' in refused_answer.headers["www-authenticate"]
    assert initialize(oauthed.url, oauthed.token("bob")).status_code == 200


CONFIGURED = {
    "ENGRAM_OAUTH_ISSUER": "https://as.example",
    "ENGRAM_OAUTH_AUDIENCE": "https://m.example/mcp",
}


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"ENGRAM_OAUTH_AUDIENCE": "https://m.example/mcp"}, "ENGRAM_OAUTH_ISSUER"),
        ({"ENGRAM_OAUTH_ISSUER": "https://as.example"}, "ENGRAM_OAUTH_AUDIENCE"),
        ({**CONFIGURED, "ENGRAM_OAUTH_ISSUER": "http://as.example"}, "https"),
        ({**CONFIGURED, "ENGRAM_OAUTH_AUDIENCE": "https://m.example/mcp#x"}, "fragment"),
        ({**CONFIGURED, "ENGRAM_OAUTH_ALGORITHMS": "RS256,HS256"}, "HS256"),
        ({**CONFIGURED, "ENGRAM_OAUTH_ALGORITHMS": "none"}, "none"),
        ({**CONFIGURED, "ENGRAM_OAUTH_SCOPE_CLAIM": "{org/{sub}"}, "ENGRAM_OAUTH_SCOPE_CLAIM"),
        ({**CONFIGURED, "ENGRAM_OAUTH_SCOPE_FIELD": "org"}, "ENGRAM_OAUTH_SCOPE_FIELD"),
    ],
)
def test_oauth_settings_are_checked(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError) as error:
        OAuthSettings.from_env(env)
    assert names in error.value.message


def test_a_template_over_claims_names_the_scope(store: Store) -> None:
    settings = OAuthSettings.from_env(
        {
            "ENGRAM_OAUTH_ISSUER": "https://as.example",
            "ENGRAM_OAUTH_AUDIENCE": "https://m.example/mcp",
            "ENGRAM_OAUTH_SCOPE_CLAIM": "{org}/{sub}",
            "ENGRAM_OAUTH_JWKS_URL": "https://as.example/jwks",
        }
    )
    assert settings is not None
    assert settings.claims == ("org", "sub")
    assert settings.metadata_url == "https://m.example/.well-known/oauth-protected-resource/mcp"
    assert OAuthSettings.from_env({}) is None
    key, jwk = new_key()
    public = {k: v for k, v in jwk.items() if k not in ("d", "p", "q", "dp", "dq", "qi")}
    keys = KeySet(settings, fetch=lambda url: {"keys": [public]})
    verifier = Verifier(settings, store.tokens, keys)
    now = int(time.time())
    claims = {"iss": settings.issuer, "aud": settings.audience, "exp": now + 60, "sub": "ada"}

    def signed(**extra: Any) -> str:
        return jwt.encode({**claims, **extra}, key, algorithm="RS256", headers={"kid": jwk["kid"]})

    grant = verifier.verify(signed(org="acme", scope="engram:recall openid"))
    assert grant.scope == {"user_id": "acme/ada"} and grant.can == frozenset({"recall"})
    # A claim's value is its text, never expanded again nor formatted.
    grant = verifier.verify(signed(org="{sub}", scope="engram:get"))
    assert grant.scope == {"user_id": "{sub}/ada"}
    with pytest.raises(InvalidTokenError, match="org claim"):
        verifier.verify(signed(scope="engram:get"))
    assert keys.fetches == 1


def test_an_issuer_out_of_reach_is_503_and_is_not_asked_again_at_once(store: Store) -> None:
    """No keys could be fetched (nothing listens where they are): 503 ``unavailable``,
    and the next token within the refresh interval is answered so without a fetch."""
    settings = OAuthSettings(
        issuer="http://127.0.0.1:1",
        audience="http://127.0.0.1:2/mcp",
        jwks_url=f"http://127.0.0.1:{free_port()}/jwks",
    )
    fetched: list[str] = []

    def fetch(url: str) -> Any:
        fetched.append(url)
        return fetch_json(url)  # the real one: the connection is refused

    verifier = Verifier(settings, store.tokens, KeySet(settings, fetch=fetch))
    key, jwk = new_key()
    claims = {"iss": settings.issuer, "aud": settings.audience, "sub": "ada", "exp": 2**31}
    token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": jwk["kid"]})
    for _ in range(3):
        with pytest.raises(UnavailableError):
            verifier.verify(token)
    assert len(fetched) == 1
