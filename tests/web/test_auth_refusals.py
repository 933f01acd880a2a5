"""Refused credentials leave a trace: a WARNING line each, content-free (never the token,
a revoked or expired one named by its name), and a count in /metrics by door and
reason; what is let in, or only sent to the sign-in page, is not counted."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from engram.store import Store
from engram.worker.embedded.logs import StructuredFormatter
from tests.web_fixtures import BASE_URL, OPERATOR, TOKEN, make_app, sign_in


@pytest.fixture
def client(store: Store, redis_client: redis.Redis) -> Iterator[TestClient]:
    with TestClient(make_app(store, redis_client), base_url=BASE_URL) as test_client:
        yield test_client


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The refusals as ``engram up``'s children print them."""
    formatter = StructuredFormatter()
    return [
        formatter.format(r)
        for r in caplog.records
        if r.name == "engram.web.auth" and r.levelno == logging.WARNING
    ]


def test_each_refusal_is_a_content_free_warning_and_a_count(
    client: TestClient, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    revoked, _ = store.tokens.create("leaked-agent", {"user_id": "ada"}, by="test")
    store.tokens.revoke("leaked-agent", by="test")
    expired, _ = store.tokens.create("old-agent", {"user_id": "ada"}, by="test", expires_in_s=60)
    with store.pool.connection() as conn:
        conn.execute("UPDATE engram_tokens SET expires_at = now() WHERE name = 'old-agent'")
    made_up = "egt_" + "Q" * 43
    asked = [
        ({}, "reason=missing"),
        ({"Authorization": f"Bearer {TOKEN}-wrong"}, "reason=wrong_token"),
        ({"Authorization": f"Basic {TOKEN}"}, "reason=malformed"),
        ({"Authorization": f"Bearer {made_up}"}, "reason=unknown"),
        (
            {"Authorization": f"Bearer {revoked}"},
            "reason=revoked path=/api/v1/scopes token=leaked-agent",
        ),
        (
            {"Authorization": f"Bearer {expired}"},
            "reason=expired path=/api/v1/scopes token=old-agent",
        ),
    ]
    with caplog.at_level(logging.INFO):
        for headers, _ in asked:
            answer = client.get("/api/v1/scopes?user_id=ada-private", headers=headers)
            assert answer.status_code == 401, headers
        refused_sign_in = sign_in(client, "mallory", token=TOKEN + "-guess")
        assert refused_sign_in.status_code == 401
    said = lines(caplog)
    assert len(said) == len(asked) + 1, said
    for line, (_, expected) in zip(said, asked, strict=False):
        assert "credentials refused door=api" in line and expected in line, line
    assert "door=dashboard reason=wrong_token path=/login" in said[-1]
    ours = [r for r in caplog.records if r.name.startswith("engram")]  # not the client's
    everything = "\n".join(StructuredFormatter().format(r) for r in ours)
    for secret in (TOKEN, revoked, expired, made_up, "ada-private"):
        assert secret not in everything

    metrics = client.get("/metrics", headers=OPERATOR).text
    for reason in ("missing", "wrong_token", "malformed", "unknown", "revoked", "expired"):
        assert f'engram_auth_refused_total{{door="api",reason="{reason}"}} 1' in metrics
    assert 'engram_auth_refused_total{door="dashboard",reason="wrong_token"} 1' in metrics
    assert "# TYPE engram_auth_refused_total counter" in metrics


def test_what_is_let_in_or_sent_to_sign_in_is_not_counted(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        page = client.get("/receipts", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login?next=/receipts"
        assert client.get("/healthz").status_code == 200
        assert client.get("/api/v1/scopes", headers=OPERATOR).status_code == 200
    assert lines(caplog) == []
    assert "engram_auth_refused_total" not in client.get("/metrics", headers=OPERATOR).text
