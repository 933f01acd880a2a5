"""The JSON API under /api/v1 against the real PostgreSQL, valkey and RQ."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from rq import Queue
from starlette.testclient import TestClient

from engram.jobs.keys import MAINTENANCE_QUEUE
from engram.jobs.queues import SERIALIZER
from engram.store.read.cursors import Cursors
from engram.web.api.schemas import SCHEMAS
from engram.worker import keys
from tests.fake_llm import ScriptedLLM, events
from tests.redis_fixtures import wait_until
from tests.rq_jobs import enqueue_failing, enqueue_finishing, work
from tests.web_fixtures import BASE_URL, EMBEDDER, Web, make_app, sign_in


def op(scope: dict[str, str], kind: str = "remember", **request: Any) -> dict[str, Any]:
    return {"kind": kind, "scope": scope, "request": request or {"text": "Ada likes tea."}}


def queued(web: Web) -> int:
    return sum(int(web.redis.xlen(keys.stream(p))) for p in range(4))


def test_enqueue_answers_202_then_the_operation_can_be_followed(
    web: Web, start_worker: Any, scope: dict[str, str]
) -> None:
    accepted = web.client.post("/api/v1/operations", json={**op(scope), "operation_id": "api:1"})
    assert accepted.status_code == 202
    body = accepted.json()
    assert body["operation_id"] == "api:1" and body["state"] == "enqueued"
    # The operator's status URL names the scope: an operation id is its scope's.
    assert body["status_url"] == f"/api/v1/operations/api:1?{urlencode(scope)}" and body["entry"]
    assert web.client.get(body["status_url"]).json()["state"] == "waiting"
    typo = web.client.get("/api/v1/operations/api:2")
    assert typo.status_code == 404 and typo.json()["error"]["code"] == "not_found"
    assert "api:2" in typo.json()["error"]["message"]
    # Lost to a restore reads the same: the producer is told it may have been.
    assert "maybe lost to a restore" in typo.json()["error"]["message"]
    with start_worker(web.store):
        wait_until(lambda: web.client.get(body["status_url"]).json()["state"] == "committed")
    state = web.client.get(body["status_url"]).json()
    receipt = state["receipt"]
    assert receipt["operation_id"] == "api:1" and receipt["requested_by"] == "local"
    generated = web.client.post("/api/v1/operations", json=op(scope)).json()
    assert generated["operation_id"].startswith("op_")


def test_wait_answers_the_receipt_or_the_typed_error(
    web: Web, start_worker: Any, scope: dict[str, str]
) -> None:
    with start_worker(web.store):
        first = web.client.post(
            "/api/v1/operations?wait=10", json={**op(scope), "operation_id": "tea:1"}
        )
        again = web.client.post(
            "/api/v1/operations?wait=10", json={**op(scope), "operation_id": "tea:1"}
        )
        conflict = web.client.post(
            "/api/v1/operations?wait=10",
            json={**op(scope, text="Ada likes coffee."), "operation_id": "tea:1"},
        )
        rid = first.json()["records"][0]["id"]
        stale = web.client.post(
            "/api/v1/operations?wait=10",
            json=op(scope, "revise", id=rid, text="Ada likes green tea.", expected_revision=7),
        )
        missing = web.client.post(
            "/api/v1/operations?wait=10", json=op(scope, "retract", id="mem_none")
        )
    assert first.status_code == 200 and first.json()["replayed"] is False
    assert first.json()["scope_revision"] == 1 and first.json()["records"][0]["revision"] == 1
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert again.json()["replays"] == 1
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "operation_conflict"
    assert stale.status_code == 409
    assert stale.json()["error"] | {"message": ""} == {
        "code": "revision_conflict", "message": "", "expected": 7, "actual": 1, "attempts": 1,
    }  # fmt: skip
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_wait_that_runs_out_answers_202_the_operation_stays_queued(
    web: Web, scope: dict[str, str]
) -> None:
    response = web.client.post("/api/v1/operations?wait=0.2", json=op(scope))
    assert response.status_code == 202 and response.json()["state"] == "enqueued"
    assert queued(web) == 1


def test_an_invalid_operation_is_422_and_enqueues_nothing(web: Web, scope: dict[str, str]) -> None:
    for bad in (
        op(scope, text=""),
        op(scope, text="x", colour="red"),
        {**op(scope), "requested_by": "someone-else"},
        {**op(scope), "kind": "drop"},
        {"kind": "remember", "scope": {}, "request": {"text": "x"}},
        {**op(scope), "operation_id": "x" * 201},
        [op(scope)],
    ):
        response = web.client.post("/api/v1/operations", json=bad)
        assert response.status_code == 422, bad
        assert response.json()["error"]["code"] == "invalid_request"
    assert queued(web) == 0


def test_receipts_records_history_and_tombstones(web: Web) -> None:
    scope = {"user_id": "api-reader"}
    rid = web.remember(scope, "Ada lives in London.")
    session = web.store.session(scope, embedder=None)
    session.revise(rid, text="Ada lives in Paris.")
    gone = web.remember(scope, "Forget me.")
    session.forget(gone)
    sid = web.scope_id(scope)

    record = web.client.get(f"/api/v1/records/{rid}").json()
    assert (record["revision"], record["scope_id"]) == (2, sid)
    assert record["text"] == "Ada lives in Paris."
    history = web.client.get(f"/api/v1/history/{rid}").json()
    texts = [r["text"] for r in history["revisions"]]
    assert texts == ["Ada lives in London.", "Ada lives in Paris."]
    forgotten = web.client.get(f"/api/v1/records/{gone}")
    assert forgotten.status_code == 404 and "forgotten" in forgotten.json()["error"]["message"]
    assert web.client.get("/api/v1/history/mem_none").status_code == 404

    page = web.client.get(f"/api/v1/receipts?scope={sid}&limit=2").json()
    rest = web.client.get(f"/api/v1/receipts?scope={sid}&limit=2&cursor={page['next']}").json()
    kinds = [r["kind"] for r in page["items"] + rest["items"]]
    assert kinds == ["forget", "remember", "revise", "remember"] and rest["next"] is None
    forget = page["items"][0]
    assert forget["revisions"] == [1] and forget["redaction"] == "none"
    one = web.client.get(f"/api/v1/receipts/{forget['operation_id']}").json()
    assert one == forget
    lost = web.client.get("/api/v1/receipts/never-sent")
    assert lost.status_code == 404 and "maybe lost to a restore" in lost.json()["error"]["message"]

    scopes = web.client.get("/api/v1/scopes?user_id=api-reader&exact=true").json()["items"]
    assert [(s["id"], s["records"], s["forgotten"]) for s in scopes] == [(sid, 1, 1)]
    assert web.client.get(f"/api/v1/scopes/{sid}").json()["revision"] == 4
    records = web.client.get(f"/api/v1/scopes/{sid}/records?status=all").json()["items"]
    assert [r["id"] for r in records] == [rid]
    tombstones = web.client.get(f"/api/v1/scopes/{sid}/tombstones").json()["items"]
    assert [t["record_id"] for t in tombstones] == [gone]
    assert web.client.get("/api/v1/scopes/999999/records").status_code == 404


def test_a_receipt_shows_what_its_model_proposed_and_the_store_did_not_apply(web: Web) -> None:
    """A model's DELETE of an asserted record is a proposal: the API's receipt carries
    it (as the schema says) and the dashboard's receipt page says it was not applied."""
    scope = {"user_id": "api-proposal"}
    host = web.remember(scope, "Ada lives in London.")
    llm = ScriptedLLM(reconcile=events({"event": "DELETE", "id": "0"}))
    mem = web.store.session(scope, embedder=EMBEDDER, llm=llm)
    result = mem.remember("Ada lives in London, near the river.")
    op_id = result.receipt.operation_id
    receipt = web.client.get(f"/api/v1/receipts/{op_id}").json()
    assert receipt["proposed"] == [{"action": "retract", "id": host, "revision": 1}]
    assert receipt["records"] == []
    assert set(receipt) == set(SCHEMAS["Receipt"]["required"])  # as documented
    plain = web.client.get(f"/api/v1/receipts?scope={web.scope_id(scope)}").json()["items"]
    assert [r["proposed"] for r in plain] == [receipt["proposed"], []]
    page = web.client.get(f"/receipts/{op_id}").text
    assert "the model proposed to retract" in page and f"/records/{host}" in page
    assert "not applied" in page and "London" not in page.split("<h1>", 1)[1]


def test_a_well_formed_cursor_not_signed_with_this_servers_key_is_refused(web: Web) -> None:
    scope = {"user_id": "cursor-forger"}
    for i in range(3):
        web.remember(scope, f"Note {i} on the forged cursor.")
    url = f"/api/v1/receipts?scope={web.scope_id(scope)}&limit=1"
    first = web.client.get(url).json()
    cursor = first["next"]
    payload, signature = cursor.rsplit(".", 1)
    kind, (at, operation_id, scope_id) = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    assert kind == "receipts" and web.client.get(f"{url}&cursor={cursor}").status_code == 200
    # Another position: a day later, so the page would show the first receipt again.
    later = (datetime.fromisoformat(at["t"]) + timedelta(days=1), operation_id, scope_id)
    ours = web.store.cursors.encode("receipts", later)
    again = web.client.get(f"{url}&cursor={ours}")
    assert again.status_code == 200 and again.json()["items"] == first["items"]

    body = json.dumps(
        ["receipts", [{"t": later[0].isoformat()}, operation_id, scope_id]],
        separators=(",", ":"),
    )
    moved = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
    assert ours.startswith(f"{moved}."), "the forgery is encoded as the server encodes"
    another_process = Cursors(b"another process's cursor key")
    for forged in (
        f"{moved}.{signature}",  # the position changed, the signature kept
        another_process.encode("receipts", later),
        another_process.encode(
            "receipts", (datetime.fromisoformat(at["t"]), operation_id, scope_id)
        ),
    ):
        refused = web.client.get(f"{url}&cursor={forged}")
        assert refused.status_code == 400, forged
        assert refused.json()["error"] == {
            "code": "invalid_request",
            "message": "the cursor was not handed out by this server",
        }
        page = web.client.get(f"/receipts?scope={web.scope_id(scope)}&cursor={forged}")
        assert page.status_code == 400 and "not handed out by this server" in page.text


def test_recall_by_post_with_match_kinds(web: Web) -> None:
    scope = {"user_id": "api-recall"}
    web.remember(scope, "Ada lives in Paris.")
    web.remember(scope, "Ada has a black cat.")
    hits = web.client.post(
        "/api/v1/recall", json={"scope": scope, "text": "Ada lives in Paris", "top_k": 2}
    ).json()
    assert hits["vector_search"] is True
    assert hits["hits"][0]["record"]["text"] == "Ada lives in Paris."
    assert {h["match"] for h in hits["hits"]} <= {"vector", "lexical", "hybrid"}
    past = web.client.post(
        "/api/v1/recall",
        json={"scope": scope, "text": "Paris", "recorded_as_of": "2000-01-01T00:00:00Z"},
    ).json()
    assert past["hits"] == []
    for bad in (
        {"scope": {"email": "x"}, "text": "x"},
        {"scope": scope, "text": "x", "top_k": 0},
        {"scope": scope, "colour": "red"},
        {"scope": scope, "recorded_as_of": "yesterday"},
    ):
        response = web.client.post("/api/v1/recall", json=bad)
        assert response.status_code == 422, bad


def test_generations_and_starting_a_reembed(web: Web, store: Any, redis_client: Any) -> None:
    web.remember({"user_id": "api-gen"}, "Text.")
    generations = web.client.get("/api/v1/generations").json()["items"]
    assert generations[0]["status"] in ("active", "pending") and generations[0]["vectors"] >= 1
    started = web.client.post("/api/v1/reembed", json={"model": "minilm"})
    assert started.status_code == 202 and started.json() == {"job_id": "reembed-1"}
    assert web.starts == [("minilm", "local")]
    assert web.client.post("/api/v1/reembed", json={}).status_code == 422
    assert web.client.post("/api/v1/reembed", json={"model": "x", "y": 1}).status_code == 422
    without_jobs = TestClient(make_app(store, redis_client), base_url=BASE_URL)
    sign_in(without_jobs, "local")
    unavailable = without_jobs.post("/api/v1/reembed", json={"model": "minilm"})
    assert unavailable.status_code == 503 and unavailable.json()["error"]["code"] == "unavailable"
    assert "not available" in without_jobs.get("/generations").text


def test_jobs_on_rq_with_their_errors_and_a_retry(web: Web, redis_url: str) -> None:
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    failing = enqueue_failing(queue, "mem_42")
    done = enqueue_finishing(queue)
    waiting = enqueue_failing(queue, "mem_44")
    work(web.store, redis_url, web.redis, queue, max_jobs=2)
    listing = web.client.get(f"/api/v1/jobs?queue={MAINTENANCE_QUEUE}&state=failed").json()
    [counts] = [q for q in listing["queues"] if q["name"] == MAINTENANCE_QUEUE]
    assert counts["counts"] | {} == {**counts["counts"], "failed": 1, "finished": 1, "queued": 1}
    [job] = listing["items"]
    assert job["id"] == failing.id and job["function"] == "engram.jobs.prune.prune_job"
    # The cause's message, not only its type (issue 42, item 5): content-free, as a
    # dead letter's.
    assert "JobFailedError: prune failed: InvalidRequestError: prune one of " in job["error"]
    assert job["error"].endswith("not 'mem_42'")
    page = web.client.get(f"/jobs/{failing.id}").text
    assert "Why it failed:" in page and "prune one of" in page and "not &#39;mem_42&#39;" in page
    assert job["arguments"] == "'mem_42'" and job["ended_at"]
    finished = web.client.get(f"/api/v1/jobs?queue={MAINTENANCE_QUEUE}&state=finished").json()[
        "items"
    ]
    assert [j["id"] for j in finished] == [done.id]
    queued = web.client.get(f"/api/v1/jobs?queue={MAINTENANCE_QUEUE}&state=queued").json()
    assert [j["id"] for j in queued["items"]] == [waiting.id]
    page = web.client.get(f"/jobs/{failing.id}").text
    assert "JobFailedError" in page and "Retry" in page
    retried = web.client.post(f"/api/v1/jobs/{failing.id}/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "queued"
    [entry] = [e for e in web.store.audit.page().items if e.action == "job.retry"][:1]
    assert (entry.target, entry.requested_by) == (failing.id, "local")
    again = web.client.post(f"/api/v1/jobs/{failing.id}/retry")
    assert again.status_code == 422 and "only a failed job" in again.json()["error"]["message"]
    assert web.client.get("/api/v1/jobs/no-such-job").status_code == 404
    assert web.client.get("/api/v1/jobs?queue=elsewhere").status_code == 400


def test_dead_letters_through_the_api(web: Web) -> None:
    body = json.dumps({"operation_id": "dl:1", "kind": "remember", "scope": {"user_id": "x"},
                       "request": {"text": "t"}})  # fmt: skip
    web.redis.xadd(keys.DEAD_LETTERS, {
        "partition": 3, "entry": "5-0", "operation_id": "dl:1", "reason": "failed",
        "error": '{"code": "dead_lettered", "message": "could not be applied"}',
        "deliveries": 1, "at_ms": 1, "op": body,
    })  # fmt: skip
    [letter] = web.client.get("/api/v1/dead-letters").json()["items"]
    assert (letter["operation_id"], letter["partition"], letter["op"]) == ("dl:1", 3, body)
    assert web.client.get(f"/api/v1/dead-letters/{letter['id']}").json() == {
        **letter,
        "earlier_attempts": [],
    }
    retried = web.client.post(f"/api/v1/dead-letters/{letter['id']}/retry", json={})
    assert retried.status_code == 200 and retried.json()["partition"] == 3
    assert web.redis.xlen(keys.stream(3)) == 1
    assert web.client.get(f"/api/v1/dead-letters/{letter['id']}").status_code == 404
    web.redis.xadd(keys.DEAD_LETTERS, {
        "partition": 3, "entry": "6-0", "operation_id": "", "reason": "malformed",
        "error": '{"code": "invalid_request", "message": "bad"}', "deliveries": 1,
        "at_ms": 1, "op": "",
    })  # fmt: skip
    [other] = web.client.get("/api/v1/dead-letters").json()["items"]
    assert web.client.post(f"/api/v1/dead-letters/{other['id']}/retry").status_code == 422
    assert web.client.delete(f"/api/v1/dead-letters/{other['id']}").status_code == 204
    assert web.client.delete(f"/api/v1/dead-letters/{other['id']}").status_code == 404
    audit = web.client.get("/api/v1/audit").json()["items"]
    assert [(a["action"], a["target"]) for a in audit[:2]] == [
        ("dead_letter.discard", other["id"]),
        ("dead_letter.retry", letter["id"]),
    ]


def test_metrics_and_health(web: Web, start_worker: Any, scope: dict[str, str]) -> None:
    with start_worker(web.store):
        web.producer.remember(scope, "Counted.").wait(10)
    text = web.client.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    assert "# TYPE engram_ops_committed_total counter" in text.text
    assert "engram_ops_committed_total 1" in text.text.splitlines()
    assert 'engram_stream_lag{partition="0"} 0' in text.text
    health = web.client.get("/healthz")
    assert health.status_code == 200 and health.json() == {
        "status": "ok", "postgres": "ok", "redis": "ok",
    }  # fmt: skip
    assert datetime.now(UTC)  # the probe reads nothing else
