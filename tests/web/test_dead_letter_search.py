"""Dead-letter triage: search by operation id, record id and scope fields on the
dashboard, the API and ``engram dead-letters list``; the CLI's bulk action takes the
dashboard's code, kind and time filters (the same selection logic); ``show`` does not
print ``reason malformed`` next to ``malformed False``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engram.cli import main
from engram.store import Operation
from engram.store.errors import InvalidRequestError
from engram.worker import keys
from engram.worker.admin.deadletter_selection import Match, match_from
from engram.worker.protocol import encode_entry, partition_of
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST
from tests.web_fixtures import Web


def letter(
    web: Web,
    kind: str,
    user: str,
    record: str,
    *,
    code: str = "invalid_request",
    at_ms: int = 1_000,
    reason: str = "malformed",
) -> tuple[str, str]:
    """A dead letter of a ``kind`` operation about ``record`` in ``user``'s scope; its
    id and its operation's id."""
    request = {"id": record} if kind == "forget" else {"id": record, "text": "x"}
    op = Operation.build(kind, {"user_id": user, "agent_id": "bot"}, request)
    fields = {
        "partition": partition_of(op.scope, FAST.partitions), "entry": "5-0",
        "operation_id": op.operation_id, "reason": reason,
        "error": json.dumps({"code": code, "message": "no"}), "deliveries": 1, "at_ms": at_ms,
        "op": encode_entry(op)["op"],
    }  # fmt: skip
    dead_id = web.redis.xadd(keys.DEAD_LETTERS, fields).decode()  # type: ignore[arg-type,union-attr]
    return dead_id, op.operation_id


@pytest.fixture
def planted(web: Web) -> dict[str, tuple[str, str]]:
    web.redis.delete(keys.DEAD_LETTERS)
    return {
        "ada-forget": letter(web, "forget", "ada", "mem_a", at_ms=1_000),
        "ada-revise": letter(web, "revise", "ada", "mem_b", code="conflict", at_ms=2_000),
        "bob-forget": letter(web, "forget", "bob", "mem_b", code="conflict", at_ms=3_000),
    }


def test_the_dashboard_and_the_api_search_by_operation_record_and_scope(
    web: Web, planted: dict[str, tuple[str, str]]
) -> None:
    ids = {name: dead_id for name, (dead_id, _) in planted.items()}
    op_of_bob = planted["bob-forget"][1]

    def api(**query: str) -> list[str]:
        answer = web.client.get("/api/v1/dead-letters", params=query)
        assert answer.status_code == 200, answer.text
        return [x["id"] for x in answer.json()["items"]]

    def page(**query: str) -> set[str]:
        answer = web.client.get("/dead-letters", params=query)
        assert answer.status_code == 200, answer.text
        return {dead_id for dead_id in ids.values() if f"/dead-letters/{dead_id}" in answer.text}

    cases: list[tuple[dict[str, str], set[str]]] = [
        ({"operation_id": op_of_bob}, {ids["bob-forget"]}),
        ({"record_id": "mem_b"}, {ids["ada-revise"], ids["bob-forget"]}),
        ({"user_id": "ada"}, {ids["ada-forget"], ids["ada-revise"]}),
        ({"user_id": "ada", "record_id": "mem_b"}, {ids["ada-revise"]}),
        ({"agent_id": "bot", "kind": "forget"}, {ids["ada-forget"], ids["bob-forget"]}),
        ({"user_id": "carol"}, set()),
    ]
    for query, expected in cases:
        assert set(api(**query)) == expected, query
        assert page(**query) == expected, query
    form = web.client.get("/dead-letters", params={"record_id": "mem_b"}).text
    assert 'name="record_id" maxlength="200" value="mem_b"' in form  # shown back
    # The bulk action takes the same search: its dry run counts what the list shows.
    dry = web.client.post(
        "/api/v1/bulk/dead-letters", json={"action": "discard", "filter": {"user_id": "ada"}}
    ).json()
    assert dry["count"] == 2 and dry["filter"]["user_id"] == "ada"
    bulk_page = web.client.get("/dead-letters/bulk?action=discard&record_id=mem_b").text
    assert 'name="record_id" value="mem_b"' in bulk_page  # carried to the confirm form
    assert web.client.get("/api/v1/dead-letters", params={"user_id": " "}).status_code == 400


def test_a_match_reads_the_search_and_refuses_bad_values() -> None:
    match = match_from({"operation_id": "op:1", "record_id": "mem_a", "user_id": "ada"})
    assert match == Match(operation_id="op:1", record_id="mem_a", scope=(("user_id", "ada"),))
    assert match.as_dict()["record_id"] == "mem_a" and "chat_id" not in match.as_dict()
    assert "operation_id" not in Match().as_dict()  # absent searches: any, left out
    for bad in ({"record_id": 5}, {"user_id": "x" * 201}, {"since": "soon"}):
        with pytest.raises(InvalidRequestError, match=r"record_id is text|longer than|ISO 8601"):
            match_from(bad)


@pytest.fixture
def cli_env(dsn: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("COLUMNS", "300")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["dead-letters", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.usefixtures("cli_env")
def test_the_cli_list_searches_like_the_dashboard(
    planted: dict[str, tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    ids = {name: dead_id for name, (dead_id, _) in planted.items()}

    def listed(*argv: str) -> list[str]:
        code, out, err = cli(capsys, "list", "--json", *argv)
        assert code == 0, err
        return [x["id"] for x in json.loads(out)["dead_letters"]]

    assert listed("--operation", planted["ada-forget"][1]) == [ids["ada-forget"]]
    assert listed("--record", "mem_b") == [ids["bob-forget"], ids["ada-revise"]]
    assert listed("--scope", '{"user_id": "ada"}') == [ids["ada-revise"], ids["ada-forget"]]
    assert listed("--code", "conflict", "--kind", "revise") == [ids["ada-revise"]]
    code, out, _ = cli(capsys, "list", "--record", "mem_b")
    assert code == 0 and "2 of 3 match the filter" in out
    code, _, err = cli(capsys, "list", "--scope", '{"colour": "red"}')
    assert code == 2 and "--scope is a JSON object of user_id" in err


@pytest.mark.usefixtures("cli_env")
def test_the_cli_bulk_action_takes_code_kind_and_time(
    web: Web, planted: dict[str, tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    ids = {name: dead_id for name, (dead_id, _) in planted.items()}

    def dry(*argv: str) -> dict[str, Any]:
        code, out, err = cli(capsys, "discard", "--all", *argv)
        assert code == 0, err
        return json.loads(out)  # type: ignore[no-any-return]

    def taken(*argv: str) -> list[str]:
        return [x["id"] for x in dry(*argv)["dead_letters"]]

    assert taken("--code", "conflict") == [ids["bob-forget"], ids["ada-revise"]]
    assert taken("--kind", "forget") == [ids["bob-forget"], ids["ada-forget"]]
    # at_ms 1000, 2000, 3000: since is at or after, until before (UTC).
    assert taken("--since", "1970-01-01T00:00:02") == [ids["bob-forget"], ids["ada-revise"]]
    assert taken("--until", "1970-01-01T00:00:02Z") == [ids["ada-forget"]]
    seen = dry("--code", "conflict", "--kind", "forget")
    assert seen["count"] == 1 and seen["filter"]["code"] == "conflict"
    code, _, err = cli(
        capsys, "discard", "--all", "--code", "conflict", "--kind", "forget",
        "--confirm", seen["confirm"], "--reason", "bob's is a duplicate",
    )  # fmt: skip
    assert code == 0, err
    left = {i.decode() for i, _ in web.redis.xrange(keys.DEAD_LETTERS)}  # type: ignore[union-attr]
    assert left == {ids["ada-forget"], ids["ada-revise"]}
    code, _, err = cli(capsys, "discard", "--all", "--since", "yesterday")
    assert code == 2 and "since must be an ISO 8601 time" in err
    # One letter named with a filter is refused, nothing changed.
    code, _, err = cli(capsys, "discard", ids["ada-forget"], "--code", "conflict")
    assert code == 2 and "name one dead letter, or pass --all" in err
    assert len(left) == web.redis.xlen(keys.DEAD_LETTERS)


@pytest.mark.usefixtures("cli_env")
def test_show_says_the_reason_once_and_an_unreadable_letter_in_words(
    web: Web, planted: dict[str, tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "show", planted["ada-forget"][0])
    assert code == 0
    lines = [line.split(None, 1) for line in out.splitlines() if line.strip()]
    assert ["reason", "malformed"] in lines
    assert not [line for line in lines if line[0] == "malformed"]  # no "malformed False"
    assert "unreadable" not in out
    garbage = web.redis.xadd(keys.DEAD_LETTERS, {"junk": "1"}).decode()  # type: ignore[union-attr]
    code, out, _ = cli(capsys, "show", garbage)
    assert code == 0 and "unreadable: its own fields are missing or garbage" in out
    code, out, _ = cli(capsys, "show", garbage, "--json")
    assert json.loads(out)["malformed"] is True  # the API's and the JSON's shape, unchanged
