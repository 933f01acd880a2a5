"""Who may use the dashboard: the operator's token, as a bearer header or through a
signed session (loopback too), or no one at all on a dashboard served open on purpose
while no scoped token is live; the Host and the Origin of what changes things."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from engram.store import Store
from engram.store.errors import ConfigError
from engram.web import WebConfig
from engram.web.auth import SESSION_COOKIE
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from tests.redis_fixtures import FAST, wait_until
from tests.web_fixtures import BASE_URL, TOKEN, make_app, sign_in


@pytest.fixture
def client_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = connect_redis(redis_url)
    yield client
    client.close()


def guarded(store: Store, client: redis.Redis, **config: Any) -> TestClient:
    settings = {"host": "0.0.0.0", "token": TOKEN, "partitions": FAST.partitions, **config}
    return TestClient(
        make_app(store, client, config=WebConfig(**settings)),
        base_url=BASE_URL,
        follow_redirects=False,
    )


def test_every_dashboard_needs_a_token_of_some_length_unless_served_open_on_loopback() -> None:
    with pytest.raises(ConfigError, match="ENGRAM_DASHBOARD_TOKEN"):
        WebConfig(host="0.0.0.0")
    with pytest.raises(ConfigError, match="ENGRAM_DASHBOARD_TOKEN"):
        WebConfig(host="192.168.1.20", open=True)
    with pytest.raises(ConfigError, match="at least 16"):
        WebConfig(host="0.0.0.0", token="short")
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        with pytest.raises(ConfigError, match="needs an operator token"):
            WebConfig(host=host)
        assert WebConfig(host=host, token=TOKEN).needs_token
        assert not WebConfig(host=host, open=True).needs_token
    assert WebConfig(host="0.0.0.0", token=TOKEN).needs_token
    with pytest.raises(ConfigError, match="one or the other"):
        WebConfig(token=TOKEN, open=True)
    # From the environment: the token set, else the home's, else none unless served open.
    home = {"token": "the-homes-own-token-of-43-characters"}
    taken = WebConfig.from_env({"ENGRAM_DASHBOARD_TOKEN": TOKEN}, home_token=lambda: home["token"])
    assert (taken.token, taken.home_token) == (TOKEN, False)
    homes = WebConfig.from_env({}, home_token=lambda: home["token"])
    assert (homes.token, homes.home_token, homes.open) == (home["token"], True, False)
    opened = WebConfig.from_env({"ENGRAM_DASHBOARD_OPEN": "on"}, home_token=lambda: home["token"])
    assert (opened.token, opened.open) == (None, True)
    with pytest.raises(ConfigError, match="needs an operator token"):
        WebConfig.from_env({})
    # Another address is served only with a token its operator chose, never the home's.
    with pytest.raises(ConfigError, match="ENGRAM_DASHBOARD_TOKEN"):
        WebConfig.from_env({"ENGRAM_DASHBOARD_HOST": "0.0.0.0"}, home_token=lambda: home["token"])


def test_without_the_token_nothing_is_served_but_the_probe_and_the_sign_in(
    store: Store, client_redis: redis.Redis
) -> None:
    client = guarded(store, client_redis)
    page = client.get("/scopes?user_id=ada")
    assert page.status_code == 303 and page.headers["location"] == "/login?next=/scopes"
    for path in ("/api/v1/scopes", "/api/v1/openapi.json", "/metrics"):
        refused = client.get(path)
        assert refused.status_code == 401, path
        assert refused.json()["error"]["code"] == "unauthorized"
        assert refused.headers["www-authenticate"] == 'Bearer realm="engram"'
    posted = client.post("/api/v1/operations", json={"kind": "forget", "scope": {"user_id": "a"}})
    assert posted.status_code == 401 and client_redis.xlen(keys.stream(0)) == 0
    assert client.post("/forget/x", data={"csrf": "x"}).status_code == 401
    assert client.get("/healthz").status_code == 200
    assert client.get("/static/engram.css").status_code == 200
    assert client.get("/login").status_code == 200
    wrong = client.get("/api/v1/scopes", headers={"Authorization": f"Bearer {TOKEN}x"})
    assert wrong.status_code == 401
    basic = client.get("/api/v1/scopes", headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401


def test_programs_send_the_token_as_a_bearer_and_may_name_themselves(
    store: Store, client_redis: redis.Redis, start_worker: Any, scope: dict[str, str]
) -> None:
    client = guarded(store, client_redis)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/v1/scopes", headers=bearer).status_code == 200
    assert client.get("/", headers=bearer).status_code == 200
    with start_worker(store):
        named = client.post(
            "/api/v1/operations?wait=10",
            json={"kind": "remember", "scope": scope, "request": {"text": "From a service."}},
            headers={**bearer, "X-Engram-Operator": "billing-service"},
        )
        anonymous = client.post(
            "/api/v1/operations?wait=10",
            json={"kind": "remember", "scope": scope, "request": {"text": "From a script."}},
            headers=bearer,
        )
    assert named.status_code == 200 and named.json()["requested_by"] == "billing-service"
    assert anonymous.json()["requested_by"] == "api"


def test_people_sign_in_with_a_name_and_the_token(
    store: Store, client_redis: redis.Redis, start_worker: Any, scope: dict[str, str]
) -> None:
    client = guarded(store, client_redis)
    refused = sign_in(client, token="not-the-token-at-all")
    assert refused.status_code == 401 and "not this dashboard" in refused.text
    assert SESSION_COOKIE not in client.cookies
    no_csrf = client.post("/login", data={"name": "grace", "token": TOKEN})
    assert no_csrf.status_code == 403 and SESSION_COOKIE not in client.cookies

    signed = sign_in(client)
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=" in cookie
    home = client.get("/")
    assert home.status_code == 200 and "signed in as <b>grace</b>" in home.text

    # What grace forgets says so on its receipt.
    with start_worker(store):
        rid = client.post(
            "/api/v1/operations?wait=10",
            json={"kind": "remember", "scope": scope, "request": {"text": "To forget."}},
        ).json()["records"][0]["id"]
        confirm = client.get(f"/forget/{rid}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', confirm.text).group(1)  # type: ignore[union-attr]
        status = client.post(f"/forget/{rid}", data={"csrf": csrf}).headers["location"]
        op_id = status.removeprefix("/operations/").partition("?")[0]
        receipt = wait_until(lambda: store.browse.receipt(op_id), what="the forget's receipt")
    assert receipt is not None and receipt.receipt.requested_by == "grace"

    logout_csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/").text).group(1)  # type: ignore[union-attr]
    assert client.post("/logout", data={"csrf": logout_csrf}).status_code == 303
    assert client.get("/").status_code == 303


def test_a_forged_tampered_or_expired_session_is_refused(
    store: Store, client_redis: redis.Redis
) -> None:
    client = guarded(store, client_redis, session_ttl_s=1)
    sign_in(client)
    cookie = client.cookies[SESSION_COOKIE]
    payload, signature = cookie.split(".")
    for forged in (
        f"{payload}.{signature[:-1]}{'B' if signature.endswith('A') else 'A'}",
        f"{payload[:-1]}{'B' if payload.endswith('A') else 'A'}.{signature}",
        "garbage",
        f"{payload}",
    ):
        other = guarded(store, client_redis)
        other.cookies.set(SESSION_COOKIE, forged)
        assert other.get("/").status_code == 303, forged
    # A session signed with another token is not one of ours.
    elsewhere = guarded(store, client_redis, token=TOKEN + "-rotated")
    elsewhere.cookies.set(SESSION_COOKIE, cookie)
    assert elsewhere.get("/").status_code == 303
    wait_until(lambda: client.get("/").status_code == 303, timeout=10, what="the session to expire")


def test_a_csrf_token_belongs_to_its_session(store: Store, client_redis: redis.Redis) -> None:
    grace, alan = guarded(store, client_redis), guarded(store, client_redis)
    sign_in(grace, "grace")
    sign_in(alan, "alan")
    client_redis.xadd(keys.DEAD_LETTERS, {
        "partition": 0, "entry": "1-1", "operation_id": "", "reason": "malformed",
        "error": '{"code": "invalid_request", "message": "x"}', "deliveries": 1,
        "at_ms": 1, "op": "",
    })  # fmt: skip
    [(letter, _)] = client_redis.xrange(keys.DEAD_LETTERS)
    graces = re.search(r'name="csrf" value="([^"]+)"', grace.get("/").text).group(1)  # type: ignore[union-attr]
    stolen = alan.post(f"/dead-letters/{letter.decode()}/discard", data={"csrf": graces})
    assert stolen.status_code == 403 and client_redis.xlen(keys.DEAD_LETTERS) == 1


def test_a_loopback_dashboard_answers_only_to_loopback_names(
    store: Store, client_redis: redis.Redis
) -> None:
    client = TestClient(make_app(store, client_redis), base_url=BASE_URL)
    sign_in(client, "local")
    assert client.get("/", headers={"Host": "localhost:8700"}).status_code == 200
    assert client.get("/", headers={"Host": "[::1]:8700"}).status_code == 200
    rebound = client.get("/api/v1/scopes", headers={"Host": "attacker.example:8700"})
    assert rebound.status_code == 400 and "Host" in rebound.json()["error"]["message"]
    assert client.get("/", headers={"Host": "attacker.example"}).status_code == 400


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
def test_changes_asked_for_by_another_site_are_refused(
    store: Store, client_redis: redis.Redis, headers: dict[str, str]
) -> None:
    client = TestClient(make_app(store, client_redis), base_url=BASE_URL)
    sign_in(client, "local")
    op = {"kind": "remember", "scope": {"user_id": "x"}, "request": {"text": "forged"}}
    refused = client.post("/api/v1/operations", json=op, headers=headers)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert sum(client_redis.xlen(keys.stream(p)) for p in range(FAST.partitions)) == 0
    same_site = client.post("/api/v1/operations", json=op, headers={"Origin": BASE_URL})
    assert same_site.status_code == 202
    # A form cannot send JSON: a text/plain body that looks like JSON is refused.
    plain = client.post(
        "/api/v1/operations", content=b'{"kind":"forget"}', headers={"Content-Type": "text/plain"}
    )
    assert plain.status_code == 415
