"""A dead letter whose own fields are missing or garbage (anything read from Redis is
untrusted) is listed as malformed, never a 500: the page, the API list and the letter."""

from __future__ import annotations

import pytest

from tests.web_fixtures import Web
from worker import keys

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
