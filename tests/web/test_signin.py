"""Signing the operator in without typing a token: the home's own token, made once and
kept private, and the one-time sign-in links that open a session and leave the address
bar; a dashboard served open on purpose, and only while no scoped token is live."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from starlette.testclient import TestClient

from engram.store import Store
from engram.store.errors import ConfigError
from engram.web import WebConfig, signin
from engram.web.auth import SESSION_COOKIE
from engram.worker.admin import metrics
from tests.web_fixtures import BASE_URL, EMBEDDER, OPERATOR, TOKEN, make_app


@pytest.fixture
def guarded(store: Store, redis_client: redis.Redis) -> Iterator[TestClient]:
    """The app with its operator token, as ``engram web`` serves it."""
    with TestClient(make_app(store, redis_client), base_url=BASE_URL) as client:
        yield client


def fresh(client: TestClient) -> TestClient:
    """Another browser on the same app: no cookie of the first."""
    return TestClient(client.app, base_url=BASE_URL, follow_redirects=False)


def path_of(link: str) -> str:
    parts = urlsplit(link)
    return f"{parts.path}?{parts.query}"


def refusals(client: redis.Redis, door: str, reason: str) -> float:
    return metrics.read_counters(client).get(
        f'auth_refused_total{{door="{door}",reason="{reason}"}}', 0.0
    )


def test_the_homes_token_is_made_once_kept_and_its_owners_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token = signin.home_token(home)
    assert len(token) >= 40 and signin.home_token(home) == token  # kept, not remade
    assert stat.S_IMODE(signin.token_path(home).stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert [p.name for p in home.iterdir()] == [signin.TOKEN_FILE]  # no leftover
    signin.token_path(home).write_text("short\n")
    with pytest.raises(ConfigError, match="remove it"):
        signin.home_token(home)


def test_a_sign_in_link_signs_in_once_and_leaves_the_address_bar(
    guarded: TestClient, redis_client: redis.Redis
) -> None:
    link = signin.link(BASE_URL + "/", TOKEN)
    assert link.startswith(f"{BASE_URL}/login?code=") and TOKEN not in link
    browser = fresh(guarded)
    followed = browser.get(path_of(link).replace("/login?", "/login?next=/receipts&"))
    assert followed.status_code == 303 and followed.headers["location"] == "/receipts"
    assert "HttpOnly" in followed.headers["set-cookie"]
    assert "signed in as <b>local</b>" in browser.get("/").text

    # Once: the same link in another browser (a history, a log) signs no one in.
    again = fresh(guarded)
    used = again.get(path_of(link))
    assert used.status_code == 401 and "used already" in used.text
    assert SESSION_COOKIE not in again.cookies and again.get("/").status_code == 303
    assert refusals(redis_client, "dashboard", "link") == 1


def test_a_forged_expired_or_other_dashboards_link_signs_no_one_in(
    guarded: TestClient, redis_client: redis.Redis
) -> None:
    code = signin.mint(TOKEN)
    flipped = code[:10] + ("A" if code[10] != "A" else "B") + code[11:]
    forged = (
        signin.mint(TOKEN, now_s=time.time() - signin.LINK_TTL_S - 1),  # expired
        signin.mint(TOKEN + "-another-dashboard"),
        flipped,
        "garbage",
        code + "A",
    )
    for bad in forged:
        browser = fresh(guarded)
        answer = browser.get(f"/login?code={bad}")
        assert answer.status_code == 401, bad
        assert SESSION_COOKIE not in browser.cookies and browser.get("/").status_code == 303
    assert refusals(redis_client, "dashboard", "link") == len(forged)
    # None of them spent the genuine one.
    assert fresh(guarded).get(f"/login?code={code}").status_code == 303


def test_an_open_dashboard_is_the_operators_only_while_no_scoped_token_is_live(
    store: Store, redis_client: redis.Redis
) -> None:
    app = make_app(store, redis_client, config=WebConfig(open=True))
    with TestClient(app, base_url=BASE_URL, follow_redirects=False) as client:
        rid = "open-rec-1"
        store.session({"user_id": "bob"}, embedder=EMBEDDER).remember("Bob's plan.", id=rid)
        assert client.get(f"/api/v1/records/{rid}").json()["text"] == "Bob's plan."
        assert client.get("/").status_code == 200

        store.tokens.create("ada-open", {"user_id": "ada"}, by="test")
        for path in (f"/api/v1/records/{rid}", "/api/v1/scopes", "/", "/tokens"):
            refused = client.get(path)
            assert refused.status_code == 401, path
            assert "Bob's plan" not in refused.text and "ENGRAM_DASHBOARD_OPEN" in refused.text
        minted = client.post("/tokens", data={"name": "eve", "scope": '{"user_id": "bob"}'})
        assert minted.status_code == 401
        assert [t.name for t in store.tokens.list()] == ["ada-open"]
        assert refusals(redis_client, "api", "missing") == 2

        store.tokens.revoke("ada-open", by="test")
        assert client.get("/api/v1/scopes").status_code == 200


def test_the_operators_bearer_is_the_homes_token_and_nothing_else(
    guarded: TestClient,
) -> None:
    assert guarded.get("/api/v1/scopes", headers=OPERATOR).status_code == 200
    assert guarded.get("/api/v1/scopes").status_code == 401
    code = signin.mint(TOKEN)
    refused = guarded.get("/api/v1/scopes", headers={"Authorization": f"Bearer {code}"})
    assert refused.status_code == 401  # a sign-in code is no token
