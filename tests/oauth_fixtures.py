"""A real OAuth 2.1 authorization server for the tests: node-oidc-provider
(``tests/oauth_server/``, installed from npm by ``npm ci``, which ``.ci/run`` and, when
missing, the fixture run), issuing RS256 JWT access tokens by the client_credentials
grant with RFC 8707 resource indicators. It dies with the test process: its stdin is a
pipe the test holds (closed, it exits), and it gets SIGTERM if the test process dies
however it dies (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.node_support import node_with_packages
from tests.web_fixtures import _die_with_parent, free_port

SERVER = Path(__file__).parent / "oauth_server"
SCOPES = [f"engram:{c}" for c in ("recall", "get", "history", "operation", "remember", "forget")]
SECRET = "client-secret-of-the-tests-0123456789"
# The clients: each client's id is its token's ``sub``, the engram scope's user_id.
CLIENTS = {"ada": " ".join(SCOPES), "bob": " ".join(SCOPES), "reader": "engram:recall engram:get"}


def new_key() -> tuple[rsa.RSAPrivateKey, dict[str, Any]]:
    """An RSA signing key and its private JWK (with a fresh ``kid``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    jwk.update(kid=uuid.uuid4().hex[:12], alg="RS256", use="sig")
    return key, jwk


@dataclass
class AuthorizationServer:
    config_path: Path
    port: int = field(default_factory=free_port)
    keys: list[tuple[rsa.RSAPrivateKey, dict[str, Any]]] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    node: str = "node"

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = {
            "port": self.port,
            "issuer": self.issuer,
            "keys": [jwk for _, jwk in self.keys],
            "scopes": SCOPES,
            "clients": [
                {"client_id": name, "client_secret": SECRET, "scope": scope}
                for name, scope in CLIENTS.items()
            ],
        }
        self.config_path.write_text(json.dumps(config))
        self.process = subprocess.Popen(
            [self.node, str(SERVER / "server.mjs"), str(self.config_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line == b"ready\n", f"the authorization server did not start: {line!r}"

    def stop(self) -> None:
        if self.process is None:
            return
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.process = None

    def rotate(self) -> str:
        """A new signing key, first (the one tokens are signed with from now on), the old
        ones still published; the server restarted with them. Returns the new ``kid``."""
        self.stop()
        self.keys.insert(0, new_key())
        self.start()
        return str(self.keys[0][1]["kid"])

    def token(self, client: str, resource: str, scope: str | None = None) -> str:
        """An access token by the client_credentials grant, for ``resource`` (RFC 8707)."""
        data = {"grant_type": "client_credentials", "resource": resource}
        data["scope"] = CLIENTS[client] if scope is None else scope
        answer = httpx.post(self.issuer + "/token", data=data, auth=(client, SECRET), timeout=10)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["access_token"])

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        """A token signed with the server's own current key: what it would issue, with
        claims of the test's choosing (another issuer, an expiry past)."""
        key, jwk = self.keys[0]
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": jwk["kid"], **header})

    def claims(self, resource: str, sub: str = "ada", **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        return {
            "iss": self.issuer,
            "sub": sub,
            "aud": resource,
            "iat": now,
            "exp": now + 300,
            "scope": " ".join(SCOPES),
            **extra,
        }

    def jwks_fetches(self) -> int:
        """How many times the keys were fetched since this server (re)started."""
        return int(httpx.get(self.issuer + "/test/jwks-fetches", timeout=10).json()["fetches"])


@pytest.fixture
def authorization_server(tmp_path: Path) -> Iterator[AuthorizationServer]:
    node = node_with_packages(SERVER, "oidc-provider")
    server = AuthorizationServer(tmp_path / "oidc-provider.json", keys=[new_key()], node=node)
    server.start()
    try:
        yield server
    finally:
        server.stop()
