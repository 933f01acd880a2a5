"""Scoped tokens on the web: a token acts on its own scope's records, recall and
operations through /api/v1, within its capabilities; another scope's record is not
found; every other route (the operator's, every page) refuses it; a made-up, revoked
or expired token is refused; its writes are authenticated and its reads logged; the
operator manages tokens on their page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from engram.store import Operation, Store, WriteResult
from engram.web import WebConfig
from engram.web.app import routes
from engram.web.auth import require_grant
from tests.web_fixtures import BASE_URL, EMBEDDER, TOKEN, Web, make_app, sign_in

# What a scoped token may call (web.scoped): every other route must refuse it.
TOKEN_ROUTES = {
    ("GET", "/api/v1/openapi.json"),
    ("POST", "/api/v1/operations"),
    ("GET", "/api/v1/operations/{operation_id:id}"),
    ("GET", "/api/v1/receipts/{operation_id:id}"),
    ("GET", "/api/v1/records/{record_id:id}"),
    ("GET", "/api/v1/history/{record_id:id}"),
    ("POST", "/api/v1/recall"),
    # The OAuth Protected Resource Metadata: public (a 404 without OAuth configured).
    ("GET", "/.well-known/oauth-protected-resource{rest:path}"),
}
PUBLIC = ("/healthz", "/login")


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def operator_routes() -> list[tuple[str, str]]:
    found = []
    for r in routes():
        if isinstance(r, Mount) or not isinstance(r, Route) or r.path in PUBLIC:
            continue
        for method in sorted((r.methods or set()) - {"HEAD"}):
            if (method, r.path) not in TOKEN_ROUTES:
                found.append((method, r.path))
    return found


def test_every_route_but_the_scoped_ones_is_listed_as_the_operators() -> None:
    listed = operator_routes()
    assert ("GET", "/api/v1/find") in listed and ("GET", "/tokens") in listed
    assert ("GET", "/") in listed and ("POST", "/tokens/{name:id}/revoke") in listed
    every = {(m, r.path) for r in routes() if isinstance(r, Route) for m in r.methods or ()}
    assert every >= TOKEN_ROUTES  # the allowed list names real routes


@pytest.mark.parametrize(("method", "path"), operator_routes())
def test_a_scoped_token_is_refused_by_every_operator_route_and_page(
    web: Web, method: str, path: str
) -> None:
    secret, _ = web.store.tokens.create(
        f"agent-{method}-{path}"[:64], {"user_id": "operator-routes"}, by="test"
    )
    concrete = re.sub(r"\{[^}]+\}", "1", path)
    answer = web.client.request(
        method,
        concrete,
        headers={**bearer(secret), "content-type": "application/json"},
        content=b"{}",
    )
    assert answer.status_code == 403, (method, path, answer.status_code)
    if path.startswith("/api/"):
        assert answer.json()["error"]["code"] == "forbidden"
    # The same request without the token is the loopback operator's: not refused.
    assert web.client.request(method, concrete).status_code != 403 or method == "POST"


def test_a_token_reads_its_own_scope_and_the_reads_are_logged(web: Web) -> None:
    scope = {"user_id": "tok-ada"}
    record = web.remember(scope, "Ada lives in London.")
    secret, _ = web.store.tokens.create("agent-ada-reads", scope, by="grace")
    auth = bearer(secret)
    got = web.client.get(f"/api/v1/records/{record}", headers=auth)
    assert got.status_code == 200 and got.json()["text"] == "Ada lives in London."
    history = web.client.get(f"/api/v1/history/{record}", headers=auth)
    assert history.status_code == 200 and len(history.json()["revisions"]) == 1
    # The scope is the token's: the body may leave it out.
    recalled = web.client.post("/api/v1/recall", headers=auth, json={"text": "London"})
    assert recalled.status_code == 200
    assert [h["record"]["id"] for h in recalled.json()["hits"]] == [record]
    entries = web.store.tokens.reads_by_token("agent-ada-reads")
    assert sorted((e.tool, e.record_id, e.revision) for e in entries) == [
        ("get", record, 1),
        ("history", record, 1),
        ("recall", record, 1),
    ]
    page = web.client.get(f"/records/{record}").text
    readers = page[page.index('id="readers"') :]
    assert "agent-ada-reads</a>, 3 times" in readers
    token_page = web.client.get("/tokens/agent-ada-reads").text
    assert token_page.count(f'href="/records/{record}?user_id=') == 3
    assert "London" not in token_page  # content-free


def test_another_scopes_record_is_not_found_and_nothing_of_it_is_said(web: Web) -> None:
    other = {"user_id": "tok-bob-secret-scope"}
    record = web.remember(other, "Bob's bank PIN is 4321.")
    secret, _ = web.store.tokens.create("agent-nosy", {"user_id": "tok-eve"}, by="grace")
    auth = bearer(secret)
    unknown = web.client.get("/api/v1/records/no-such-record", headers=auth)
    for path in (f"/api/v1/records/{record}", f"/api/v1/history/{record}"):
        answer = web.client.get(path, headers=auth)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["code"] == unknown.json()["error"]["code"]
        assert "PIN" not in answer.text and "tok-bob" not in answer.text
    recall = web.client.post("/api/v1/recall", headers=auth, json={"scope": other, "text": "PIN"})
    assert recall.status_code == 404 and "PIN" not in recall.text and "tok-bob" not in recall.text
    # A narrower scope is another scope: exact is the rule.
    narrower = {"user_id": "tok-eve", "chat_id": "c1"}
    assert (
        web.client.post(
            "/api/v1/recall", headers=auth, json={"scope": narrower, "text": "x"}
        ).status_code
        == 404
    )
    write = web.client.post(
        "/api/v1/operations",
        headers=auth,
        json={"kind": "forget", "scope": other, "request": {"id": record}},
    )
    assert write.status_code == 404
    assert web.store.tokens.reads_by_token("agent-nosy") == []
    assert web.client.get(f"/api/v1/records/{record}").status_code == 200  # still there


def test_a_missing_capability_is_403(web: Web) -> None:
    scope = {"user_id": "tok-limited"}
    record = web.remember(scope, "Limited.")
    secret, _ = web.store.tokens.create("agent-recall-only", scope, ["recall"], by="grace")
    auth = bearer(secret)
    assert web.client.get(f"/api/v1/records/{record}", headers=auth).status_code == 403
    refused = web.client.get(f"/api/v1/history/{record}", headers=auth)
    assert refused.status_code == 403
    assert refused.json()["error"]["message"].startswith(
        "token agent-recall-only lacks the 'history' capability; it may use recall."
    )
    forget = web.client.post(
        "/api/v1/operations", headers=auth, json={"kind": "forget", "request": {"id": record}}
    )
    assert forget.status_code == 403
    assert web.client.post("/api/v1/recall", headers=auth, json={"text": "x"}).status_code == 200


def test_no_made_up_revoked_or_expired_token_is_401(web: Web, store: Store) -> None:
    scope = {"user_id": "tok-401"}
    record = web.remember(scope, "Refused.")
    path = f"/api/v1/records/{record}"
    made_up = "egt_" + "A" * 43
    for headers in (bearer(made_up), bearer("egt_short")):
        answer = web.client.get(path, headers=headers)
        assert answer.status_code == 401, headers
        # A token was sent and refused: RFC 6750's invalid_token, and no OAuth metadata
        # named (none is configured).
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="engram", error="invalid_token"'), challenge
        assert "resource_metadata" not in challenge
    # A page presented a made-up token is refused too, never the loopback operator's.
    assert web.client.get("/", headers=bearer(made_up)).status_code == 401
    secret, _ = store.tokens.create("agent-revoked-web", scope, by="grace")
    assert web.client.get(path, headers=bearer(secret)).status_code == 200
    store.tokens.revoke("agent-revoked-web", by="grace")
    revoked = web.client.get(path, headers=bearer(secret))
    assert revoked.status_code == 401 and revoked.headers["www-authenticate"]
    expiring, _ = store.tokens.create("agent-expired-web", scope, by="grace", expires_in_s=3600)
    assert web.client.get(path, headers=bearer(expiring)).status_code == 200
    with store.pool.connection() as conn:
        conn.execute("UPDATE engram_tokens SET expires_at = now() WHERE name = 'agent-expired-web'")
    assert web.client.get(path, headers=bearer(expiring)).status_code == 401


def test_without_a_token_where_one_is_needed_is_401(store: Store, redis_client: Any) -> None:
    config = WebConfig(token=TOKEN)
    app = make_app(store, redis_client, config=config)
    with TestClient(app, base_url=BASE_URL) as client:
        answer = client.get("/api/v1/records/x")
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == 'Bearer realm="engram"'


def test_require_grant_gives_a_mounted_app_the_token_or_a_401(
    store: Store, redis_client: Any
) -> None:
    """What /mcp is built on: behind the gate, the grant of a verified token, or a 401
    for anyone else, the loopback operator included."""

    async def whoami(request: Request) -> Response:
        return JSONResponse({"name": require_grant(request).name})

    app = make_app(store, redis_client)
    app.router.routes.append(Mount("/mcp", routes=[Route("/", whoami)]))
    secret, _ = store.tokens.create("agent-mcp", {"user_id": "mcp"}, by="grace")
    with TestClient(app, base_url=BASE_URL) as client:
        assert client.get("/mcp/", headers=bearer(secret)).json() == {"name": "agent-mcp"}
        sign_in(client, "local")  # the operator is no token either
        anonymous = client.get("/mcp/")
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"]


def test_a_tokens_write_is_authenticated_on_its_receipt_and_in_the_audit(
    web: Web, start_worker: Any
) -> None:
    scope = {"user_id": "tok-writer"}
    secret, _ = web.store.tokens.create("agent-writer-web", scope, by="grace")
    auth = bearer(secret)
    with start_worker(web.store):
        written = web.client.post(
            "/api/v1/operations?wait=10",
            headers=auth,
            json={"kind": "remember", "request": {"text": "Ada likes tea."}},
        )
        assert written.status_code == 200, written.text
        receipt = written.json()
        assert receipt["requested_by"] == "token:agent-writer-web"
        assert receipt["authenticated"] is True and receipt["scope"] == scope
        record = receipt["records"][0]["id"]
        forgot = web.client.post(
            "/api/v1/operations?wait=10",
            headers=auth,
            json={"kind": "forget", "scope": scope, "request": {"id": record}, "reason": "asked"},
        )
        assert forgot.status_code == 200, forgot.text
    op_id = forgot.json()["operation_id"]
    state = web.client.get(f"/api/v1/operations/{op_id}", headers=auth).json()
    assert state["receipt"]["authenticated"] is True
    assert web.client.get(f"/api/v1/receipts/{op_id}", headers=auth).status_code == 200
    (row,) = [a for a in web.store.audit.about(record) if a.action == "record.forget"]
    assert row.requested_by == "token:agent-writer-web"
    html = web.client.get(f"/receipts/{op_id}").text
    assert '<span class="authenticated"' in html and "(claimed) token:" not in html
    # Another token of another scope cannot see that operation or its receipt.
    other, _ = web.store.tokens.create("agent-other-web", {"user_id": "x"}, by="grace")
    assert web.client.get(f"/api/v1/operations/{op_id}", headers=bearer(other)).status_code == 404
    assert web.client.get(f"/api/v1/receipts/{op_id}", headers=bearer(other)).status_code == 404
    # A forget keeps the read log content-free; the forgotten record's page still says who read.
    forgotten = web.client.get(f"/records/{record}").text
    assert "Ada likes tea" not in forgotten
    # It names who asked as the receipt does: the token, authenticated.
    assert '<span class="authenticated"' in forgotten and "(claimed) token:" not in forgotten
    scope_id = web.store.browse.holder(record).id  # type: ignore[union-attr]
    listed = web.client.get(f"/scopes/{scope_id}?status=forgotten").text
    assert '<span class="authenticated"' in listed and "(claimed) token:" not in listed


def test_the_record_page_and_the_receipts_api_agree_a_tokens_write_is_authenticated(
    web: Web, start_worker: Any
) -> None:
    """The record page's "asked by" of each revision reads the receipt as the API does:
    a token's write authenticated, a producer's name claimed."""
    scope = {"user_id": "tok-page-agrees"}
    secret, _ = web.store.tokens.create("bob-assistant", scope, by="grace")
    with start_worker(web.store):
        written = web.client.post(
            "/api/v1/operations?wait=10",
            headers=bearer(secret),
            json={"kind": "remember", "request": {"text": "Bob prefers mornings."}},
        )
        assert written.status_code == 200, written.text
    receipt = written.json()
    assert receipt["authenticated"] is True
    record = receipt["records"][0]["id"]
    page = web.client.get(f"/records/{record}").text
    asked = page[page.index('class="asked-by"') :]
    assert asked.startswith('class="asked-by"><span class="authenticated"')
    assert "token:bob-assistant" in asked and "(claimed) token:bob-assistant" not in page
    # The same name sent by a producer, which nothing verified, stays claimed.
    forged = Operation.build(
        "remember", scope, {"text": "Planted."}, requested_by="token:bob-assistant"
    )
    [made] = web.store.execute([forged], EMBEDDER)
    assert isinstance(made, WriteResult)
    other = web.client.get(f"/records/{made.records[0].id}").text
    assert "(claimed) token:bob-assistant" in other


def test_the_operator_creates_lists_and_revokes_tokens_on_their_page(web: Web) -> None:
    csrf = web.csrf("/tokens")
    nav = web.client.get("/").text
    assert 'href="/tokens"' in nav
    refused = web.client.post(
        "/tokens", data={"name": "agent-page", "scope": '{"user_id": "page"}', "can_recall": "on"}
    )
    assert refused.status_code == 403  # no CSRF token: nothing created
    assert web.store.tokens.get("agent-page") is None
    created = web.client.post(
        "/tokens",
        data={
            "csrf": csrf,
            "name": "agent-page",
            "scope": '{"user_id": "page"}',
            "can_recall": "on",
            "can_get": "on",
            "expires": "30d",
        },
    )
    assert created.status_code == 201
    (secret,) = re.findall(r"egt_[A-Za-z0-9_-]{43}", created.text)
    grant = web.store.tokens.verify(secret)
    assert grant is not None and grant.can == {"recall", "get"} and grant.expires_at is not None
    listing = web.client.get("/tokens").text
    assert "agent-page" in listing and secret not in listing  # shown once
    revoked = web.client.post("/tokens/agent-page/revoke", data={"csrf": csrf})
    assert revoked.status_code == 303
    assert web.store.tokens.verify(secret) is None
    actions = [(a.action, a.requested_by) for a in web.store.audit.about("token:agent-page")]
    assert actions == [("token.create", "local"), ("token.revoke", "local")]
    assert "revoked" in web.client.get("/tokens/agent-page").text


def _field_value(html: str, name: str) -> str:
    found = re.search(rf'name="{name}"[^>]*value="([^"]*)"', html)
    assert found, name
    return found.group(1).replace("&#34;", '"').replace("&quot;", '"')


def test_a_refused_token_form_comes_back_filled_with_the_error_beside_its_field(
    web: Web,
) -> None:
    """Issue 42, item 4: a duplicate name, bad scope JSON or a bad expiry gave a bare
    "409 / token_name_taken" page linking only to the overview, and what was typed was
    lost. The form comes back as typed, the refusal beside the field it is about."""
    csrf = web.csrf("/tokens")
    web.store.tokens.create("agent-twice", {"user_id": "x"}, by="test")
    typed = {
        "name": "agent-twice", "scope": '{"user_id": "bea"}', "expires": "30d",
        "why": "for the nightly sync", "can_recall": "on", "can_get": "on",
    }  # fmt: skip
    cases = {
        "name": ({}, 409, "token_name_taken"),
        "scope": ({"name": "agent-new", "scope": '{"user_id": '}, 422, "invalid_request"),
        "expires": ({"name": "agent-new", "expires": "soonish"}, 422, "invalid_request"),
        "can": (
            {"name": "agent-new", "can_recall": "", "can_get": ""}, 422, "invalid_request",
        ),
    }  # fmt: skip
    listed_before = len(web.store.tokens.list())
    audited_before = len(web.store.audit.about("token:agent-new"))
    for field, (changes, status, code) in cases.items():
        form = {**typed, **changes}
        answer = web.client.post("/tokens", data={"csrf": csrf, **form})
        assert answer.status_code == status, (field, answer.text[:500])
        html = answer.text
        beside = html.split(f'id="token-error-{field}"', 1)[1].split("</span></label>", 1)[0]
        assert code in beside, field
        assert html.count('class="field-error"') == 1, field  # beside that field only
        for name in ("name", "scope", "expires", "why"):
            assert _field_value(html, name) == form[name], (field, name)
        ticked = set(re.findall(r'name="can_(\w+)" value="on" checked', html))
        assert ticked == {c for c in ("recall", "get") if form.get(f"can_{c}")}, field
        assert 'id="token-refused"' in html and "<h1>Scoped tokens</h1>" in html
    # Nothing was created, nothing audited.
    assert len(web.store.tokens.list()) == listed_before
    assert web.store.tokens.get("agent-new") is None
    assert len(web.store.audit.about("token:agent-new")) == audited_before


def test_revoking_a_token_asks_first(web: Web) -> None:
    """Issue 42, item 11: the token's page revoked on one click."""
    web.store.tokens.create("agent-asked", {"user_id": "asked"}, by="test")
    page = web.client.get("/tokens/agent-asked").text
    assert 'id="revoke" href="/tokens/agent-asked/revoke">Revoke…</a>' in page
    assert 'action="/tokens/agent-asked/revoke"' not in page  # no one-click form
    asked = web.client.get("/tokens/agent-asked/revoke").text
    assert 'id="confirm-revoke"' in asked and "cannot be undone" in asked
    token = web.store.tokens.get("agent-asked")
    assert token is not None and token.revoked_at is None  # asking changed nothing
    csrf = web.csrf("/tokens/agent-asked/revoke")
    done = web.client.post("/tokens/agent-asked/revoke", data={"csrf": csrf, "why": "leaked"})
    assert done.status_code == 303
    token = web.store.tokens.get("agent-asked")
    assert token is not None and token.revoked_at is not None
