"""The lists' filters, kept in the URL: receipts by scope fields and by the beginning of a
record id or of who asked; dead letters by reason, error code, partition, operation kind
and time (the bulk actions too); jobs by queue, state and function, with the scheduled
maintenance ticks hidden unless asked. Each filter shows exactly the matching rows, and a
bad value is a 400 that changes nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest
import redis
from rq import Queue
from rq.results import Result

from engram.jobs.keys import MAINTENANCE_QUEUE, REDACTION_QUEUE
from engram.jobs.queues import SERIALIZER
from engram.store import Operation, ReceiptFilter, Store
from engram.store.read.receipt_filter import prefix_end, receipt_clauses
from engram.web import rqjobs
from engram.worker import keys
from engram.worker.protocol import encode_entry
from tests.web_fixtures import EMBEDDER, Web

# -- receipts ---------------------------------------------------------------------------


def _ops(web: Web, query: str) -> list[str]:
    """The operation ids the API lists for this filter, every page."""
    found, cursor = [], ""
    while True:
        answer = web.client.get(f"/api/v1/receipts?limit=2&{query}{cursor}")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        found += [r["operation_id"] for r in body["items"]]
        if body["next"] is None:
            return found
        cursor = f"&cursor={body['next']}"


def _write(web: Web, scope: dict[str, str], op_id: str, **request: Any) -> None:
    by = request.pop("requested_by", None)
    op = Operation.build("remember", scope, {"text": "x", **request}, op_id, requested_by=by)
    web.store.execute([op], EMBEDDER)


def test_receipts_by_scope_fields_match_every_scope_with_them(web: Web) -> None:
    _write(web, {"user_id": "sf-ada", "agent_id": "sf-a1"}, "sf:1")
    _write(web, {"user_id": "sf-ada", "agent_id": "sf-a2"}, "sf:2")
    _write(web, {"user_id": "sf-ada"}, "sf:3")
    _write(web, {"user_id": "sf-bob", "agent_id": "sf-a1"}, "sf:4")
    _write(web, {"user_id": "sf-ada2"}, "sf:5")  # begins like sf-ada: not a match
    assert _ops(web, "user_id=sf-ada") == ["sf:3", "sf:2", "sf:1"]
    assert _ops(web, "user_id=sf-ada&agent_id=sf-a1") == ["sf:1"]
    assert _ops(web, "agent_id=sf-a1") == ["sf:4", "sf:1"]
    assert _ops(web, "agent_id=sf-a1&kind=forget") == []
    page = web.client.get("/receipts?user_id=sf-ada&agent_id=sf-a1")
    assert page.status_code == 200
    assert "sf:1" in page.text and "sf:2" not in page.text and "sf:4" not in page.text
    assert 'name="agent_id" value="sf-a1"' in page.text  # the form shows the filter


def test_receipts_by_the_beginning_of_a_record_id(web: Web) -> None:
    for n, rid in enumerate(["rp%x", "rp_1", "rpz", "rp\\q", "rp%y2"]):
        _write(web, {"user_id": "rp"}, f"rp:{n}", id=rid)
    _write(web, {"user_id": "rp"}, "rq:0", id="rq")  # just past every rp…: not a match
    assert _ops(web, "record_prefix=rp%25") == ["rp:4", "rp:0"]  # % is no wildcard
    assert _ops(web, "record_prefix=rp_") == ["rp:1"]  # nor _
    assert _ops(web, "record_prefix=rp%5C") == ["rp:3"]  # nor \
    assert sorted(_ops(web, "record_prefix=rp")) == [f"rp:{n}" for n in range(5)]
    assert _ops(web, "record=rp%25x") == ["rp:0"]  # the exact one stays
    page = web.client.get("/receipts?record_prefix=rp_")
    assert "rp:1" in page.text and "rp:0" not in page.text
    assert 'name="record_prefix" value="rp_"' in page.text


def test_a_forget_is_found_by_the_beginning_of_the_id_it_erased(web: Web) -> None:
    _write(web, {"user_id": "fp"}, "fp:write", id="fp-gone-1")
    forget = Operation.build("forget", {"user_id": "fp"}, {"id": "fp-gone-1"}, "fp:forget")
    web.store.execute([forget], EMBEDDER)
    assert _ops(web, "record_prefix=fp-gone") == ["fp:forget", "fp:write"]


def test_receipts_by_the_beginning_of_who_asked(web: Web) -> None:
    for n, by in enumerate(["ab%c", "ab_c", "abxc", "zab", "ac"]):
        _write(web, {"user_id": "ab"}, f"ab:{n}", requested_by=by)
    assert _ops(web, "requested_by_prefix=ab%25") == ["ab:0"]
    assert _ops(web, "requested_by_prefix=ab_") == ["ab:1"]
    assert _ops(web, "requested_by_prefix=ab") == ["ab:2", "ab:1", "ab:0"]
    assert _ops(web, "requested_by=abxc") == ["ab:2"]
    assert _ops(web, "requested_by_prefix=ab&user_id=ab&kind=forget") == []


@pytest.mark.parametrize(
    "query",
    [
        "record_prefix=" + "x" * 201,
        "requested_by_prefix=%20%20",
        "user_id=" + "u" * 201,
        "user_id=a%00b",
        "scope_key=x",
        "since=yesterday",
        "kind=drop",
        "user_id=a&user_id=b",
    ],
)
def test_bad_receipt_filters_are_refused(web: Web, query: str) -> None:
    for path in ("/api/v1/receipts", "/receipts"):
        answer = web.client.get(f"{path}?{query}")
        assert answer.status_code == 400, (path, query, answer.text[:200])
    body = web.client.get(f"/api/v1/receipts?{query}").json()
    assert body["error"]["code"] == "invalid_request"


def test_the_end_of_a_prefix() -> None:
    assert prefix_end("ab") == "ac"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None
    assert prefix_end("a\ud7ff") == "a\ue000"


def test_prefixes_and_scope_fields_are_read_through_indexes(
    fresh_store: Store, fresh_dsn: str
) -> None:
    """With a few thousand receipts, a rare prefix is an index range scan, not a read of
    every receipt (migration 011; the tombstones' through 009)."""
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO engram_scopes (key, user_id, agent_id)"
            " SELECT 'k' || i, 'u' || (i % 50), 'a' || (i % 7) FROM generate_series(1, 500) i"
        )
        conn.execute(
            "INSERT INTO engram_receipts (operation_id, scope_id, kind, request_digest,"
            " scope_revision, committed_at, requested_by)"
            " SELECT 'op' || i, 1 + i % 500, 'remember', '', i, now() - i * interval '1 s',"
            " 'user-' || i FROM generate_series(1, 5000) i"
        )
        conn.execute(
            "INSERT INTO engram_receipt_records"
            " (scope_id, operation_id, record_id, revision, status)"
            " SELECT 1 + i % 500, 'op' || i, 'mem_' || md5(i::text), 1, 'active'"
            " FROM generate_series(1, 5000) i"
        )
        conn.execute(
            "INSERT INTO engram_forgotten (record_id, scope_id, forgotten_at, operation_id)"
            " SELECT 'mem_f' || md5(i::text), 1, now(), 'op' || i"
            " FROM generate_series(1, 2000) i"
        )
        conn.execute("ANALYZE")

        def plan(where: ReceiptFilter) -> str:
            clauses, params = receipt_clauses(where)
            rows = conn.execute(
                "EXPLAIN SELECT c.operation_id FROM engram_receipts c"
                " JOIN engram_scopes s ON s.id = c.scope_id"
                f" WHERE {' AND '.join(clauses)}"
                " ORDER BY c.committed_at DESC, c.operation_id DESC LIMIT 51",
                params,
            ).fetchall()
            return "\n".join(r[0] for r in rows)

        by_record = plan(ReceiptFilter(record_prefix="mem_ab"))
        assert "engram_receipt_records_record_idx" in by_record, by_record
        assert "engram_forgotten_id_c_idx" in by_record, by_record
        by_asker = plan(ReceiptFilter(requested_by_prefix="user-123"))
        assert "engram_receipts_requested_idx" in by_asker, by_asker
        assert "Seq Scan on engram_receipts" not in by_asker, by_asker
        exact = plan(ReceiptFilter(requested_by="user-123"))
        assert "engram_receipts_requested_idx" in exact, exact
        by_scope = plan(ReceiptFilter(scope={"user_id": "u3", "agent_id": "a3"}))
        assert "Seq Scan" not in by_scope, by_scope


# -- dead letters ------------------------------------------------------------------------

T0 = 1_700_000_000_000


def add_letter(
    client: redis.Redis, reason: str, code: str, kind: str | None, partition: int, at_ms: int
) -> str:
    if kind is None:
        op = "{not json"
    else:
        request = {"id": "mem_x"} if kind in ("forget", "retract") else {"text": "t"}
        op = encode_entry(Operation.build(kind, {"user_id": "dl"}, request))["op"]
    fields = {
        "partition": partition, "entry": "5-0", "operation_id": f"dl:{at_ms}", "reason": reason,
        "error": json.dumps({"code": code, "message": "no"}), "deliveries": 1,
        "at_ms": at_ms, "op": op,
    }  # fmt: skip
    return client.xadd(keys.DEAD_LETTERS, fields).decode()  # type: ignore[arg-type,union-attr]


@pytest.fixture
def letters(web: Web) -> dict[str, str]:
    web.redis.delete(keys.DEAD_LETTERS)
    return {
        "a": add_letter(web.redis, "failed", "dead_lettered", "forget", 0, T0),
        "b": add_letter(web.redis, "failed", "store_unavailable", "remember", 1, T0 + 60_000),
        "c": add_letter(web.redis, "deliveries", "dead_lettered", "remember", 1, T0 + 120_000),
        "d": add_letter(web.redis, "malformed", "invalid_request", None, 0, T0 + 180_000),
        "e": web.redis.xadd(keys.DEAD_LETTERS, {"junk": "1"}).decode(),  # type: ignore[union-attr]
    }


def _letters(web: Web, query: str) -> list[str]:
    answer = web.client.get(f"/api/v1/dead-letters?{query}")
    assert answer.status_code == 200, answer.text
    return [x["id"] for x in answer.json()["items"]]


def test_dead_letters_by_each_filter(web: Web, letters: dict[str, str]) -> None:
    ids = {v: k for k, v in letters.items()}

    def names(query: str) -> str:
        return "".join(sorted(ids[i] for i in _letters(web, query)))

    assert names("") == "abcde"
    assert names("code=dead_lettered") == "a"  # c: too_many_deliveries, its own code
    assert names("code=dead_lettered&reason=failed") == "a"
    assert names("code=too_many_deliveries") == "c"
    assert names("code=too_many&code_match=prefix") == "c"
    assert names("code=too_many&code_match=exact") == ""
    assert names("kind=remember") == "bc"
    assert names("kind=forget") == "a"  # the malformed ones have no kind
    assert names("partition=1&kind=remember&code=store_unavailable") == "b"
    assert names("since=2023-11-14T22:14:20") == "bcd"  # T0 + 60 s, UTC
    assert names("since=2023-11-14T22:14:20Z&until=2023-11-14T22:16:20%2B00:00") == "bc"
    assert names("until=2023-11-14T22:13:20.001") == "ae"  # the garbage one is at 0
    assert names("code=nothing_like_it") == ""
    page = web.client.get("/dead-letters?kind=remember&code=too_many_deliveries")
    assert page.status_code == 200
    assert letters["c"] in page.text and letters["b"] not in page.text
    assert 'name="code" maxlength="64" value="too_many_deliveries"' in page.text
    assert '<option value="remember" selected>' in page.text


@pytest.mark.parametrize(
    "query",
    [
        "partition=-1",
        "partition=x",
        "partition=%D9%A3",  # an Arabic-Indic three
        "kind=drop",
        "reason=bored",
        "code=a%20b",
        "code=" + "c" * 65,
        "code=x&code_match=suffix",
        "since=soon",
        "until=2023-13-01",
        "colour=red",
    ],
)
def test_bad_dead_letter_filters_are_refused(web: Web, letters: dict[str, str], query: str) -> None:
    for path in ("/api/v1/dead-letters", "/dead-letters", "/dead-letters/bulk"):
        answer = web.client.get(f"{path}?{query}")
        assert answer.status_code == 400, (path, query, answer.text[:300])
    assert web.client.get(f"/api/v1/dead-letters?{query}").json()["error"]["code"] == (
        "invalid_request"
    )
    assert web.redis.xlen(keys.DEAD_LETTERS) == 5


def test_a_bulk_discard_takes_only_what_the_whole_filter_matches(
    web: Web, letters: dict[str, str]
) -> None:
    query = "action=discard&code=too_many_deliveries&kind=remember&since=2023-11-14T22:14:00"
    listed = web.client.get(
        "/dead-letters?code=too_many_deliveries&kind=remember&since=2023-11-14T22:14:00"
    )
    assert (
        "/dead-letters/bulk?action=discard&amp;code=too_many_deliveries&amp;code_match=exact"
        "&amp;kind=remember" in listed.text
    )
    dry = web.client.get(f"/dead-letters/bulk?{query}")
    assert dry.status_code == 200 and '<strong class="bulk-count">1</strong>' in dry.text
    for name, value in [
        ("code", "too_many_deliveries"), ("code_match", "exact"), ("kind", "remember"),
        ("reason", ""),
    ]:  # fmt: skip
        assert f'<input type="hidden" name="{name}" value="{value}">' in dry.text
    assert 'name="since" value="2023-11-14T22:14:00.000+00:00"' in dry.text
    form = _hidden_fields(dry.text)
    assert web.redis.xlen(keys.DEAD_LETTERS) == 5  # the dry run changed nothing
    done = web.client.post("/dead-letters/bulk", data={**form, "why": "test"})
    assert done.status_code == 200, done.text
    assert "Discarded 1 dead letter" in done.text and "code=too_many_deliveries" in done.text
    left = {i.decode() for i, _ in web.redis.xrange(keys.DEAD_LETTERS)}  # type: ignore[union-attr]
    assert left == set(letters.values()) - {letters["c"]}


def test_the_api_bulk_takes_the_new_filter_fields(web: Web, letters: dict[str, str]) -> None:
    ask = {"action": "discard", "filter": {"kind": "remember", "until": "2023-11-14T22:15:00Z"}}
    dry = web.client.post("/api/v1/bulk/dead-letters", json=ask)
    assert dry.status_code == 200, dry.text
    body = dry.json()
    assert body["count"] == 1 and [x["id"] for x in body["items"]] == [letters["b"]]
    assert body["filter"]["kind"] == "remember" and body["filter"]["code"] is None
    bad = web.client.post("/api/v1/bulk/dead-letters", json={**ask, "filter": {"kind": "x"}})
    assert bad.status_code == 400
    unknown = web.client.post("/api/v1/bulk/dead-letters", json={**ask, "filter": {"who": 1}})
    assert unknown.status_code == 422
    web.client.post("/api/v1/bulk/dead-letters", json={**ask, "confirm": body["confirm"]})
    assert letters["b"] not in _letters(web, "") and len(_letters(web, "")) == 4


def test_a_bulk_post_with_a_bad_filter_changes_nothing(web: Web, letters: dict[str, str]) -> None:
    token = web.csrf("/dead-letters")
    for bad in ({"kind": "drop"}, {"since": "never"}, {"code": "a b"}, {"partition": "-2"}):
        answer = web.client.post(
            "/dead-letters/bulk",
            data={"csrf": token, "action": "discard", "count": "5", "digest": "x", **bad},
        )
        assert answer.status_code == 400, (bad, answer.text[:200])
    assert web.redis.xlen(keys.DEAD_LETTERS) == 5


def test_dead_letters_page_by_their_limit_newest_first(web: Web, letters: dict[str, str]) -> None:
    """Five letters by two: 2, 2 and 1, each once, the last page with no next; a page
    that ends exactly on the last letter has no next either."""
    seen, cursor, sizes = [], "", []
    while True:
        page = web.client.get(f"/api/v1/dead-letters?limit=2{cursor}").json()
        sizes.append(len(page["items"]))
        seen += [x["id"] for x in page["items"]]
        if page["next"] is None:
            break
        cursor = f"&cursor={page['next']}"
    assert sizes == [2, 2, 1]
    assert seen == sorted(letters.values(), key=lambda i: tuple(map(int, i.split("-"))))[::-1]
    whole = web.client.get("/api/v1/dead-letters?limit=5").json()
    assert len(whole["items"]) == 5 and whole["next"] is None


def test_a_filtered_page_reads_a_bounded_number_of_letters(web: Web) -> None:
    """6,000 letters, the only forget the oldest: the first page stops at its bound and
    says so, and its next page searches on and finds it."""
    web.redis.delete(keys.DEAD_LETTERS)
    wanted = add_letter(web.redis, "failed", "dead_lettered", "forget", 0, T0)
    pipe = web.redis.pipeline(transaction=False)
    for i in range(6_000):
        pipe.xadd(keys.DEAD_LETTERS, {
            "partition": 0, "entry": "5-0", "operation_id": f"n:{i}", "reason": "failed",
            "error": '{"code": "x"}', "deliveries": 1, "at_ms": T0 + i,
            "op": '{"kind": "remember"}',
        })  # fmt: skip
    pipe.execute()
    first = web.client.get("/api/v1/dead-letters?kind=forget").json()
    assert first["items"] == [] and first["next"] is not None
    page = web.client.get("/dead-letters?kind=forget")
    assert "Searched 5,000 letters" in page.text and "next page" in page.text
    second = web.client.get(f"/api/v1/dead-letters?kind=forget&cursor={first['next']}").json()
    assert [x["id"] for x in second["items"]] == [wanted] and second["next"] is None
    web.redis.delete(keys.DEAD_LETTERS)


def _malformed(client: redis.Redis, cause: str, i: int) -> str:
    """A letter dead-lettered as malformed, as a worker writes it: its error's class code
    is ``invalid_request`` whatever the cause, its own code the cause."""
    error = {"code": "invalid_request", "message": f"the entry is not valid ({i})", "cause": cause}
    fields = {
        "partition": 0, "entry": f"{i}-0", "operation_id": f"m:{i}", "reason": "malformed",
        "error": json.dumps(error), "deliveries": 1, "at_ms": T0 + i, "op": "{}",
    }  # fmt: skip
    return client.xadd(keys.DEAD_LETTERS, fields).decode()  # type: ignore[arg-type,union-attr]


def test_a_code_filter_takes_that_code_only_and_the_dry_run_shows_each_code(web: Web) -> None:
    """Issue 42, item 1: ``code=invalid_request`` matched 8 letters, not 5 (the error's
    class code of ``invalid_json``, ``unknown_kind`` and ``invalid_entry`` letters is
    ``invalid_request`` too), the dry run showed no code, and "Discard these 8" removed
    them. The code matches exactly; a prefix is a choice of its own, shown as such."""
    web.redis.delete(keys.DEAD_LETTERS)
    wanted = {_malformed(web.redis, "invalid_request", i) for i in range(5)}
    others = {
        cause: _malformed(web.redis, cause, 10 + i)
        for i, cause in enumerate(("invalid_json", "unknown_kind", "invalid_entry"))
    }
    assert set(_letters(web, "code=invalid_request")) == wanted
    assert set(_letters(web, "code=invalid_&code_match=prefix")) == wanted | {
        others["invalid_json"], others["invalid_entry"],
    }  # fmt: skip
    assert set(_letters(web, "code=invalid_")) == set()

    dry = web.client.get("/dead-letters/bulk?action=discard&code=invalid_request")
    assert dry.status_code == 200 and '<strong class="bulk-count">5</strong>' in dry.text
    assert 'code exactly <span class="mono code">invalid_request</span>' in dry.text
    # Each letter with its code and cause, and the count by code.
    rows = dry.text.split("<tbody>", 1)[1].split("</tbody>", 1)[0].split("<tr>")[1:]
    assert len(rows) == 5
    for row in rows:
        assert '<span class="mono code">invalid_request</span>' in row
        assert "the entry is not valid" in row
    assert 'By code: <span class="mono code">invalid_request</span> 5.' in dry.text
    assert web.redis.xlen(keys.DEAD_LETTERS) == 8  # the dry run changed nothing
    done = web.client.post("/dead-letters/bulk", data={**_hidden_fields(dry.text), "why": "t"})
    assert done.status_code == 200 and "Discarded 5 dead letters" in done.text
    left = {i.decode() for i, _ in web.redis.xrange(keys.DEAD_LETTERS)}  # type: ignore[union-attr]
    assert left == set(others.values())

    # The prefix, asked for: the dry run says so, and counts each code it takes.
    dry = web.client.get("/dead-letters/bulk?action=discard&code=invalid_&code_match=prefix")
    assert '<strong class="bulk-count">2</strong>' in dry.text
    assert 'code beginning with <span class="mono code">invalid_</span>' in dry.text
    assert (
        'By code: <span class="mono code">invalid_entry</span> 1, '
        '<span class="mono code">invalid_json</span> 1.'
    ) in dry.text
    assert '<input type="hidden" name="code_match" value="prefix">' in dry.text
    api = web.client.post(
        "/api/v1/bulk/dead-letters",
        json={"action": "discard", "filter": {"code": "invalid_request"}},
    ).json()
    assert api["count"] == 0 and api["filter"]["code_match"] == "exact"


def _hidden_fields(html: str) -> dict[str, str]:
    form = html[html.index('<form method="post" action="/dead-letters/bulk"') :]
    form = form[: form.index("</form>")]
    found = {}
    for part in form.split('<input type="hidden" name="')[1:]:
        name, rest = part.split('"', 1)
        found[name] = rest.split('value="', 1)[1].split('"', 1)[0].replace("&#43;", "+")
    return found


# -- jobs --------------------------------------------------------------------------------

PRUNE = "engram.jobs.prune.prune_job"
REDACT = "engram.jobs.redaction.redact"
INDEX = "engram.jobs.indexes.index_large_scopes_job"
PURGE = "engram.jobs.indexes.purge_retired_job"


def failed(client: redis.Redis, queue_name: str, function: str, job_id: str, at: float) -> None:
    """A failed job as RQ leaves one (its hash, its failure, its entry in the registry),
    never run."""
    queue = Queue(queue_name, connection=client, serializer=SERIALIZER)
    job = queue.enqueue(function, "history", job_id=job_id, result_ttl=86_400)
    client.lrem(queue.key, 0, job.id)
    client.hset(job.key, "status", "failed")
    Result.create_failure(job, 86_400, "Traceback (most recent call last):\nValueError: x")
    client.zadd(queue.failed_job_registry.key, {job_id: at})


def seed_failed_jobs(client: redis.Redis) -> None:
    """In the maintenance queue: a prune asked for by hand, and three ticks; in the
    redaction queue, a redaction."""
    for name in (MAINTENANCE_QUEUE, REDACTION_QUEUE):
        queue = Queue(name, connection=client, serializer=SERIALIZER)
        client.delete(queue.key, queue.failed_job_registry.key)
    now = time.time() + 86_400
    failed(client, MAINTENANCE_QUEUE, PRUNE, "prune-history-0123456789abcdef", now + 1)  # by hand
    failed(client, MAINTENANCE_QUEUE, PRUNE, "prune-history-481234", now + 2)  # a tick
    failed(client, MAINTENANCE_QUEUE, INDEX, "index-large-scopes-9", now + 3)
    failed(client, MAINTENANCE_QUEUE, PURGE, "purge-retired-vectors-9", now + 4)
    failed(client, REDACTION_QUEUE, REDACT, "redact-00aa", now + 5)


@pytest.fixture
def failed_jobs(web: Web) -> None:
    seed_failed_jobs(web.redis)


def _jobs(web: Web, query: str) -> list[str]:
    answer = web.client.get(f"/api/v1/jobs?{query}")
    assert answer.status_code == 200, answer.text
    return [j["id"] for j in answer.json()["items"]]


def test_the_functions_offered_are_those_engram_enqueues() -> None:
    assert set(rqjobs.JOB_FUNCTIONS) == {
        PRUNE,
        REDACT,
        "engram.jobs.reembed.run_slice",
        INDEX,
        "engram.jobs.indexes.settle_fresh_job",
        PURGE,
        "engram.jobs.redaction.repair_ledger_job",
    }
    assert rqjobs.is_tick("prune-dead-letters-491234") and rqjobs.is_tick("index-large-scopes-1")
    assert not rqjobs.is_tick("prune-history-0123456789abcdef")  # one asked for by hand
    assert not rqjobs.is_tick("reembed-1") and not rqjobs.is_tick("prune-history-")


def test_the_dashboard_hides_the_maintenance_ticks_unless_asked(
    web: Web, failed_jobs: None
) -> None:
    page = web.client.get(f"/jobs?queue={MAINTENANCE_QUEUE}&state=failed")
    assert page.status_code == 200
    assert "prune-history-0123456789abcdef" in page.text
    for tick in ("prune-history-481234", "index-large-scopes-9", "purge-retired-vectors-9"):
        assert f"/jobs/{tick}" not in page.text
    assert "3 maintenance ticks hidden on this page" in page.text
    shown = web.client.get(f"/jobs?queue={MAINTENANCE_QUEUE}&state=failed&ticks=show")
    assert "/jobs/index-large-scopes-9" in shown.text and "hidden on this page" not in shown.text
    assert 'name="ticks" value="show" checked' in shown.text
    # The queue's links keep the filter.
    assert f"/jobs?queue={REDACTION_QUEUE}&amp;state=failed&amp;ticks=show" in shown.text


def test_jobs_by_function(web: Web, failed_jobs: None) -> None:
    maintenance = f"queue={MAINTENANCE_QUEUE}&state=failed"
    assert _jobs(web, f"{maintenance}&function={PRUNE}") == [
        "prune-history-481234",
        "prune-history-0123456789abcdef",
    ]  # the API shows the ticks unless asked
    assert _jobs(web, f"{maintenance}&function={PRUNE}&ticks=hide") == [
        "prune-history-0123456789abcdef"
    ]
    assert _jobs(web, f"{maintenance}&ticks=hide") == ["prune-history-0123456789abcdef"]
    assert len(_jobs(web, maintenance)) == 4
    assert _jobs(web, f"{maintenance}&function={REDACT}") == []
    assert _jobs(web, f"queue={REDACTION_QUEUE}&state=failed&function={REDACT}") == ["redact-00aa"]
    page = web.client.get(f"/jobs?{maintenance}&function={PRUNE}")
    assert "/jobs/prune-history-0123456789abcdef" in page.text
    assert "/jobs/prune-history-481234" not in page.text
    assert "1 maintenance tick hidden on this page" in page.text
    assert f"<option selected>{PRUNE}</option>" in page.text


@pytest.mark.parametrize(
    "query", ["function=os.system", "function=jobs.prune", "ticks=maybe", "state=lost", "queue=x"]
)
def test_bad_job_filters_are_refused(web: Web, failed_jobs: None, query: str) -> None:
    for path in ("/api/v1/jobs", "/jobs"):
        answer = web.client.get(f"{path}?{query}")
        assert answer.status_code == 400, (path, query, answer.text[:200])
    body = web.client.get(f"/api/v1/jobs?{query}").json()
    assert body["error"]["code"] == "invalid_request"
    if query.startswith("function"):
        assert "function must be one of engram.jobs." in body["error"]["message"]


def test_a_function_filter_reads_a_bounded_number_of_jobs(web: Web, failed_jobs: None) -> None:
    """1,100 newer failed redactions hide the one prune the filter asks for: the first
    page stops at its bound and says so; its next page finds the prune."""
    queue = Queue(MAINTENANCE_QUEUE, connection=web.redis, serializer=SERIALIZER)
    web.redis.delete(queue.failed_job_registry.key)
    start = time.time() + 86_400
    failed(web.redis, MAINTENANCE_QUEUE, PRUNE, "prune-receipts-0123456789abcdef", start)
    failed(web.redis, MAINTENANCE_QUEUE, REDACT, "redact-model", start + 1)
    fields: Any = web.redis.hgetall("rq:job:redact-model")
    pipe = web.redis.pipeline(transaction=False)
    for i in range(1_100):
        pipe.hset(f"rq:job:redact-{i:04d}", mapping=fields)
        pipe.zadd(queue.failed_job_registry.key, {f"redact-{i:04d}": start + 2 + i})
    pipe.execute()
    query = f"queue={MAINTENANCE_QUEUE}&state=failed&function={PRUNE}"
    first = web.client.get(f"/api/v1/jobs?{query}").json()
    assert first["items"] == [] and first["next"] is not None
    page = web.client.get(f"/jobs?{query}")
    assert "Searched 1,000 jobs" in page.text and "next page" in page.text
    second = web.client.get(f"/api/v1/jobs?{query}&cursor={first['next']}").json()
    assert [j["id"] for j in second["items"]] == ["prune-receipts-0123456789abcdef"]
    assert second["next"] is None
