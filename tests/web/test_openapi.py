"""The OpenAPI document matches what the server does: schemathesis generates requests
from it for every operation and checks every answer (status codes documented, bodies
matching their schemas, no server error, bad input refused) against ``engram web``
served by a real uvicorn on the suite's PostgreSQL and valkey, with a worker running."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings
from rq import Queue
from schemathesis.checks import positive_data_acceptance

from engram.jobs import keys as jobs_keys
from engram.store import Store
from engram.web.api.openapi import DOCUMENT, document
from engram.web.app import routes
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey
from tests.redis_fixtures import spawn, stop_all, worker_env
from tests.web_fixtures import EMBEDDER, OPERATOR, Served, start_engram_web, stop_engram_web


@pytest.fixture(scope="module")
def served_api(
    store: Store, dsn: str, valkey: EmbeddedValkey, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """``engram web`` with data to read and an ``engram worker`` committing what is
    enqueued. Both run as processes of their own: in this one, another thread turning
    source into an AST while hypothesis does too can fail either (CPython 3.11 keeps one
    AST recursion counter per interpreter, not per thread)."""
    client = connect_redis(valkey.url)
    client.flushall()
    _seed(store, client)
    logs = tmp_path_factory.mktemp("web")
    worker = spawn(
        "worker", worker_env(database_url=dsn, redis_url=valkey.url), logs / "worker.log"
    )
    served = start_engram_web(logs, database_url=dsn, redis_url=valkey.url)
    try:
        yield served
    finally:
        stop_engram_web(served)
        stop_all([worker])
        client.close()


def _seed(store: Store, client: redis.Redis) -> None:
    ada = store.session({"user_id": "ada"}, embedder=EMBEDDER)
    first = ada.remember("Ada lives in London.", operation_id="seed:1").records[0]
    ada.revise(first.id, text="Ada lives in Paris.")
    gone = ada.remember("Ada's old phone number.").records[0]
    ada.forget(gone.id)
    client.xadd(keys.DEAD_LETTERS, {
        "partition": 0, "entry": "1-1", "operation_id": "seed:dead", "reason": "malformed",
        "error": json.dumps({"code": "invalid_request", "message": "bad"}), "deliveries": 1,
        "at_ms": 1, "op": "{}",
    })  # fmt: skip
    Queue(jobs_keys.MAINTENANCE_QUEUE, connection=client).enqueue(
        "engram.jobs.prune.prune_job", "mem_x"
    )


schema = schemathesis.pytest.from_fixture("api_schema")


def inexpressible(body: Any) -> bool:
    """Whether a body's fault is one JSON Schema cannot express (the document says it in
    words): a scope with no field set, repeated message ids, NUL characters in metadata
    or message content, metadata over 16,000 bytes or content over 128,000, fields that
    exclude each other (a reconciled remember with an id; only_inferred, or no text, with
    expected_revision 0), and what needs a model, which the workers here do not have."""
    if not isinstance(body, dict):
        return False
    scope = body.get("scope")
    if isinstance(scope, dict) and scope and all(v is None for v in scope.values()):
        return True
    request = body.get("request")
    if not isinstance(request, dict):
        return False
    if request.get("supersede") == "reconcile" or request.get("infer") is True:
        return True
    if request.get("expected_revision") == 0 and (
        request.get("only_inferred") or request.get("text") is None
    ):
        return True
    messages = request.get("messages")
    if isinstance(messages, list):
        ids = [str(m.get("id")) for m in messages if isinstance(m, dict)]
        if len(ids) != len(set(ids)):
            return True
        for m in messages:
            inner = m.get("message") if isinstance(m, dict) else None
            content = json.dumps(inner.get("content") if isinstance(inner, dict) else None)
            if "\\u0000" in content or len(content.encode()) > 128_000:
                return True
    metadata = json.dumps(request.get("metadata"), ensure_ascii=False)
    return "\\u0000" in metadata or len(metadata.encode()) > 16_000


@pytest.fixture(scope="module")
def api_schema(served_api: Served) -> Any:
    return schemathesis.openapi.from_url(served_api.url + "/api/v1/openapi.json", headers=OPERATOR)


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_api_does_what_its_document_says(case: Any) -> None:
    if isinstance(case.query, dict) and "cursor" in case.query:
        # A cursor is only ever the next of a page this server signed: a generated one is
        # refused (400) whatever it holds, as tests/web/test_bad_input.py checks. Taken
        # out of a valid request; an invalid one is not sent at all, as taking it out
        # could leave a valid request (the cursor was what made it invalid), which the
        # server rightly accepts.
        if case.meta is not None and case.meta.generation.mode.is_negative:
            return
        del case.query["cursor"]
    if inexpressible(case.body):
        return
    if isinstance(case.query, dict) and any(v is None for v in case.query.values()):
        return  # a query string cannot hold a null: it would arrive as the text "null"
    if case.operation.label == "POST /api/v1/reembed":
        # A generated model name is no embedder this deployment knows: 422, documented;
        # the real start is tested in tests/web/test_jobs.py.
        case.call_and_validate(
            timeout=60, headers=OPERATOR, excluded_checks=[positive_data_acceptance]
        )
    else:
        case.call_and_validate(timeout=60, headers=OPERATOR)


def test_every_api_route_is_documented_and_nothing_else() -> None:
    served = {
        (route.path.replace(":id", ""), method.lower())
        for route in routes()
        if getattr(route, "path", "").startswith("/api/v1/")
        and route.path != "/api/v1/openapi.json"
        for method in (getattr(route, "methods", None) or set()) - {"HEAD"}
    }
    documented = {(path, method) for path, ops in DOCUMENT["paths"].items() for method in ops}
    assert served == documented


def test_the_document_is_served(served_api: Served) -> None:
    import httpx

    served = httpx.get(served_api.url + "/api/v1/openapi.json", headers=OPERATOR).json()
    assert served == json.loads(json.dumps(document(jobs_keys.QUEUES)))
    assert served["paths"].keys() == DOCUMENT["paths"].keys()
