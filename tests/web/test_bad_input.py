"""Bad input on every route, built from the route table (a new route is covered at once):
malformed ids, scopes, cursors and filters, unknown parameters, wrong methods,
oversized bodies, missing or forged CSRF tokens. Each answers a 4xx with the error
body, and nothing in PostgreSQL or Redis changes."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from rq import Queue
from starlette.routing import Route

from engram.web.app import METADATA_ROUTE, routes
from engram.web.config import MAX_FORM_BYTES, MAX_JSON_BYTES
from engram.worker import keys
from tests.web_fixtures import Web, sign_in

PARAM = re.compile(r"{(\w+)(:\w+)?}")
# Malformed values for each path parameter.
BAD_PATH = {
    "scope_id": ["abc", "0", "-1", "1.5", "9" * 25, "%00", "1e3"],
    "record_id": ["%00", "%20%20", "x" * 201, "a%00b"],
    "operation_id": ["%00", "%20", "o" * 201],
    "letter_id": ["abc", "1-", "1-2-3", "%00", "-1-0"],
    "job_id": ["a.b", "j" * 129, "%00", "a%20b"],
    "partition": ["abc", "-1", "1.5", "9" * 25, "%00"],
    "generation_id": ["abc", "0", "-1", "1.5", "9" * 25, "%00", str(2**31)],
    "name": ["%00", "%20%20", "n" * 65, "a%0Ab", "%20a"],
}
FORGED_CURSORS = [
    "!!!",
    "A" * 30_000,
    base64.urlsafe_b64encode(b'["scopes", ["x"]]').decode().rstrip("="),  # another list's
    base64.urlsafe_b64encode(b'["records", [1, 2]]').decode().rstrip("="),
    base64.urlsafe_b64encode(b"\xff\x00").decode().rstrip("="),
]
# Malformed filters, by route.
BAD_QUERIES: dict[str, list[str]] = {
    "/scopes": [
        "exact=maybe", "limit=0", "limit=201", "limit=ten", "user_id=%00", "user_id=a&user_id=b",
    ],
    "/scopes/{scope_id}": ["status=deleted", "as_of=yesterday", "as_of=2026-13-01", "limit=-1"],
    "/receipts": [
        "kind=drop", "replayed=maybe", "redacted=2", "refused=sometimes", "since=yesterday",
        "until=2026-02-30T00:00", "scope=abc", "record=%00", "scope=0",
    ],
    "/generations": ["limit=1000"],
    "/jobs": ["queue=elsewhere", "state=exploded", "state=queued&cursor=x"],
    "/login": ["next=//attacker.example", "next=https://attacker.example", "next=\\\\x"],
    "/api/v1/operations": ["wait=-1", "wait=31", "wait=soon", "wait=nan"],
    "/api/v1/receipts": ["kind=drop", "since=never", "replayed=yes-please"],
    "/api/v1/scopes": ["exact=2", "chat_id=" + "c" * 201],
    "/api/v1/scopes/{scope_id}/records": ["status=forgotten", "as_of=tomorrow-ish"],
    "/api/v1/jobs": ["queue=nope", "state=?"],
}  # fmt: skip
# Routes whose body is a form (CSRF-checked) or JSON.
FORM_ROUTES = {
    "/scopes/{scope_id}/recall",
    "/forget/{record_id:id}",
    "/generations/reembed",
    "/generations/{generation_id}/cancel",
    "/dead-letters/bulk",
    "/dead-letters/{letter_id}/retry",
    "/dead-letters/{letter_id}/discard",
    "/jobs/bulk",
    "/jobs/{job_id}/retry",
    "/jobs/{job_id}/discard",
    "/pause/partition",
    "/resume/partition/{partition}",
    "/pause/jobs",
    "/resume/jobs",
    "/login",
    "/logout",
    "/tokens",
    "/tokens/{name:id}/revoke",
}


@dataclass(frozen=True)
class Endpoint:
    path: str  # the template
    method: str

    @property
    def api(self) -> bool:
        return self.path.startswith("/api/") or self.path == "/metrics"

    @property
    def form(self) -> bool:
        return self.method == "POST" and self.path in FORM_ROUTES


def endpoints() -> list[Endpoint]:
    found = []
    for route in routes():
        # The OAuth metadata document is served only when OAuth is configured, and only
        # at the paths its settings name (any other path under it is no page):
        # tests/engram/test_oauth.py holds its answers.
        if isinstance(route, Route) and route.path != METADATA_ROUTE:
            for method in sorted((route.methods or set()) - {"HEAD"}):
                found.append(Endpoint(route.path, method))
    return found


ENDPOINTS = endpoints()


@dataclass
class World:
    web: Web
    values: dict[str, str]

    def url(self, endpoint: Endpoint, **override: str) -> str:
        def value(match: re.Match[str]) -> str:
            return override.get(match.group(1), self.values[match.group(1)])

        return PARAM.sub(value, endpoint.path)

    def state(self) -> dict[str, Any]:
        """Everything a request could change: rows in PostgreSQL, entries in Redis."""
        with self.web.store.pool.connection() as conn:
            counts = conn.execute(
                "SELECT (SELECT count(*) FROM engram_receipts),"
                " (SELECT count(*) FROM engram_records), (SELECT count(*) FROM engram_forgotten),"
                " (SELECT count(*) FROM engram_audit), (SELECT count(*) FROM engram_scopes),"
                " (SELECT sum(revision) FROM engram_scopes),"
                " (SELECT count(*) FROM engram_tokens WHERE revoked_at IS NULL)"
            ).fetchone()
        redis = self.web.redis
        queue = Queue("default", connection=redis)
        return {
            "db": counts,
            "streams": [redis.xlen(keys.stream(p)) for p in range(4)],
            "dead": redis.xlen(keys.DEAD_LETTERS),
            "paused": (redis.hgetall(keys.PAUSED), redis.get("rq:suspended")),
            "jobs": (len(queue), queue.failed_job_registry.get_job_count(cleanup=False)),
            "starts": list(self.web.starts),
        }


@pytest.fixture
def world(web: Web) -> Iterator[World]:
    rid = web.remember({"user_id": "matrix"}, "A record to aim at.")
    receipt = web.store.browse.receipts(limit=1).items[0]
    web.redis.xadd(keys.DEAD_LETTERS, {
        "partition": 0, "entry": "1-1", "operation_id": "x", "reason": "malformed",
        "error": '{"code": "invalid_request", "message": "bad"}', "deliveries": 1,
        "at_ms": 1, "op": '{"operation_id":"x"}',
    })  # fmt: skip
    letter = web.redis.xrange(keys.DEAD_LETTERS)[0][0].decode()
    failed = Queue("default", connection=web.redis).enqueue("engram.jobs.prune.prune_job", "mem")
    yield World(
        web,
        {
            "scope_id": str(web.scope_id({"user_id": "matrix"})),
            "record_id": rid,
            "operation_id": receipt.receipt.operation_id,
            "letter_id": letter,
            "job_id": failed.id,
            "partition": "1",
            "generation_id": str(web.store.embeddings.all()[0].id),
            "name": _token(web),
        },
    )


def _token(web: Web) -> str:
    if web.store.tokens.get("agent-matrix") is None:
        web.store.tokens.create("agent-matrix", {"user_id": "matrix"}, by="test")
    return "agent-matrix"


def send(world: World, endpoint: Endpoint, url: str, **kwargs: Any) -> Any:
    web = world.web
    if endpoint.form and "data" not in kwargs and "content" not in kwargs:
        kwargs["data"] = {"csrf": web.csrf()}
    if endpoint.api and endpoint.method in ("POST", "DELETE") and "content" not in kwargs:
        kwargs.setdefault("json", {})
    return web.client.request(endpoint.method, url, **kwargs)


def assert_refused(
    world: World, response: Any, endpoint: Endpoint, statuses: set[int], sent: object = None
) -> None:
    assert response.status_code in statuses, (endpoint, sent, response.status_code)
    if endpoint.api or response.headers.get("content-type", "").startswith("application/json"):
        error = response.json()["error"]
        assert set(error) >= {"code", "message"} and error["message"]
    else:
        assert f"<h1>{response.status_code}</h1>" in response.text
        assert re.search(r'<span class="mono">[a-z_]+</span>: ', response.text)


def with_params(endpoint: Endpoint) -> bool:
    return bool(PARAM.search(endpoint.path))


@pytest.mark.parametrize(
    "endpoint", [e for e in ENDPOINTS if with_params(e)], ids=lambda e: f"{e.method} {e.path}"
)
def test_malformed_path_values_are_400(world: World, endpoint: Endpoint) -> None:
    before = world.state()
    for name in PARAM.findall(endpoint.path):
        for bad in BAD_PATH[name[0]]:
            response = send(world, endpoint, world.url(endpoint, **{name[0]: bad}))
            assert_refused(world, response, endpoint, {400})
    assert world.state() == before


@pytest.mark.parametrize(
    "endpoint",
    [e for e in ENDPOINTS if e.method == "GET"],
    ids=lambda e: f"{e.method} {e.path}",
)
def test_unknown_repeated_and_malformed_query_parameters_are_400(
    world: World, endpoint: Endpoint
) -> None:
    before = world.state()
    url = world.url(endpoint)
    # A list refuses a cursor it did not hand out; any other route, any cursor at all.
    queries = ["unexpected=1", *BAD_QUERIES.get(endpoint.path, [])]
    queries += [f"cursor={c}" for c in FORGED_CURSORS]
    for query in queries:
        response = send(world, endpoint, f"{url}?{query}")
        assert_refused(world, response, endpoint, {400}, query)
    assert world.state() == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_other_methods_are_405(world: World, endpoint: Endpoint) -> None:
    before = world.state()
    allowed = {e.method for e in ENDPOINTS if e.path == endpoint.path} | {"HEAD"}
    for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - allowed:
        response = world.web.client.request(method, world.url(endpoint))
        assert_refused(world, response, Endpoint(endpoint.path, method), {405})
    assert world.state() == before


@pytest.mark.parametrize(
    "endpoint", [e for e in ENDPOINTS if e.form], ids=lambda e: f"{e.method} {e.path}"
)
def test_forms_without_a_good_csrf_token_change_nothing(world: World, endpoint: Endpoint) -> None:
    before = world.state()
    url = world.url(endpoint)
    fields = {"model": "m", "text": "t", "name": "n", "token": "t" * 20}
    for data in ({}, {"csrf": ""}, {"csrf": "f" * 40}, {"csrf": world.web.csrf() + "0"}):
        response = send(world, endpoint, url, data={**fields, **data})
        assert_refused(world, response, endpoint, {403})
    # A good token of another session (the one it was made for signed out) is as forged.
    token = world.web.csrf()
    world.web.client.cookies.clear()
    sign_in(world.web.client, "local")
    response = send(world, endpoint, url, data={**fields, "csrf": token})
    assert_refused(world, response, endpoint, {403})
    assert world.state() == before


@pytest.mark.parametrize(
    "endpoint",
    [e for e in ENDPOINTS if e.method in ("POST", "DELETE")],
    ids=lambda e: f"{e.method} {e.path}",
)
def test_oversized_and_malformed_bodies_are_refused(world: World, endpoint: Endpoint) -> None:
    before = world.state()
    url = world.url(endpoint)
    if endpoint.form:
        csrf = world.web.csrf()
        big = f"csrf={csrf}&text=" + "x" * (MAX_FORM_BYTES + 1)
        bodies = [
            (big.encode(), "application/x-www-form-urlencoded", {413}),
            (f"csrf={csrf}&a=%ff%fe".encode(), "application/x-www-form-urlencoded", {400}),
            (f"csrf={csrf}&csrf={csrf}".encode(), "application/x-www-form-urlencoded", {400}),
            (b"\xff=\xfe", "application/x-www-form-urlencoded", {400}),
            (json.dumps({"csrf": csrf}).encode(), "application/json", {415}),
        ]
    else:
        bodies = [
            (b"{" + b" " * MAX_JSON_BYTES + b"}", "application/json", {413}),
            (b"{not json", "application/json", {400}),
            (b"\xff", "application/json", {400}),
            (b'{"kind": "forget"}', "text/plain", {415}),
            (b'{"kind": "forget"}', "application/x-www-form-urlencoded", {415}),
            (b"[1, 2, 3]", "application/json", {422}),
            (b'{"unexpected": true}', "application/json", {422}),
        ]
    for body, content_type, statuses in bodies:
        response = world.web.client.request(
            endpoint.method, url, content=body, headers={"Content-Type": content_type}
        )
        assert_refused(world, response, endpoint, statuses)
    declared = world.web.client.request(
        endpoint.method, url, content=b"{}", headers={"Content-Length": str(10**12),
                                                      "Content-Type": "application/json"}
    )  # fmt: skip
    assert declared.status_code in (400, 413)
    assert world.state() == before


def test_every_route_is_in_the_matrix() -> None:
    templates = {e.path for e in ENDPOINTS}
    assert {p for p in templates if "{" in p} == {
        p for p in templates if any(f"{{{n}" in p for n in BAD_PATH)
    }
    assert templates >= FORM_ROUTES
    assert set(BAD_QUERIES) <= templates
