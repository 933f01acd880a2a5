"""Retry or discard every dead letter a filter matches: a dry run first (how many, which;
nothing changes), then the action confirmed with what the dry run saw (refused when the
matching letters changed), each letter audited with who and why. Real valkey and
PostgreSQL, through the API and the dashboard's forms."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engram import exits
from engram.cli import main
from engram.store import Operation
from engram.worker import keys
from engram.worker.protocol import encode_entry, partition_of
from tests.redis_fixtures import FAST
from tests.web_fixtures import Web


def letter(web: Web, reason: str, *, user: str = "ada", partition: int | None = None) -> str:
    """A dead letter of a valid operation (on its own partition unless told otherwise)."""
    op = Operation.build("forget", {"user_id": user}, {"id": "mem_x"})
    home = partition_of(op.scope, FAST.partitions)
    fields = {
        "partition": home if partition is None else partition, "entry": "5-0",
        "operation_id": op.operation_id, "reason": reason,
        "error": '{"code": "dead_lettered", "message": "no"}', "deliveries": 3, "at_ms": 1,
        "op": encode_entry(op)["op"],
    }  # fmt: skip
    return web.redis.xadd(keys.DEAD_LETTERS, fields).decode()  # type: ignore[arg-type,union-attr]


def stream(web: Web) -> list[Any]:
    return web.redis.xrange(keys.DEAD_LETTERS)  # type: ignore[return-value]


def mark(web: Web) -> int:
    """The newest audit row's id so far (the suite's database is shared by the tests)."""
    items = web.store.audit.page(limit=1).items
    return items[0].id if items else 0


def audited(web: Web, since: int) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (e.requested_by, e.action, e.target, e.detail)
        for e in web.store.audit.page(limit=200).items
        if e.id > since
    ]


def test_a_dry_run_counts_and_lists_and_changes_nothing(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    since = mark(web)
    failed = [letter(web, "failed", user=f"u{i}") for i in range(25)]
    letter(web, "deliveries")
    before = stream(web)
    dry = web.client.post(
        "/api/v1/bulk/dead-letters", json={"action": "discard", "filter": {"reason": "failed"}}
    )
    assert dry.status_code == 200, dry.text
    body = dry.json()
    assert body["dry_run"] is True and body["count"] == 25
    assert [x["id"] for x in body["items"]] == failed[::-1][:20]
    assert body["confirm"] == {"count": 25, "digest": body["digest"]}
    assert stream(web) == before and audited(web, since) == []
    page = web.client.get("/dead-letters/bulk?action=discard&reason=failed")
    assert page.status_code == 200 and "25</strong> dead letters would be discarded" in page.text
    assert stream(web) == before


def test_a_confirmed_discard_takes_the_letters_and_audits_who_and_why(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    since = mark(web)
    gone = [letter(web, "failed", user=f"u{i}") for i in range(3)]
    kept = letter(web, "deliveries")
    confirm = web.client.post(
        "/api/v1/bulk/dead-letters", json={"action": "discard", "filter": {"reason": "failed"}}
    ).json()["confirm"]
    done = web.client.post(
        "/api/v1/bulk/dead-letters",
        json={"action": "discard", "filter": {"reason": "failed"}, "confirm": confirm,
              "reason": "the embedder outage is over"},
    )  # fmt: skip
    assert done.status_code == 200 and done.json()["dry_run"] is False
    assert [i.decode() for i, _ in stream(web)] == [kept]
    rows = audited(web, since)
    assert sorted(t for _, _, t, _ in rows) == sorted(gone)
    assert {(who, action) for who, action, _, _ in rows} == {("local", "dead_letter.discard")}
    assert all(d["reason"] == "the embedder outage is over" and d["bulk"] == 3 for *_, d in rows)
    assert "the embedder outage is over" in web.client.get("/audit").text


def test_a_selection_that_changed_is_refused(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    since = mark(web)
    letter(web, "failed", user="a")
    ask = {"action": "retry", "filter": {"reason": "failed"}}
    confirm = web.client.post("/api/v1/bulk/dead-letters", json=ask).json()["confirm"]
    letter(web, "failed", user="b")  # arrives between the dry run and the confirmation
    before = stream(web)
    refused = web.client.post("/api/v1/bulk/dead-letters", json={**ask, "confirm": confirm})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "selection_changed"
    assert stream(web) == before and audited(web, since) == []
    # The same number but other letters is refused too.
    web.redis.xdel(keys.DEAD_LETTERS, before[-1][0])
    swapped = letter(web, "failed", user="c")
    web.redis.xdel(keys.DEAD_LETTERS, before[0][0])
    again = web.client.post("/api/v1/bulk/dead-letters", json={**ask, "confirm": confirm})
    assert again.status_code == 409 and [i.decode() for i, _ in stream(web)] == [swapped]


def test_a_bulk_retry_leaves_what_can_never_succeed_and_moves_a_stray_home(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    since = mark(web)
    for p in range(FAST.partitions):
        web.redis.delete(keys.stream(p))
    home = partition_of({"user_id": "ada"}, FAST.partitions)
    stray = letter(web, "malformed", partition=(home + 1) % FAST.partitions)  # wrong partition
    garbage = web.redis.xadd(keys.DEAD_LETTERS, {  # type: ignore[union-attr]
        "partition": 0, "entry": "6-0", "operation_id": "", "reason": "malformed",
        "error": '{"code": "invalid_request", "message": "bad"}', "deliveries": 1,
        "at_ms": 1, "op": "{not json",
    }).decode()  # fmt: skip
    ask: dict[str, Any] = {"action": "retry", "filter": {"reason": "malformed"}}
    dry = web.client.post("/api/v1/bulk/dead-letters", json=ask).json()
    assert dry["count"] == 1 and dry["left"] == [garbage]
    assert [x["id"] for x in dry["items"]] == [stray]
    done = web.client.post(
        "/api/v1/bulk/dead-letters", json={**ask, "confirm": dry["confirm"], "reason": "moved"}
    )
    assert done.status_code == 200
    assert web.redis.xlen(keys.stream(home)) == 1  # on the partition its scope belongs to
    assert [i.decode() for i, _ in stream(web)] == [garbage]
    [(who, action, target, detail)] = audited(web, since)
    assert (who, action, target, detail["partition"]) == ("local", "dead_letter.retry", stray, home)
    # The letter is gone; what it went through is kept in the audit row.
    assert (detail["dead_reason"], detail["deliveries"], detail["error_code"]) == (
        "malformed", 3, "dead_lettered",
    )  # fmt: skip
    single = web.client.post(f"/api/v1/dead-letters/{garbage}/retry", json={})
    assert single.status_code == 422  # never offered: it can only be discarded
    assert "it can only be discarded" in web.client.get(f"/dead-letters/{garbage}").text


def test_single_actions_take_a_reason_and_a_discard_asks_first(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    since = mark(web)
    one, two = letter(web, "failed", user="a"), letter(web, "failed", user="b")
    too_long = web.client.request(
        "DELETE", f"/api/v1/dead-letters/{one}", json={"reason": "x" * 201}
    )
    assert too_long.status_code == 400 and len(stream(web)) == 2
    gone = web.client.request(
        "DELETE", f"/api/v1/dead-letters/{one}", json={"reason": "a duplicate"}
    )
    assert gone.status_code == 204
    asked = web.client.get(f"/dead-letters/{two}/discard")
    assert asked.status_code == 200 and "Discard for good" in asked.text
    assert len(stream(web)) == 1  # asking changed nothing
    token = web.csrf(f"/dead-letters/{two}/discard")
    posted = web.client.post(
        f"/dead-letters/{two}/discard", data={"csrf": token, "why": "tested by hand"}
    )
    assert posted.status_code == 303 and stream(web) == []
    assert [(t, d.get("reason")) for _, _, t, d in audited(web, since)] == [
        (two, "tested by hand"), (one, "a duplicate"),
    ]  # fmt: skip


def test_the_dashboard_form_confirms_what_the_dry_run_showed(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    since = mark(web)
    letter(web, "failed", user="a")
    kept = letter(web, "deliveries")
    page = web.client.get("/dead-letters/bulk?action=discard&reason=failed")
    token = web.csrf("/dead-letters/bulk?action=discard&reason=failed")
    form = dict(
        (name, page.text.split(f'name="{name}" value="', 1)[1].split('"', 1)[0])
        for name in ("action", "reason", "partition", "count", "digest")
    )
    assert form["count"] == "1"
    no_csrf = web.client.post("/dead-letters/bulk", data={**form, "why": "w"})
    assert no_csrf.status_code == 403 and len(stream(web)) == 2
    done = web.client.post("/dead-letters/bulk", data={**form, "csrf": token, "why": "w"})
    assert done.status_code == 200 and "Discarded 1 dead letter" in done.text
    assert 'href="/dead-letters?reason=failed"' in done.text  # the list, the filter kept
    assert [i.decode() for i, _ in stream(web)] == [kept]
    assert json.dumps(audited(web, since)[0][3]).count('"reason": "w"') == 1


def test_the_cli_dry_runs_then_confirms_and_audits_who_and_why(
    web: Web,
    dsn: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in (("DATABASE_URL", dsn), ("REDIS_URL", redis_url),
                        ("ENGRAM_PARTITIONS", str(FAST.partitions))):  # fmt: skip
        monkeypatch.setenv(name, value)

    def cli(*argv: str) -> tuple[int, Any]:
        code = main(["dead-letters", *argv])
        out = capsys.readouterr().out
        return code, json.loads(out) if out else None

    web.redis.delete(keys.DEAD_LETTERS)
    since = mark(web)
    gone = [letter(web, "failed", user=f"u{i}") for i in range(2)]
    kept = letter(web, "deliveries")
    before = stream(web)
    code, dry = cli("discard", "--all", "--filter-reason", "failed")
    assert code == 0 and dry["count"] == 2 and [x["id"] for x in dry["dead_letters"]] == gone[::-1]
    assert stream(web) == before and audited(web, since) == []
    letter(web, "failed", user="late")
    code, _ = cli("discard", "--all", "--filter-reason", "failed", "--confirm", dry["confirm"])
    assert code == exits.REFUSED and len(stream(web)) == 4  # the selection changed: refused
    code, dry = cli("discard", "--all", "--filter-reason", "failed")
    code, done = cli("discard", "--all", "--filter-reason", "failed",
                     "--confirm", dry["confirm"], "--reason", "duplicates")  # fmt: skip
    assert code == 0 and done["done"] == 3
    assert [i.decode() for i, _ in stream(web)] == [kept]
    code, _ = cli("retry", kept, "--reason", "the model is back")
    assert code == 0 and stream(web) == []
    rows = audited(web, since)
    assert rows[0][1:3] == ("dead_letter.retry", kept)
    assert rows[0][0].startswith("cli:") and rows[0][3]["reason"] == "the model is back"
    assert {(a, d["reason"]) for _, a, _, d in rows[1:]} == {("dead_letter.discard", "duplicates")}


def test_a_letter_dead_again_shows_what_its_earlier_letters_went_through(
    web: Web,
    dsn: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A retry removes the letter; when the operation is dead-lettered again, its new
    letter lists the attempts before it (the dashboard, the API and the CLI alike)."""
    web.redis.delete(keys.DEAD_LETTERS)
    first = letter(web, "failed", user="history")
    [(_, fields)] = stream(web)
    op_id = fields[b"operation_id"].decode()
    retried = web.client.post(
        f"/api/v1/dead-letters/{first}/retry", json={"reason": "the database is back"}
    )
    assert retried.status_code == 200, retried.text
    # The worker fails it again: a new letter of the same operation.
    again = web.redis.xadd(  # type: ignore[union-attr]
        keys.DEAD_LETTERS,
        {**{k.decode(): v for k, v in fields.items()}, "reason": "deliveries", "deliveries": 5},
    ).decode()

    [attempt] = web.client.get(f"/api/v1/dead-letters/{again}").json()["earlier_attempts"]
    assert attempt["requested_by"] == "local" and attempt["target"] == first
    assert {k: attempt["detail"][k] for k in ("reason", "dead_reason", "deliveries")} == {
        "reason": "the database is back",
        "dead_reason": "failed",
        "deliveries": 3,
    }
    page = web.client.get(f"/dead-letters/{again}").text
    table = page[page.index('id="earlier-attempts"') :]
    assert "the database is back" in table and ">failed<" in table
    listed = web.client.get("/api/v1/dead-letters").json()["items"]
    assert [x["id"] for x in listed] == [again] and "earlier_attempts" not in listed[0]

    for name, value in (("DATABASE_URL", dsn), ("REDIS_URL", redis_url),
                        ("ENGRAM_PARTITIONS", str(FAST.partitions))):  # fmt: skip
        monkeypatch.setenv(name, value)
    assert main(["dead-letters", "show", again, "--json"]) == exits.OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["operation_id"] == op_id and shown["at"].startswith("1970-01-01T00:00:00")
    assert [(a["by"], a["reason"], a["dead_reason"]) for a in shown["earlier_attempts"]] == [
        ("local", "the database is back", "failed")
    ]
