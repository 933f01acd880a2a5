"""Reading from the command line: get, history, recall, receipts, scopes, dead letters;
a table by default, JSON with --json, exit 1 (and nothing on stdout) for what is not there."""

from __future__ import annotations

import json

import pytest
import redis

from engram.cli import main
from engram.store import HashingEmbedder, Store
from engram.store.errors import InvalidRequestError
from engram.store.limits import DEFAULT_MIN_RELEVANCE
from engram.worker import DeadLetteredError, keys
from engram.worker.admin import deadletters
from engram.worker.protocol import partition_of
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, dsn: str, redis_url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("COLUMNS", "200")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def ada(store: Store, scope: dict[str, str]) -> str:
    mem = store.session(scope, embedder=HashingEmbedder(64))
    first = mem.remember("Ada lives in London.", kind="semantic", metadata={"from": "form"})
    record_id = first.records[0].id
    mem.revise(record_id, text="Ada lives in Paris.", expected_revision=1)
    mem.remember("Ada likes tea.", links=[{"relation": "about", "id": record_id}])
    return record_id


pytestmark = pytest.mark.usefixtures("env")


def test_get_prints_the_current_revision(
    ada: str, scope: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "get", ada, "--scope", json.dumps(scope))
    assert code == 0
    assert f"id             {ada}" in out
    assert "revision       2" in out and "text           Ada lives in Paris." in out
    code, out, _ = run(capsys, "get", ada, "--scope", json.dumps(scope), "--json")
    record = json.loads(out)
    assert (record["id"], record["revision"], record["text"]) == (ada, 2, "Ada lives in Paris.")
    assert record["metadata"] == {"from": "form"} and record["origin"] == "asserted"
    assert record["sources"][0]["kind"] == "host"


def test_what_is_not_there_exits_1_with_nothing_on_stdout(
    ada: str, scope: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("get", "history"):
        code, out, err = run(capsys, command, "mem_nothing", "--scope", json.dumps(scope))
        assert (code, out) == (1, "")
        assert "not_found" in err
    # Another scope's record is not there either, and nothing about it is said.
    code, out, err = run(capsys, "get", ada, "--scope", '{"user_id": "somebody else"}')
    assert (code, out) == (1, "") and "London" not in err and "Paris" not in err


def test_history_lists_every_revision(
    ada: str, scope: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "history", ada, "--scope", json.dumps(scope))
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == [
        "rev",
        "status",
        "recorded",
        "at",
        "kind",
        "links",
        "text",
    ]
    assert "Ada lives in London." in lines[1] and "Ada lives in Paris." in lines[2]
    code, out, _ = run(capsys, "history", ada, "--scope", json.dumps(scope), "--json")
    assert [r["revision"] for r in json.loads(out)] == [1, 2]


def test_recall_finds_by_meaning_and_words(
    ada: str, scope: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["recall", "Where does Ada live? Paris", "--scope", json.dumps(scope)]
    code, out, _ = run(capsys, *argv, "--embedder", "hashing:64", "--json")
    hits = json.loads(out)
    assert code == 0 and hits[0]["record"]["id"] == ada and hits[0]["match"] == "hybrid"
    code, out, _ = run(capsys, *argv, "--embedder", "hashing:64", "--top-k", "1")
    assert len(out.splitlines()) == 2 and "Ada lives in Paris." in out
    code, out, err = run(capsys, *argv, "--embedder", "hashing:32")
    assert code == 1 and out == "" and "embedding_mismatch" in err


def test_recall_leaves_out_the_hits_under_its_cut_off(
    ada: str, scope: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["recall", "Where does Ada live? Paris", "--scope", json.dumps(scope)]
    argv += ["--embedder", "hashing:64", "--json"]
    every = json.loads(run(capsys, *argv, "--min-relevance", "0")[1])
    default = json.loads(run(capsys, *argv)[1])
    assert default == [h for h in every if min(h["score"], 1) >= DEFAULT_MIN_RELEVANCE]
    best = json.loads(run(capsys, *argv, "--min-relevance", "1")[1])
    assert [h["record"]["id"] for h in best] == [ada]  # holds every word of the query
    assert len(every) > len(best)
    code, out, err = run(capsys, *argv, "--min-relevance", "1.5")
    assert code != 0 and out == "" and "min_relevance must be a number from 0 to 1" in err


def test_receipts_and_scopes(
    ada: str, scope: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "receipts", "--scope", json.dumps(scope), "--json")
    receipts = json.loads(out)
    assert code == 0 and [r["kind"] for r in receipts] == ["remember", "revise", "remember"]
    assert [r["scope_revision"] for r in receipts] == [3, 2, 1]
    code, out, _ = run(capsys, "receipts", "--record", ada, "--kind", "revise")
    assert code == 0 and len(out.splitlines()) == 2 and f"{ada}@2:active" in out
    code, out, _ = run(capsys, "scopes", "--json")
    mine = [s for s in json.loads(out) if s["scope"] == scope]
    assert mine == [{"scope": scope, "revision": 3, "records": 2}]
    code, out, _ = run(capsys, "scopes")
    assert out.splitlines()[0].split() == ["revision", "records", "scope"]
    assert json.dumps(scope, separators=(",", ":")) in out


def _dead_letter(client: redis.Redis, op: str | None, partition: int) -> str:
    pipe = client.pipeline()
    deadletters.add(
        pipe,
        partition=partition,
        entry_id="1-1",
        operation_id="op:dead",
        raw=op,
        reason=deadletters.MALFORMED,
        error=InvalidRequestError("bad"),
        deliveries=1,
    )
    return str(pipe.execute()[0].decode())


@pytest.mark.usefixtures("store")  # retry and discard write audit rows: a migrated store
def test_dead_letters_list_show_retry_discard(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    scope = {"user_id": "dead"}
    partition = partition_of(scope, FAST.partitions)
    op = json.dumps({"operation_id": "op:dead", "kind": "forget", "scope": scope, "request": {}})
    first = _dead_letter(redis_client, op, partition)
    second = _dead_letter(redis_client, None, partition)
    code, out, _ = run(capsys, "dead-letters", "list")
    lines = out.splitlines()
    assert code == 0 and lines[1].startswith(second) and lines[2].startswith(first)
    code, out, _ = run(capsys, "dead-letters", "list", "--limit", "1", "--json")
    listed = json.loads(out)
    assert listed["total"] == 2 and [x["id"] for x in listed["dead_letters"]] == [second]
    code, out, _ = run(capsys, "dead-letters", "show", first, "--json")
    assert json.loads(out)["op"] == op and json.loads(out)["error"]["code"] == "invalid_request"

    code, out, _ = run(capsys, "dead-letters", "retry", first)
    entry = json.loads(out)["entry"]
    assert code == 0 and json.loads(out)["partition"] == partition
    found = redis_client.xrange(keys.stream(partition), min=entry, max=entry)
    assert found[0][1][b"op"].decode() == op
    code, out, err = run(capsys, "dead-letters", "retry", second)  # holds no operation
    assert code == 2 and "holds no operation" in err
    code, out, _ = run(capsys, "dead-letters", "discard", second)
    assert code == 0 and deadletters.count(redis_client) == 0
    for action in ("show", "retry", "discard"):
        code, out, err = run(capsys, "dead-letters", action, first)
        assert (code, out) == (1, "") and "not_found" in err
    code, out, err = run(capsys, "dead-letters", "show", "not-an-id")
    assert code == 2 and "invalid_request" in err


def test_recall_follows_the_active_generation_not_engram_embedder(
    ada: str,
    scope: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a re-embedding the store's active model is not ENGRAM_EMBEDDER's: recall
    without --embedder queries with the active generation's model, as the API does
    (issue 29, item 4: it said embedding_mismatch until --embedder was passed)."""
    monkeypatch.setenv("ENGRAM_EMBEDDER", "hashing:32")  # the store's generation: 64 dims
    argv = ["recall", "Where does Ada live? Paris", "--scope", json.dumps(scope), "--json"]
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "")
    hits = json.loads(out)
    assert hits[0]["record"]["id"] == ada and hits[0]["match"] == "hybrid"
    # Named on the command line, a model that is not the active one is still refused.
    code, out, err = run(capsys, *argv, "--embedder", "hashing:32")
    assert code == 1 and out == "" and "embedding_mismatch" in err


@pytest.mark.usefixtures("store")  # show reads the earlier attempts from the audit
def test_dead_letters_list_and_show_say_why(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29, item 3: the code column tells the causes apart, and ``show`` gives the
    root cause, not ``dead_lettered`` for every failed letter."""
    redis_client.delete(keys.DEAD_LETTERS)
    pipe = redis_client.pipeline()
    deadletters.add(
        pipe,
        partition=0,
        entry_id="1-1",
        operation_id="op:nox",
        raw="{}",
        reason=deadletters.FAILED,
        error=DeadLetteredError(
            "operation op:nox could not be applied: EmbedderUnavailableError: "
            "onnxruntime is missing",
            cause="embedder_unavailable",
            detail="EmbedderUnavailableError: onnxruntime is missing",
        ),
        deliveries=1,
    )
    [dead_id] = [x.decode() for x in pipe.execute()]
    code, out, _ = run(capsys, "dead-letters", "list")
    header, row = out.splitlines()[:2]
    assert code == 0 and header.split()[-2:] == ["code", "operation"]
    assert row.split()[-2:] == ["embedder_unavailable", "op:nox"]
    code, out, _ = run(capsys, "dead-letters", "show", dead_id)
    assert "\ncode          embedder_unavailable\n" in out
    assert "\ndetail        EmbedderUnavailableError: onnxruntime is missing\n" in out
    code, out, _ = run(capsys, "dead-letters", "show", dead_id, "--json")
    shown = json.loads(out)
    assert (shown["code"], shown["error"]["code"]) == ("embedder_unavailable", "dead_lettered")
